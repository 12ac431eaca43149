"""Several routers, one registry. Three `polyspec serve` processes share a real Postgres
(tests/postgres.py) and the two real vLLM engines of the session (tests/conftest.py); client threads spread
requests over the routers and retry on connection errors, as a load balancer does. One router is killed
(SIGKILL: no drain, no last flush) mid-run.

Shown: no request is lost; each surviving router's live stats in the registry equal what its clients were
answered (increments, flushed every second, summed across routers by `live_stats()`); the killed router
loses at most its unflushed second; prompt capture from three processes into one directory leaves only
whole lines. The registry-side races (shared rows, the adaptation lease) are in test_postgres_concurrency.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import add_draft, wait_for
from polyspec.core.ports import free_port

pytestmark = pytest.mark.integration

ROUTERS = ("r1", "r2", "r3")
VICTIM = "r2"
CLIENTS, PER_CLIENT = 4, 9
KILL_AFTER = 12  # answered requests before the victim is killed
PROMPTS = ("Please write one short sentence about the weather in London today.",
           "Écris une phrase courte sur le temps qu'il fait à Paris aujourd'hui.",
           "What is the capital city of Australia and why was it chosen?",
           "Quelle est la capitale de la France et pourquoi est-elle si célèbre ?")


class _Fleet:
    """The router processes, by id: port, process and log."""

    def __init__(self, pg_url: str, root: Path) -> None:
        self.pg_url, self.root = pg_url, root
        self.ports = {rid: free_port() for rid in ROUTERS}
        self.procs: dict[str, subprocess.Popen] = {}

    def url(self, rid: str) -> str:
        return f"http://127.0.0.1:{self.ports[rid]}"

    def start(self) -> None:
        env = {**os.environ, "POLYSPEC_ROUTER_FLUSH_INTERVAL_S": "1", "POLYSPEC_ROUTER_HEALTH_INTERVAL_S": "1",
               "POLYSPEC_ROUTER_DEFAULT_LANGUAGE": "en", "POLYSPEC_ROUTER_CAPTURE": "1",
               "POLYSPEC_ROUTER_CAPTURE_DIR": str(self.root / "capture")}
        for rid in ROUTERS:
            log = open(self.root / f"{rid}.log", "w")  # noqa: SIM115 - the process keeps it
            self.procs[rid] = subprocess.Popen(
                [Path(sys.executable).parent / "polyspec", "serve", "--port", str(self.ports[rid]),
                 "--registry", self.pg_url, "--router-id", rid, "--log-level", "warning"],
                stdout=log, stderr=log, env=env)

    def ready(self) -> bool:
        def one(rid: str) -> bool:
            try:
                return httpx.get(f"{self.url(rid)}/ready", timeout=2).status_code == 200
            except httpx.TransportError:
                return False
        return all(one(rid) for rid in ROUTERS)

    def logs(self) -> str:
        return "\n".join(f"--- {rid}\n{(self.root / f'{rid}.log').read_text()[-1500:]}" for rid in ROUTERS)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class _Clients:
    """Client threads behind a round-robin "load balancer" that retries a request on the next router after
    a connection error (refused, reset, closed mid-answer); a timeout or an HTTP error is a lost request."""

    def __init__(self, fleet: _Fleet) -> None:
        self.fleet = fleet
        self.ok: Counter[str] = Counter()  # answered (HTTP 200), by the router that answered
        self.retried: Counter[str] = Counter()  # connection errors, by the router that had them
        self.lost: list[str] = []
        self.lock = threading.Lock()

    def _one(self, worker: int, j: int) -> None:
        body = {"model": "polyspec", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPTS[(worker + j) % len(PROMPTS)]}]}
        for attempt in range(3 * len(ROUTERS)):
            rid = ROUTERS[(worker + j + attempt) % len(ROUTERS)]
            try:
                resp = httpx.post(f"{self.fleet.url(rid)}/v1/chat/completions", json=body, timeout=120)
            except httpx.TimeoutException as exc:
                with self.lock:
                    self.lost.append(f"{rid}: {exc!r}")
                return
            except httpx.TransportError:
                with self.lock:
                    self.retried[rid] += 1
                continue
            with self.lock:
                if resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] is not None:
                    self.ok[rid] += 1
                else:
                    self.lost.append(f"{rid}: {resp.status_code} {resp.text[:200]}")
            return
        with self.lock:
            self.lost.append("no router accepted the connection")

    def run(self, kill: threading.Event) -> None:
        threads = [threading.Thread(target=lambda w=w: [self._one(w, j) for j in range(PER_CLIENT)], daemon=True)
                   for w in range(CLIENTS)]
        for t in threads:
            t.start()
        assert wait_for(lambda: sum(self.ok.values()) >= KILL_AFTER, 90), (self.ok, self.lost)
        kill.set()
        for t in threads:
            t.join(120)


def _metric_sum(url: str, name: str, **labels: str) -> float:
    """The sum of a router's /metrics samples named ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
               for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _registry_requests(reg, router_id: str | None = None) -> int:
    return sum(s.requests for s in reg.live_stats(router_id=router_id))


def test_three_routers_one_postgres_lose_nothing_when_one_dies(pg_url, verifier, engine_processes, tmp_path):
    from polyspec.registry import open_registry

    reg = open_registry(pg_url)
    reg.add_verifier(verifier)
    for lang, engine in engine_processes.items():
        ref = add_draft(reg, engine.spec.draft, verifier.name, f"{lang}-draft", [lang], {lang: 1.5})
        reg.deploy(ref, name=f"{lang}-engine", url=engine.url, default=(lang == "en"))
    fleet = _Fleet(pg_url, tmp_path)
    fleet.start()
    try:
        assert wait_for(fleet.ready, 120, 0.5), fleet.logs()
        clients, kill = _Clients(fleet), threading.Event()
        killer = threading.Thread(target=lambda: kill.wait(120) and fleet.procs[VICTIM].kill(), daemon=True)
        killer.start()
        clients.run(kill)
        killer.join(10)
        assert fleet.procs[VICTIM].wait(10) == -9

        # 0 lost requests; the kill was felt (connections to the dead router were refused or reset).
        assert clients.lost == [], clients.lost
        assert sum(clients.ok.values()) == CLIENTS * PER_CLIENT, clients.ok
        assert clients.retried[VICTIM] > 0 and set(clients.retried) == {VICTIM}, clients.retried
        survivors = [rid for rid in ROUTERS if rid != VICTIM]
        assert all(clients.ok[rid] > 0 for rid in survivors), clients.ok

        # Live statistics: every surviving router's flushed row equals what its clients were answered and
        # what its own /metrics says; the registry's total is the sum of the per-router rows.
        def flushed() -> bool:
            return all(_registry_requests(reg, rid) == clients.ok[rid] for rid in survivors)

        assert wait_for(flushed, 15, 0.2), {rid: (_registry_requests(reg, rid), clients.ok[rid]) for rid in ROUTERS}
        for rid in survivors:
            assert _metric_sum(fleet.url(rid), "polyspec_requests_total", status="ok") == clients.ok[rid]
        per_router = {rid: _registry_requests(reg, rid) for rid in ROUTERS}
        assert _registry_requests(reg) == sum(per_router.values())
        # The victim loses at most what it had not flushed yet (at most 1 s), and never counts a request twice
        # (one it answered while the connection died may be in its row and retried elsewhere).
        assert per_router[VICTIM] <= clients.ok[VICTIM] + clients.retried[VICTIM]
        rows = reg.live_stats()
        assert {r.language for r in rows} <= {"en", "fr", "und"} and {r.draft_name for r in rows} == {
            "en-draft@1", "fr-draft@1"}, rows
        assert sum(r.num_spec_steps for r in rows) > 0  # acceptance counters travel with the request counts

        # Capture: three processes append to one directory; the victim died mid-run, yet every line is whole.
        def captured() -> Counter[str]:
            lines = [json.loads(line) for f in sorted((tmp_path / "capture").glob("*.jsonl"))
                     for line in f.read_text().splitlines()]
            return Counter(line["source"].rsplit(":", 1)[-1] for line in lines)

        assert wait_for(lambda: all(captured()[rid] == clients.ok[rid] for rid in survivors), 10), captured()
    finally:
        fleet.stop()
        reg.close()
