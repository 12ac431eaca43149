"""The skips that are legitimate, each with the reason it is. Any other skip fails the run (the hooks in
tests/conftest.py): a test that quietly stops running hides a regression as well as a failing one would,
and `make test` must mean the whole suite ran.

A skip is allowed when its reason is a key below, or starts with the key followed by ": " (the rest says
what was left out). To allow a new kind of skip, add it here with the reason it cannot be a failure."""

from __future__ import annotations

ALLOWED_SKIPS: dict[str, str] = {
    "POLYSPEC_SKIP_INTEGRATION=1": (
        "`make test-fast`: the developer asked to leave out the vLLM engines, the browser and servers that are "
        "not installed; `make test` and CI never set it, so there this reason never occurs"
    ),
}


def skip_reason(longrepr: object) -> str:
    """The reason of a skipped report: pytest stores (path, line, 'Skipped: <reason>')."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        message = str(longrepr[2])
    else:
        message = str(longrepr)
    return message.removeprefix("Skipped: ").strip()


def is_allowed(reason: str) -> bool:
    return any(reason == key or reason.startswith(f"{key}: ") for key in ALLOWED_SKIPS)
