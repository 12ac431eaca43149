"""One root exception for everything polyspec refuses or cannot do, each class with its exit code.

The CLI turns any :class:`PolyspecError` into one line on stderr and ``exit_code`` (see
``polyspec.cli.run``); nothing else decides exit codes. Each package subclasses these roots
(``RegistryError``, ``TrainingError``, ...), so a caller can catch one package's errors or all of them.
"""

from __future__ import annotations


class PolyspecError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; ``hint`` is an optional second line."""

    exit_code: int = 1

    def __init__(self, message: str = "", *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__

    def details(self) -> dict[str, object]:
        """Extra machine-readable fields for ``--json`` error output (suggestions, failures, ...)."""
        return {}


class InvalidInput(PolyspecError, ValueError):
    """Input the user can fix: a malformed file, an unknown code, a bad option value."""

    exit_code = 2


class NotFoundError(PolyspecError, LookupError):
    """A named thing (file, draft, run, verifier) that does not exist."""

    exit_code = 3


class ConflictError(PolyspecError):
    """The request contradicts existing state (a name already taken, a run with other settings)."""

    exit_code = 4


class Unavailable(PolyspecError):
    """A dependency, extra, engine or service that is missing or not ready on this machine."""

    exit_code = 5


class IntegrityError(PolyspecError):
    """Data that fails a check: a checksum, a self-check, a corrupted stage."""

    exit_code = 6
