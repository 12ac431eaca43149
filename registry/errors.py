"""Errors raised by the registry. Every one carries a one-line, user-facing message."""

from __future__ import annotations

from polyspec.core.errors import ConflictError, InvalidInput, NotFoundError, PolyspecError
from polyspec.core.languages import UnknownLanguage
from polyspec.core.prompts import PromptsError

__all__ = ["AlreadyExists", "ImportFailed", "InvalidDraft", "InvalidEvaluation", "InvalidProfile", "NotFound", "PromotionRefused",
           "PromptsError", "RegistryError", "RegistryMissing", "UnknownLanguage"]


class RegistryError(PolyspecError):
    """Base class: anything the registry refuses or cannot do."""


class NotFound(RegistryError, NotFoundError):
    """A verifier, draft, deployment or language profile that does not exist."""


class RegistryMissing(RegistryError, NotFoundError):
    """A registry opened with ``create=False`` (the router, the dashboard) that does not exist: it is never
    created empty behind an operator's back. `polyspec registry init` or `polyspec up` creates one."""


class AlreadyExists(RegistryError, ConflictError):
    """A unique name (verifier, active deployment) that is already taken."""


class InvalidDraft(RegistryError, InvalidInput):
    """A draft directory that is not a usable speculators Eagle3 checkpoint for its verifier."""


class InvalidEvaluation(RegistryError, InvalidInput):
    """An evaluation whose figures do not add up (acceptance length, k, method)."""


class InvalidProfile(RegistryError, InvalidInput):
    """An add-language option out of range (e.g. a coverage threshold outside [0, 1])."""


class PromotionRefused(RegistryError):
    """The promotion gate said no. ``failures`` lists the reasons, one per language."""

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []

    def details(self) -> dict[str, object]:
        return {"failures": self.failures}


class ImportFailed(RegistryError, InvalidInput):
    """A JSON export that cannot be imported (wrong format, conflicting rows)."""
