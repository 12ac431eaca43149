"""No half-written run: a run the command created is removed when its input is refused.

training.cli wraps the pipeline (and the torchrun launch) in :func:`discard_on_input_error`; a torchrun worker
wraps its pipeline in :func:`note_input_error`, so that the launcher, which only sees torchrun's exit status,
learns that the input was refused and why.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from polyspec.core.atomic import atomic_write_json
from polyspec.core.errors import InvalidInput
from polyspec.training.distributed import WorkersFailed
from polyspec.training.errors import WorkerInputError
from polyspec.training.runs import Run, console


INPUT_ERROR = "input-error.json"  # a torchrun worker's refusal of the run's input, for the launcher


@contextmanager
def discard_on_input_error(run: Run, fresh: bool) -> Iterator[None]:
    """A run this command created is removed when its input is refused (an unknown language, no prompts, a
    coverage target out of reach, a parent for another verifier, ...): no half-written run stays behind.
    Under torchrun the refusal comes from a worker's INPUT_ERROR note."""
    try:
        yield
    except InvalidInput:
        if fresh:
            _discard(run)
        raise
    except WorkersFailed:
        note = run.root / INPUT_ERROR
        if not note.is_file():
            raise
        message = json.loads(note.read_text(encoding="utf-8"))["message"]
        if fresh:
            _discard(run)
        raise WorkerInputError(message) from None


@contextmanager
def note_input_error(run: Run, lead: bool) -> Iterator[None]:
    """In a torchrun worker: rank 0 leaves the refusal of the run's input where the launcher reads it."""
    try:
        yield
    except InvalidInput as exc:
        if lead:
            atomic_write_json(run.root / INPUT_ERROR, {"message": exc.message, "type": type(exc).__name__})
        raise


def _discard(run: Run) -> None:
    shutil.rmtree(run.root, ignore_errors=True)
    console.print(f"[yellow]run {run.run_id} removed: its input was refused, nothing of it is kept")
