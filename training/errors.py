"""Specific errors of the training pipeline. The CLI turns each into a one-line message and exit code 2."""

from __future__ import annotations


class TrainingError(Exception):
    """Base class: a training run cannot go on, for a reason the user can fix."""


class RunNotFound(TrainingError):
    """No run directory with that id under POLYSPEC_HOME/runs."""


class RunExists(TrainingError):
    """A new run was asked for under an id that is already taken."""


class RunConfigMismatch(TrainingError):
    """Resuming a run with knobs that differ from its run.json."""


class StageCorrupt(TrainingError):
    """A stage marked done no longer matches the checksums recorded in its marker."""


class StageMissing(TrainingError):
    """A stage needs the output of an earlier stage that has not run yet."""


class PromptsError(TrainingError):
    """The prompt files are unusable (missing, empty, malformed, wrong language...)."""


class EmptyPromptFile(PromptsError):
    """A prompt file holds no prompt at all."""


class NoPromptsForLanguage(PromptsError):
    """After filtering, no prompt of the requested language (or domain) is left."""


class ParentDraftError(TrainingError):
    """The parent draft is missing, unreadable or made for another verifier."""


class EngineError(TrainingError):
    """The vLLM engine given with --engine could not answer."""


class PlanError(TrainingError):
    """The registry holds no usable add-language plan for that language."""
