"""Language ID over many texts (`polyspec langid`, corpus labelling): in input order, in bounded chunks, on
one process or several.

Detection is CPU-bound Python (fastText, the word tables and lingua under the GIL), so more cores need more
processes. Workers are forked after the parent loaded the models (`core.langid.warm_up`), so they share
them copy-on-write instead of loading their own; what the parent had not loaded, each worker loads on its
first need. At most ``2 × workers`` chunks are in flight, so memory stays bounded whatever the input's length.
"""

from __future__ import annotations

import itertools
import multiprocessing
import sys
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor

from polyspec.core.langid import LangGuess, allowed_labels, iter_detect, warm_up

CHUNK = 256  # texts per task: large enough that a task's overhead (pickling, a pipe round trip) is noise


def _detect_chunk(texts: list[str], restrict: list[str] | None) -> list[tuple[str, float]]:
    return [(g.language, g.confidence) for g in iter_detect(texts, restrict)]


def detect_stream(texts: Iterable[str], restrict: Collection[str] | None = None, workers: int = 1,
                  chunk: int = CHUNK) -> Iterator[LangGuess]:
    """`core.langid.detect` of each text, yielded in input order as results come; ``workers`` > 1 runs the
    chunks on that many processes (forked where the platform allows it)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    labels = sorted(restrict) if restrict is not None else None
    if workers == 1:
        yield from iter_detect(texts, labels)
        return
    warm_up(allowed_labels(labels) if labels is not None else None)
    method = "fork" if sys.platform == "linux" else None  # elsewhere fork is unsafe or missing: the default
    context = multiprocessing.get_context(method)
    items = iter(texts)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[Future[list[tuple[str, float]]]] = deque()
        while batch := list(itertools.islice(items, chunk)):
            pending.append(pool.submit(_detect_chunk, batch, labels))
            if len(pending) >= 2 * workers:
                yield from (LangGuess(*pair) for pair in pending.popleft().result())
        while pending:
            yield from (LangGuess(*pair) for pair in pending.popleft().result())
