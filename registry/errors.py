"""Errors raised by the registry. Every one carries a one-line, user-facing message."""

from __future__ import annotations


class RegistryError(Exception):
    """Base class: anything the registry refuses or cannot do."""


class NotFound(RegistryError):
    """A verifier, draft, deployment or language profile that does not exist."""


class AlreadyExists(RegistryError):
    """A unique name (verifier, active deployment) that is already taken."""


class InvalidDraft(RegistryError):
    """A draft directory that is not a usable speculators Eagle3 checkpoint for its verifier."""


class InvalidEvaluation(RegistryError):
    """An evaluation whose figures do not add up (acceptance length, k, method)."""


class PromotionRefused(RegistryError):
    """The promotion gate said no. ``failures`` lists the reasons, one per language."""

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []


class UnknownLanguage(RegistryError):
    """A language code that is neither ISO 639-1 nor ISO 639-3. ``suggestions`` holds close codes."""

    def __init__(self, message: str, suggestions: list[str] | None = None) -> None:
        super().__init__(message)
        self.suggestions = suggestions or []


class PromptsError(RegistryError):
    """A prompts file that is missing, unreadable, malformed or empty."""


class ImportFailed(RegistryError):
    """A JSON export that cannot be imported (wrong format, conflicting rows)."""
