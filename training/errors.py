"""Specific errors of the training pipeline. The CLI turns each into one line and its exit code."""

from __future__ import annotations

from polyspec.core.errors import ConflictError, IntegrityError, InvalidInput, NotFoundError, PolyspecError, Unavailable
from polyspec.core.prompts import PromptsError


class TrainingError(PolyspecError):
    """Base class: a training run cannot go on, for a reason the user can fix."""

    exit_code = 2


class RunNotFound(TrainingError, NotFoundError):
    """No run directory with that id under POLYSPEC_HOME/runs."""


class RunExists(TrainingError, ConflictError):
    """A new run was asked for under an id that is already taken."""


class RunConfigMismatch(TrainingError, ConflictError):
    """Resuming a run with knobs that differ from its run.json."""


class StageCorrupt(TrainingError, IntegrityError):
    """A stage marked done no longer matches the checksums recorded in its marker."""


class StageMissing(TrainingError, InvalidInput):
    """A stage needs the output of an earlier stage that has not run yet."""


class EmptyPromptFile(PromptsError, TrainingError):
    """A prompt file holds no prompt at all."""


class NoPromptsForLanguage(PromptsError, TrainingError):
    """After filtering, no prompt of the requested language (or domain) is left."""


class ParentDraftError(TrainingError, InvalidInput):
    """The parent draft is missing, unreadable or made for another verifier."""


class EngineError(TrainingError, Unavailable):
    """The vLLM engine given with --engine could not answer."""


class PlanError(TrainingError, InvalidInput):
    """The registry holds no usable add-language plan for that language."""


class WorkerInputError(TrainingError, InvalidInput):
    """A torchrun worker refused the run's input; the message is the worker's."""


class DraftTooLarge(TrainingError, InvalidInput):
    """The run would make a draft whose weights file exceeds the size limit (POLYSPEC_MAX_DRAFT_BYTES)."""
