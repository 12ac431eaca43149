"""Prompt capture under a full, failing or hung disk.

Capture is best effort and off the request path: a request that was captured (the router captures in
``prepare``, before the upstream call, so the error500 engine's 502 answers were captured too) answers the
same whatever the disk does, and every prompt that is not written is counted by reason in
``polyspec_capture_dropped_total``. Faults of the writer itself are shown on ``PromptCapture`` directly.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from polyspec.core.prompts import read_prompt_records
from polyspec.router import capture as capture_mod
from polyspec.router.capture import PromptCapture
from tests.faults.conftest import chat, openai_error, serve_router, wait_for

# The error500 engine stays marked healthy, so every request reaches capture (a replica marked down: 503
# before the routing decision is captured).
KEEP_UP = {"fail_threshold": 1_000_000}
EN = "Please explain in two sentences why the sky looks blue during the day."
WRITER_THREAD = "polyspec-capture-write"


def metric(url: str, name: str, reason: str | None = None) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name and (reason is None or sample.labels.get("reason") == reason):
                return sample.value
    return 0.0


def dropped(url: str, reason: str) -> float:
    return metric(url, "polyspec_capture_dropped_total", reason)


def prompts(directory: Path, pattern: str = "*.jsonl") -> list[str]:
    """Every captured prompt, through the reader training uses (a torn line would raise here)."""
    return [r.text for p in sorted(directory.glob(pattern)) if p.stat().st_size for r in read_prompt_records(p)]


def writer_threads() -> int:
    return sum(t.name == WRITER_THREAD for t in threading.enumerate())


def test_full_disk_drops_captures_and_requests_still_route(error500, registry_url, tmp_path, monkeypatch):
    cap_dir, full, append = tmp_path / "capture", threading.Event(), capture_mod._append

    def disk(fd: int, data: bytes) -> None:
        if not full.is_set():
            return append(fd, data)
        os.write(fd, data[: len(data) // 2])  # as on a real full disk: part of the line lands, then ENOSPC
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(capture_mod, "_append", disk)
    with serve_router(registry_url, **KEEP_UP, capture=True, capture_dir=cap_dir) as router:
        full.set()
        for _ in range(5):
            openai_error(chat(router.url, EN), 502)  # the engine's failure, not the disk's: never a 500
        assert wait_for(lambda: dropped(router.url, "disk_full") == 5, 10)
        assert metric(router.url, "polyspec_capture_written_total") == 0
        full.clear()  # space is freed: capture resumes by itself
        for _ in range(2):
            openai_error(chat(router.url, EN), 502)
        assert wait_for(lambda: metric(router.url, "polyspec_capture_written_total") == 2, 10)
        assert router.runtime.capture.stats()["dropped"] == {"disk_full": 5}
    # The half-written lines were cut off: the file is whole JSONL with exactly the two later prompts.
    assert prompts(cap_dir) == [EN, EN]


FILL_SCRIPT = textwrap.dedent("""
    import asyncio, json, resource, signal, sys
    from pathlib import Path
    from polyspec.router.capture import PromptCapture

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel then refuses the write with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    async def main():
        cap = PromptCapture(Path(sys.argv[1]), "r1", write_timeout_s=10)
        cap.start()
        for i in range(100):
            cap.submit("en", "general", f"prompt {i:03d} " + "x" * 150)
            await asyncio.sleep(0)
        await cap.stop()
        print(json.dumps(cap.stats()))

    asyncio.run(main())
""")


def test_a_real_file_size_limit_is_a_full_disk(tmp_path):
    """The kernel itself refuses the writes (RLIMIT_FSIZE: a short write, then EFBIG), as a full disk does
    (a tmpfs or loop device needs root, which the test suite does not have)."""
    out = subprocess.run([sys.executable, "-c", FILL_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats["written"] > 10 and stats["dropped"].get("disk_full", 0) > 10, stats
    assert stats["written"] + stats["dropped"]["disk_full"] == 100
    assert (tmp_path / "en.jsonl").stat().st_size <= 8192
    kept = prompts(tmp_path)  # the torn last line was cut back: the file reads whole
    assert kept == [f"prompt {i:03d} " + "x" * 150 for i in range(stats["written"])]


def test_a_hung_disk_never_delays_requests(error500, registry_url, tmp_path, monkeypatch):
    release = threading.Event()

    def hung(fd: int, data: bytes) -> None:
        release.wait(60)
        os.write(fd, data)

    monkeypatch.setattr(capture_mod, "_append", hung)
    try:
        with serve_router(registry_url, **KEEP_UP, capture=True, capture_dir=tmp_path / "capture", capture_queue=4,
                          capture_write_timeout_s=0.5) as router:
            openai_error(chat(router.url, EN), 502)  # the writer takes this one and hangs
            assert wait_for(lambda: router.runtime.capture.stats()["queue"] == 0, 5)
            latencies = []
            for _ in range(30):
                t0 = time.perf_counter()
                openai_error(chat(router.url, EN, timeout=10), 502)
                latencies.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
            assert time.perf_counter() - t0 < 0.5
            assert max(latencies) < 1.0, latencies  # a blocked request would wait for the disk: 60 s
            assert dropped(router.url, "queue_full") == 30 - 4
            assert wait_for(lambda: dropped(router.url, "write_timeout") == 1, 5)
            assert router.runtime.capture.stats()["writer_blocked"] and writer_threads() == 1
            cap = router.runtime.capture
            t0 = time.perf_counter()
        shutdown_s = time.perf_counter() - t0
        assert shutdown_s < 0.5 + 3.0, shutdown_s  # stop() waits write_timeout_s for the hung disk, no more
        assert cap.stats()["dropped"] == {"queue_full": 26, "write_timeout": 1, "shutdown": 4}
    finally:
        release.set()
    assert wait_for(lambda: writer_threads() == 0, 5)


def test_one_hung_write_holds_one_thread_and_stop_is_bounded(tmp_path, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(capture_mod, "_append", lambda fd, data: release.wait(60))

    async def scenario() -> tuple[dict, float]:
        cap = PromptCapture(tmp_path, "r1", queue_size=3, write_timeout_s=0.2)
        cap.start()
        cap.submit("en", "general", EN)
        while cap.stats()["queue"]:  # the writer took it (and hangs)
            await asyncio.sleep(0.01)
        for _ in range(6):  # over five write timeouts: the writer must not start a thread per record
            for _ in range(5):
                cap.submit("en", "general", EN)
            await asyncio.sleep(0.25)
            assert writer_threads() == 1
        t0 = time.perf_counter()
        await cap.stop()
        return cap.stats(), time.perf_counter() - t0

    try:
        stats, stop_s = asyncio.run(scenario())
    finally:
        release.set()
    assert stop_s < 0.2 + 0.3, stop_s
    assert stats["written"] == 0 and stats["queue"] == 0
    assert stats["dropped"] == {"write_timeout": 1, "queue_full": 30 - 3, "shutdown": 3}
    assert wait_for(lambda: writer_threads() == 0, 5)


def test_rotation_and_retention_keep_the_size_caps(tmp_path):
    old = tmp_path / "en-20200101T000000.000000Z.jsonl"  # a rotated file past the retention period
    old.write_text(json.dumps({"prompt": "old"}) + "\n")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    (tmp_path / "notes.txt").write_text("not capture's")
    sent = {"en": [f"English prompt number {i:04d} " + "e" * 120 for i in range(300)],
            "fr": [f"Invite française numéro {i:04d} " + "é" * 120 for i in range(300)]}

    async def scenario() -> PromptCapture:
        cap = PromptCapture(tmp_path, "r1", file_bytes=4096, total_bytes=32768, retention_days=1)
        cap.start()
        for _ in range(500):
            if not old.exists():  # the retention sweep at start
                break
            await asyncio.sleep(0.01)
        assert not old.exists()
        for i in range(300):
            for lang, texts in sent.items():
                cap.submit(lang, "general", texts[i])
            await asyncio.sleep(0)
        await cap.stop()
        return cap

    stats = asyncio.run(scenario()).stats()
    assert stats["written"] == 600 and stats["dropped"] == {} and stats["files_rotated"] > 10
    files = list(tmp_path.glob("*.jsonl"))
    assert all(p.stat().st_size <= 4096 for p in files)
    rotated = sum(p.stat().st_size for p in files if p.name not in ("en.jsonl", "fr.jsonl"))
    assert rotated + 2 * 4096 <= 32768  # the cap holds even once both active files have grown to a rotation
    assert (tmp_path / "notes.txt").exists()
    for lang, texts in sent.items():
        kept = prompts(tmp_path, f"{lang}-*.jsonl") + prompts(tmp_path, f"{lang}.jsonl")
        assert len(kept) >= 20 and kept == texts[-len(kept):]  # the oldest went, nothing in between was lost


def test_capture_refuses_what_it_must_not_write(tmp_path):
    async def scenario() -> PromptCapture:
        cap = PromptCapture(tmp_path, "r1", max_prompt_chars=3000, file_bytes=4096)
        cap.submit("en", "general", EN)  # before start()
        cap.start()
        for lang in ("../etc", "fr/../../x", "fr\n", "FR", "", "e" * 40, None):
            cap.submit(lang, "general", EN)  # type: ignore[arg-type]
        cap.submit("en", "general", "x" * 3001)
        cap.submit("en", "general", "é" * 2500)  # 5 KB once encoded: over a whole file (file_bytes)
        cap.submit("en", "general", "  \n ")
        cap.submit("en", "general", "bad \ud800 surrogate")  # what a JSON escape can smuggle in
        cap.submit("en", "code", EN)
        await cap.stop()
        return cap

    stats = asyncio.run(scenario()).stats()
    assert stats["dropped"] == {"not_started": 1, "unsafe_language": 7, "too_long": 2, "empty": 1,
                                "invalid_text": 1}
    assert stats["written"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".capture.lock", "en.jsonl"]
    [record] = [json.loads(line) for line in (tmp_path / "en.jsonl").read_text().splitlines()]
    assert set(record) == {"id", "lang", "domain", "prompt", "source", "license"}
    assert (record["lang"], record["domain"], record["prompt"]) == ("en", "code", EN)


def test_capture_directory_deleted_or_unusable_under_a_running_router(error500, registry_url, tmp_path):
    cap_dir = tmp_path / "capture"
    with serve_router(registry_url, **KEEP_UP, capture=True, capture_dir=cap_dir, capture_max_prompt_chars=200) as router:
        openai_error(chat(router.url, EN), 502)
        assert wait_for(lambda: prompts(cap_dir) == [EN], 5)
        shutil.rmtree(cap_dir)
        openai_error(chat(router.url, EN), 502)
        assert wait_for(lambda: cap_dir.is_dir() and prompts(cap_dir) == [EN], 5)  # re-created
        shutil.rmtree(cap_dir)
        cap_dir.write_text("a file where the directory was")  # cannot be re-created
        for _ in range(3):
            openai_error(chat(router.url, EN), 502)
        assert wait_for(lambda: dropped(router.url, "io_error") == 3, 5)
        openai_error(chat(router.url, EN + " " + "word " * 50), 502)  # over capture_max_prompt_chars
        assert dropped(router.url, "too_long") == 1
        assert metric(router.url, "polyspec_capture_written_total") == 2


SHARED_RECORDS = 2000
SHARE_SCRIPT = textwrap.dedent(f"""
    import asyncio, sys, time
    from pathlib import Path
    from polyspec.router.capture import PromptCapture

    async def main():
        cap = PromptCapture(Path(sys.argv[1]), sys.argv[2], file_bytes=4096, total_bytes=1 << 30)
        cap.start()
        await asyncio.sleep(float(sys.argv[3]) - time.time())  # both routers write at the same time
        for i in range({SHARED_RECORDS}):
            cap.submit("en", "general", f"{{sys.argv[2]}} {{i:04d}} " + "x" * 100)
            while cap.stats()["queue"] > 500:  # a steady request rate, not one burst into a full queue
                await asyncio.sleep(0.001)
        await cap.stop()
        assert cap.stats()["written"] == {SHARED_RECORDS}, cap.stats()

    asyncio.run(main())
""")


def test_two_routers_share_a_directory_without_losing_lines(tmp_path):
    start = str(time.time() + 1.0)
    procs = [subprocess.Popen([sys.executable, "-c", SHARE_SCRIPT, str(tmp_path), name, start], stderr=subprocess.PIPE,
                              text=True) for name in ("r1", "r2")]
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) > 10 and all(p.stat().st_size <= 4096 for p in files)
    kept = prompts(tmp_path)
    sent = [f"{name} {i:04d} " + "x" * 100 for name in ("r1", "r2") for i in range(SHARED_RECORDS)]
    assert sorted(kept) == sorted(sent)
