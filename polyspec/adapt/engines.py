"""Engines for the blue-green swap: start the candidate's engine beside the old one, tell the routers, drain an
engine that no longer gets traffic, and stop it.

An engine adapt starts outlives the `polyspec adapt once` process that started it (its own process group);
its deployment's launch spec records it under ``adapt_engine`` (pid, port, log), which is how a later
adapt, `polyspec adapt rollback`, or an operator stops it. A pid is only signalled after /proc confirms it is
still that vLLM server on that port (a reused pid is left alone). An engine of `polyspec up` is stopped the
same way when its fleet recorded its pid as ``launched_pid``; otherwise it is undeployed and drained, and
stops with its fleet.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from polyspec.core.errors import Unavailable
from polyspec.core.settings import get_settings
from polyspec.fleet.reference import ReferenceJob
from polyspec.models.vllm_engine import EngineSpec, VllmEngine

log = logging.getLogger("polyspec.adapt")

ENGINE_KEY = "adapt_engine"  # in Deployment.launch: the engine adapt started for it
FLEET_PID_KEY = "launched_pid"  # in Deployment.launch, where `polyspec up` records its engine's pid
# Knobs copied from the deployment the candidate is compared with, so both engines run alike.
COPIED = ("max_model_len", "kv_cache_gib", "dtype", "cpu_bind", "threads", "served_model_name", "extra_args", "env")


class EngineStartFailed(Unavailable):
    """The candidate's engine did not start, or failed its self-check; nothing was deployed."""


def candidate_spec(launch: dict[str, Any] | None, verifier_location: str, draft_location: str, k: int,
                   threads: int | None) -> dict[str, Any]:
    """EngineSpec fields for a new engine: the knobs of ``launch`` (the launch spec of the deployment it is
    compared with, or of the one it restores), its own draft, a free port."""
    launch = dict(launch or {})
    spec: dict[str, Any] = {key: launch[key] for key in COPIED if launch.get(key) is not None}
    spec.update(verifier=verifier_location, draft=draft_location, k=int(k), host="127.0.0.1", port=0)
    if threads is not None:
        spec.update(cpu_bind="nobind", threads=threads)
    return spec


def start_engine(spec: dict[str, Any], log_path: Path, *, timeout_s: float, self_check: bool) -> Any:
    """Start, wait for /health, self-check; the running VllmEngine, or EngineStartFailed (engine stopped)."""
    engine = VllmEngine(EngineSpec(**spec), log_path)
    try:
        engine.start()
        job = None
        if self_check:
            job = ReferenceJob(str(spec["verifier"]), log_path.with_name(log_path.stem + "-reference.log"))
        try:
            engine.wait_ready(timeout=timeout_s, progress=False)
            if job is not None:
                engine.self_check(job.result(timeout_s))
        finally:
            if job is not None:
                job.cancel()
    except Exception as exc:  # any failure: nothing may keep running, and the caller records why
        engine.stop()
        raise EngineStartFailed(f"candidate engine did not start: {type(exc).__name__}: {str(exc)[:2000]}") from exc
    return engine


def engine_record(engine: Any) -> dict[str, Any]:
    proc = engine.process
    return {"pid": proc.pid if proc else None, "port": engine.port, "url": engine.url, "log": str(engine.log_path)}


def _is_engine(pid: int, port: int | None) -> bool:
    """Whether ``pid`` is still a vLLM api_server (on ``port``, when known): never signal a reused pid."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in cmd]
    if not any("vllm" in a for a in args):
        return False
    return port is None or str(port) in args


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int | None, port: int | None = None, grace_s: float = 20.0) -> str:
    """SIGTERM the engine's process group, SIGKILL after ``grace_s``; what happened, in words."""
    if not pid or not alive(pid):
        return "already stopped"
    if not _is_engine(pid, port):
        return f"pid {pid} is no longer a vLLM engine on port {port}: left alone"
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return "stopped"
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                _reap(pid)
                return "stopped" if sig == signal.SIGTERM else "killed"
            time.sleep(0.2)
    return f"pid {pid} did not stop"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (the engine this process started): no zombie left behind
    except ChildProcessError:
        pass


def owned_pid(deployment: Any) -> tuple[int | None, int | None]:
    """(pid, port) of a deployment's engine when this host may stop it (adapt's own, or a fleet's recorded)."""
    launch = dict(getattr(deployment, "launch", None) or {})
    mine = launch.get(ENGINE_KEY) or {}
    if mine.get("pid"):
        return int(mine["pid"]), mine.get("port")
    if launch.get(FLEET_PID_KEY):
        return int(launch[FLEET_PID_KEY]), launch.get("port")
    return None, None


def busy(url: str, timeout_s: float = 5.0) -> int | None:
    """Requests running or waiting in the engine (vLLM's gauges); None when it cannot be read."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        resp.raise_for_status()
        samples = [s for f in text_string_to_metric_families(resp.text) for s in f.samples]
    except (httpx.HTTPError, ValueError):  # down, or not a vLLM metrics page
        return None
    gauges = [s.value for s in samples if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
    return int(sum(gauges)) if gauges else None


def drain(url: str, timeout_s: float, quiet_s: float = 2.0, poll_s: float = 0.5) -> dict[str, Any]:
    """Wait until the engine has had no request for ``quiet_s`` (the routers no longer send it any)."""
    started = time.monotonic()
    quiet_since: float | None = None
    last = None
    while time.monotonic() - started < timeout_s:
        last = busy(url)
        if last is None:  # stopped, or no vLLM gauges to read: the routers' refresh wait was the drain
            time.sleep(quiet_s)
            return {"drained": True, "note": "no in-flight count readable (engine stopped or not vLLM)",
                    "s": _since(started)}
        if last == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return {"drained": True, "s": _since(started)}
        else:
            quiet_since = None
        time.sleep(poll_s)
    return {"drained": False, "in_flight": last, "s": _since(started)}


def _since(started: float) -> float:
    return round(time.monotonic() - started, 2)


def refresh_routers(urls: list[str], wait_s: float) -> list[dict[str, Any]]:
    """Make the routers reload the registry now (their admin refresh); without routers to call, or when one
    fails, wait ``wait_s``, the routers' own refresh period."""
    results: list[dict[str, Any]] = []
    token = get_settings().admin_token
    csrf = secrets.token_urlsafe(32)  # any well-formed value: the check is cookie == header (router.admin.auth)
    headers = {"X-CSRF-Token": csrf, **({"Authorization": f"Bearer {token}"} if token else {})}
    for url in urls:
        try:
            resp = httpx.post(f"{url}/admin/api/refresh", json={}, headers=headers, cookies={"polyspec_csrf": csrf},
                              timeout=30)
            ok = resp.status_code == 200 and bool(resp.json().get("ok"))
            results.append({"router": url, "ok": ok, **({} if ok else {"error": resp.text[:300]})})
        except (httpx.HTTPError, ValueError) as exc:
            results.append({"router": url, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    if not urls or not all(r["ok"] for r in results):
        log.info("waiting %.0f s for the routers to reload the registry", wait_s)
        time.sleep(wait_s)
    return results
