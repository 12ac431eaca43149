"""Opt-in prompt capture for continuous adaptation: best effort, bounded, and never on the request path.

Records follow the training prompt schema (id, lang, domain, prompt, source, license), one JSON line
each, so ``$POLYSPEC_HOME/capture/fr.jsonl`` and its rotated files (``fr-20250102T030405.678901Z.jsonl``)
feed ``polyspec train --prompts`` as they are.

The request path only calls :meth:`PromptCapture.submit`, a ``put_nowait`` on a bounded queue. One writer
task hands batches to a worker thread under a timeout. A full, failing or hung disk drops captures (counted
by reason in ``polyspec_capture_dropped_total``, logged at most once a minute per reason) and never touches
requests: while a write hangs, the queue fills and later prompts are dropped as ``queue_full``.

Several routers may share the directory: every append, rotation and sweep holds an exclusive ``flock`` on
``<dir>/.capture.lock``. Shared files (not one per router) keep the names training knows; the lock makes
them safe: no rotation renames a file under another router's write, and a failed write is cut back to its
last whole line (a torn line makes a file unreadable to ``core.prompts``) without cutting another router's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polyspec.router.config import RouterConfig
    from polyspec.router.telemetry import Metrics

log = logging.getLogger("polyspec.router.capture")

_SAFE_LANG = re.compile(r"[a-z]{2,3}(-[a-z0-9]{1,8})?")  # a language names a file: plain codes only
_ROTATED = re.compile(r"[a-z]{2,3}(-[a-z0-9]{1,8})?-\d{8}T\d{6}\.\d{6}Z\.jsonl")
LOCK_NAME = ".capture.lock"
BATCH = 64  # records per worker-thread call: one lock and one open per language per batch
LOG_EVERY_S = 60.0
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _append(fd: int, data: bytes) -> None:
    """Write all of ``data`` (the one low-level write; tests replace it to inject a failing or hung disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _reason(exc: BaseException) -> str:
    return "disk_full" if isinstance(exc, OSError) and exc.errno in _DISK_FULL else "io_error"


@dataclass
class _Batch:
    """Records for one worker thread; ``done``/``abandoned`` (under ``lock``) make each record counted once:
    by the thread, or by the writer task that gave up waiting for it."""

    records: list[tuple[str, str, str]] = field(default_factory=list)
    done: int = 0
    abandoned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class PromptCapture:
    def __init__(self, directory: Path, router_id: str, *, queue_size: int = 1000, max_prompt_chars: int = 32_000,
                 file_bytes: int = 64 * 1024**2, total_bytes: int = 1024**3, retention_days: float = 30.0,
                 write_timeout_s: float = 5.0, metrics: Metrics | None = None) -> None:
        self.directory, self.router_id, self.metrics = directory, router_id, metrics
        self.queue_size, self.max_prompt_chars = queue_size, max_prompt_chars
        self.file_bytes, self.total_bytes = file_bytes, total_bytes
        self.retention_s, self.write_timeout_s = retention_days * 86400, write_timeout_s
        self._queue: asyncio.Queue[tuple[str, str, str]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._lock = threading.Lock()  # the counters and the log throttle, shared with the worker thread
        self._counts: Counter[str] = Counter()  # "written", "rotated", "deleted"
        self._dropped: Counter[str] = Counter()
        self._inflight: asyncio.Future[None] | None = None
        self._write_started: float | None = None
        self._last_log: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    @classmethod
    def from_config(cls, config: RouterConfig, metrics: Metrics | None = None) -> PromptCapture:
        return cls(config.resolved_capture_dir(), config.router_id, queue_size=config.capture_queue,
                   max_prompt_chars=config.capture_max_prompt_chars, file_bytes=config.capture_file_bytes,
                   total_bytes=config.capture_total_bytes, retention_days=config.capture_retention_days,
                   write_timeout_s=config.capture_write_timeout_s, metrics=metrics)

    # --- the request path ----------------------------------------------------------------------
    def submit(self, language: str, domain: str, text: str) -> None:
        """Queue one prompt for the writer, or drop and count it. Never blocks, never raises."""
        try:
            if not self._accepting or self._queue is None:
                self._count("not_started")
            elif not isinstance(text, str) or not text or text.isspace():  # isspace stops at the first letter
                self._count("empty")
            elif len(text) > self.max_prompt_chars:
                self._count("too_long")
            elif not isinstance(language, str) or not _SAFE_LANG.fullmatch(language):
                self._count("unsafe_language")
            else:
                self._queue.put_nowait((language, str(domain)[:64], text))
        except asyncio.QueueFull:
            self._count("queue_full")
            self._warn("queue_full", "prompt capture: queue full (%d), dropping prompts", self.queue_size)
        except Exception:  # capture must never fail a request
            self._count("error")
            self._warn("error", "prompt capture failed to queue a prompt", exc_info=True)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the writer task (from the running event loop; no I/O here: the writer sweeps first)."""
        if self._task is None:
            self._queue = asyncio.Queue(self.queue_size)
            self._accepting = True
            self._task = asyncio.get_running_loop().create_task(self._writer(), name="polyspec-capture-writer")

    async def stop(self) -> None:
        """Write what is queued for up to ``write_timeout_s``, then drop and count the rest ("shutdown")."""
        if self._task is None or self._queue is None:
            return
        self._accepting = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), self.write_timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        while not self._queue.empty():
            self._queue.get_nowait()
            self._count("shutdown")

    def stats(self) -> dict[str, Any]:
        """For the dashboard and the snapshot."""
        started = self._write_started
        with self._lock:
            return {"directory": str(self.directory), "written": self._counts["written"],
                    "dropped": dict(self._dropped), "queue": self._queue.qsize() if self._queue else 0,
                    "queue_max": self.queue_size, "files_rotated": self._counts["rotated"],
                    "files_deleted": self._counts["deleted"],
                    "writer_blocked": started is not None and time.monotonic() - started > self.write_timeout_s}

    # --- the writer task -----------------------------------------------------------------------
    async def _writer(self) -> None:
        assert self._queue is not None
        await self._run(self._sweep_locked, _Batch())  # retention at start
        while True:
            batch = _Batch([await self._queue.get()])
            while len(batch.records) < BATCH and not self._queue.empty():
                batch.records.append(self._queue.get_nowait())
            try:
                await self._run(functools.partial(self._write_batch, batch), batch)
            except asyncio.CancelledError:
                self._abandon(batch, "shutdown")
                raise
            finally:
                for _ in batch.records:
                    self._queue.task_done()

    async def _run(self, fn: Callable[[], object], batch: _Batch) -> None:
        try:
            await self._in_thread(fn)
        except TimeoutError:
            self._abandon(batch, "write_timeout")
            self._warn("write_timeout", "prompt capture: a write to %s took over %.1f s (hung disk?); dropping "
                       "prompts until it returns", self.directory, self.write_timeout_s)
            if self._inflight is not None:  # no second thread while this one is stuck (stop() cancels this)
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._inflight)
            self._write_started = None
            self._warn("write_returned", "prompt capture: the blocked write to %s returned", self.directory)
        except Exception as exc:  # a bug or a failed sweep must not stop capture for good
            self._abandon(batch, "error")
            self._warn("error", "prompt capture writer failed in %s: %r", self.directory, exc)

    async def _in_thread(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in a new daemon thread, waiting at most ``write_timeout_s``.

        Not asyncio.to_thread: a thread stuck in a hung write cannot be killed, and the default executor's
        threads are joined at loop and interpreter exit, so one hung write would hang the router's shutdown.
        """
        loop = asyncio.get_running_loop()
        done = self._inflight = loop.create_future()

        def settle(exc: BaseException | None) -> None:
            if not done.done():
                done.set_exception(exc) if exc is not None else done.set_result(None)

        def run() -> None:
            error: BaseException | None = None
            try:
                fn()
            except BaseException as exc:  # handed to the writer task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop may be closed by then
                loop.call_soon_threadsafe(settle, error)

        self._write_started = time.monotonic()
        threading.Thread(target=run, name="polyspec-capture-write", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), self.write_timeout_s)
            self._write_started = None
        except TimeoutError:
            done.add_done_callback(lambda f: f.cancelled() or f.exception())  # a late error is not "unretrieved"
            raise

    # --- counting and logging (both threads) ---------------------------------------------------
    def _count(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` prompts written (outcome "written") or dropped for the reason ``outcome``."""
        if n <= 0:
            return
        with self._lock:
            (self._counts if outcome == "written" else self._dropped)[outcome] += n
        if self.metrics is not None:
            m = self.metrics
            m.captured.inc(n) if outcome == "written" else m.capture_dropped.labels(outcome).inc(n)

    def _abandon(self, batch: _Batch, reason: str) -> None:
        with batch.lock:
            left = 0 if batch.abandoned else len(batch.records) - batch.done
            batch.abandoned = True
        self._count(reason, left)

    def _warn(self, reason: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log ``msg`` at most once per LOG_EVERY_S per reason: a full disk must not flood the log."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_log.get(reason, -LOG_EVERY_S) < LOG_EVERY_S:
                self._unlogged[reason] += 1
                return
            self._last_log[reason], skipped = now, self._unlogged.pop(reason, 0)
        log.warning(msg + (f" ({skipped} more since the last message)" if skipped else ""), *args, exc_info=exc_info)

    # --- worker thread: files ------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self._open(self.directory / LOCK_NAME, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _write_batch(self, batch: _Batch) -> None:
        fds: dict[str, int] = {}
        try:
            with self._locked():
                for language, domain, text in batch.records:
                    outcome = self._write_record(fds, language, domain, text)
                    with batch.lock:
                        if batch.abandoned:  # the writer task gave up on this batch and counted the rest
                            return
                        batch.done += 1
                    self._count(outcome)
        except OSError as exc:  # no lock file (a read-only or unusable directory): the rest of the batch
            self._abandon(batch, _reason(exc))
            self._warn(_reason(exc), "prompt capture: cannot write to %s: %s", self.directory, exc)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _write_record(self, fds: dict[str, int], language: str, domain: str, text: str) -> str:
        """Append one record (the lock is held); "written", or the reason it was dropped."""
        record = {"id": f"capture-{language}-{uuid.uuid4().hex[:16]}", "lang": language, "domain": domain,
                  "prompt": text, "source": f"polyspec-router:{self.router_id}", "license": "user-provided"}
        try:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape: not text training can read
            return "invalid_text"
        if len(line) > self.file_bytes:
            return "too_long"
        path = self.directory / f"{language}.jsonl"
        try:
            if language not in fds:
                fds[language] = self._open(path, os.O_WRONLY | os.O_APPEND)
            size = os.fstat(fds[language]).st_size
            if size and size + len(line) > self.file_bytes:
                os.close(fds.pop(language))
                self._rotate(path, language)
                fds[language], size = self._open(path, os.O_WRONLY | os.O_APPEND), 0
                self._sweep_quietly()  # after the new active file exists: the sweep counts it as full
            try:
                _append(fds[language], line)
            except OSError:  # cut a partial line off (a short write on a full disk): the file stays whole JSONL
                with contextlib.suppress(OSError):
                    os.ftruncate(fds[language], size)
                raise
        except OSError as exc:
            self._warn(_reason(exc), "prompt capture: cannot write to %s: %s; dropping prompts", path, exc)
            return _reason(exc)
        return "written"

    def _open(self, path: Path, flags: int) -> int:
        """Open (creating) ``path``; re-create the directory if it was deleted under a running router."""
        flags |= os.O_CREAT | os.O_CLOEXEC
        try:
            return os.open(path, flags, 0o640)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(path, flags, 0o640)

    def _rotate(self, path: Path, language: str) -> None:
        when = datetime.now(timezone.utc)
        while (target := self.directory / f"{language}-{when:%Y%m%dT%H%M%S.%fZ}.jsonl").exists():
            when += timedelta(microseconds=1)  # a name taken in the same microsecond: names still sort by age
        os.rename(path, target)
        with self._lock:
            self._counts["rotated"] += 1

    def _sweep_locked(self) -> None:
        with self._locked():
            self._sweep()

    def _sweep_quietly(self) -> None:
        try:
            self._sweep()
        except OSError as exc:  # retried at the next rotation; the record is written all the same
            self._warn("sweep", "prompt capture: retention sweep in %s failed: %s", self.directory, exc)

    def _sweep(self) -> None:
        """Retention (the lock is held): delete rotated files older than the retention period, then the
        oldest rotated ones while the directory could hold more than ``total_bytes``. An active file counts
        as full (``file_bytes``): it grows until its next rotation, and the cap must hold until then too."""
        now, total, rotated = time.time(), 0, []
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(".jsonl") or not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            if not _ROTATED.fullmatch(entry.name):
                total += max(st.st_size, self.file_bytes)
            elif now - st.st_mtime > self.retention_s:
                self._delete(entry.path)
            else:
                total += st.st_size
                rotated.append((st.st_mtime, entry.name, st.st_size, entry.path))
        for _, _, size, path in sorted(rotated):
            if total <= self.total_bytes:
                break
            self._delete(path)
            total -= size

    def _delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # an operator got there first
            os.unlink(path)
            with self._lock:
                self._counts["deleted"] += 1
