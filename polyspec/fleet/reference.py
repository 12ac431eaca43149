"""The engine self-check's reference, for the fleet: read from the cache, or computed by a child process.

``python -m polyspec.models.selfcheck`` runs in its own process (while the engines load) because computing the
reference needs transformers and torch, which the router must never import.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from polyspec.core.errors import InvalidInput, Unavailable
from polyspec.core.selfcheck import Reference, load_reference, reference_key, reference_path
from polyspec.core.settings import get_settings

log = logging.getLogger("polyspec.fleet")


class ReferenceUnavailable(Unavailable):
    """The reference could not be computed or read."""


def _cached(path: Path) -> Reference | None:
    try:
        return load_reference(path)
    except InvalidInput as exc:  # a damaged cache file is recomputed, not fatal
        log.warning("%s", exc)
        return None


class ReferenceJob:
    """The self-check reference of one verifier: read from the cache, or computed by a child process
    (``python -m polyspec.models.selfcheck``; torch stays out of this process)."""

    def __init__(self, verifier: str, log_path: Path) -> None:
        self.verifier = verifier
        self.log_path = log_path
        self.home = get_settings().home
        self.path = reference_path(self.home, reference_key(verifier))
        self.process: subprocess.Popen[bytes] | None = None
        if _cached(self.path) is None:
            log.info("computing the self-check reference of %s (log: %s)", verifier, log_path)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as out:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "polyspec.models.selfcheck", "--verifier", verifier, "--home", str(self.home)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def result(self, timeout: float) -> Reference:
        if self.process is not None:
            try:
                code = self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise ReferenceUnavailable(f"the self-check reference of {self.verifier} took over {timeout:.0f}s "
                                 f"(log: {self.log_path})") from None
            if code != 0:
                raise ReferenceUnavailable(f"could not compute the self-check reference of {self.verifier} (exit {code}; "
                                 f"log: {self.log_path})")
        reference = _cached(self.path)
        if reference is None:
            raise ReferenceUnavailable(f"the self-check reference of {self.verifier} is missing at {self.path}")
        return reference

    def cancel(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
