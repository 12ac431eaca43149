"""Registry write rate under routed traffic: what one Postgres sees from several routers.

Starts a throwaway PostgreSQL cluster (tests/postgres.py: Debian's server, Unix socket only), a registry on
it with one default deployment at the fake OpenAI backend (bench/fake_openai.py, 9 languages), and
``--routers`` `polyspec serve` processes with live stats flushed every ``--flush-s`` seconds. Then, per
phase (idle, then each ``--concurrency``), one load generator per router (bench/loadgen.py, MT-Bench first
turns in 9 languages) drives traffic for ``--seconds`` (the fake engine answers in 16 x ``--token-delay-ms``,
so the phases run at different request rates); Postgres' own counters are read before and after:

- ``pg_stat_database``: transactions committed (reads included: each router re-reads the routing table and
  the shared live stats), rows inserted/updated/deleted;
- ``pg_stat_user_tables``: the same rows per table (who writes);
- ``pg_current_wal_lsn()``: WAL bytes written.

After the load, the reading waits one flush period (the routers' last deltas) plus Postgres' idle stats
interval (a backend reports its counters at most every 10 s when idle), so the window holds every write the
requests caused. Writes are per flush, not per request: each router writes one row per (language, domain,
draft) it saw since its last flush, so the rate follows routers x keys / flush period, whatever the request
rate; the phases show it.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/registry_writes.py
    .venv/bin/python bench/capacity.py     # fills the capacity table of docs/scale-out.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402

from bench.common import machine_info, mtbench_turns, write_json  # noqa: E402
from bench.servers import SERVED_LANGUAGES, Server, make_registry, start_backend, start_polyspec  # noqa: E402

PG_IDLE_STATS_S = 11.0  # PostgreSQL 15 reports an idle backend's counters within 10 s (PGSTAT_IDLE_INTERVAL)


def pg_counters(url: str) -> dict[str, Any]:
    """Postgres' cumulative counters for the registry database, from a fresh connection."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            db = conn.execute(text(
                "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
                "WHERE datname = current_database()")).mappings().one()
            tables = {r.relname: r.n_tup_ins + r.n_tup_upd + r.n_tup_del for r in conn.execute(text(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"))}
            wal = conn.execute(text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")).scalar_one()
    finally:
        engine.dispose()
    return {**{k: int(v) for k, v in db.items()}, "tables": tables, "wal_bytes": int(wal)}


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out = {k: after[k] - before[k] for k in after if k != "tables"}
    # pg_stat_database's tuples include the catalogs (autovacuum's pg_statistic rows); the tables are ours.
    out["rows_all"] = out["tup_inserted"] + out["tup_updated"] + out["tup_deleted"]
    out["rows_by_table"] = {t: n - before["tables"].get(t, 0) for t, n in sorted(after["tables"].items())
                            if n - before["tables"].get(t, 0)}
    out["rows_written"] = sum(out["rows_by_table"].values())
    return out


def load(routers: list[Server], bodies: list[dict], conc: int, seconds: float) -> list[dict[str, Any]]:
    """One bench/loadgen.py process per router at once (a load balancer's share each); their results."""
    def one(server: Server) -> dict[str, Any]:
        spec = {"url": f"{server.url}/v1/chat/completions", "bodies": bodies, "concurrency": conc,
                "requests": 10_000_000, "max_seconds": seconds, "warmup": 0, "timeout_s": 60}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).parent / "loadgen.py"), f.name],
                                  capture_output=True, text=True, timeout=seconds + 120)
        finally:
            Path(f.name).unlink(missing_ok=True)
        if proc.returncode != 0:
            raise RuntimeError(f"loadgen failed: {proc.stderr[-800:]}")
        return json.loads(proc.stdout)

    with ThreadPoolExecutor(len(routers)) as pool:
        return list(pool.map(one, routers))


def phase(url: str, routers: list[Server], bodies: list[dict], conc: int, seconds: float, flush_s: float) -> dict:
    """One reading of Postgres' counters around a load (or an idle wait); rates over the load's wall time
    (the idle window for an idle phase), and per 1,000 requests, which is the write rate per 1,000
    requests/s without any window: (rows/s) / (requests/s / 1000)."""
    before, started = pg_counters(url), time.monotonic()
    results = load(routers, bodies, conc, seconds) if conc else []
    time.sleep(flush_s + PG_IDLE_STATS_S)  # the routers' last flush, then Postgres' idle stats report
    d = delta(pg_counters(url), before)
    ok = sum(r["ok"] for r in results)
    span = max(r["wall_s"] for r in results) if results else time.monotonic() - started

    def per_k(n: float) -> float | None:
        return round(n * 1000 / ok, 2) if ok else None

    return {"concurrency_per_router": conc, "seconds": round(span, 2), "requests_ok": ok,
            "errors": sum(r["errors"] for r in results), "rps": round(ok / span, 1),
            "commits": d["xact_commit"], "rollbacks": d["xact_rollback"], "rows_written": d["rows_written"],
            "rows_by_table": d["rows_by_table"], "rows_all_incl_catalogs": d["rows_all"], "wal_bytes": d["wal_bytes"],
            "rows_written_per_s": round(d["rows_written"] / span, 2), "commits_per_s": round(d["xact_commit"] / span, 2),
            "wal_kib_per_s": round(d["wal_bytes"] / 1024 / span, 2),
            "per_1000_rps": {"rows_written_per_s": per_k(d["rows_written"]), "commits_per_s": per_k(d["xact_commit"]),
                             "wal_kib_per_s": per_k(d["wal_bytes"] / 1024)}}


def live_keys(url: str) -> int:
    """Rows of live_stats: (router, language, domain, draft) keys; one flush of a router writes at most its own."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM live_stats")).scalar_one())
    finally:
        engine.dispose()


def main(routers: int = typer.Option(3, help="Router processes."),
         concurrency: str = typer.Option("1,8,32", help="Phases: client connections per router (0 = idle)."),
         seconds: float = typer.Option(30.0, help="Load per phase."),
         flush_s: float = typer.Option(5.0, "--flush-s", help="The routers' live stats flush period."),
         token_delay_ms: float = typer.Option(10.0, help="The fake engine's time per token: spreads the phases' "
                                              "request rates (a 16-token answer takes 160 ms)."),
         out: str = typer.Option("registry_writes.json", help="File name under docs/benchmarks/.")) -> None:
    from tests.postgres import throwaway_postgres

    levels = [0] + [int(c) for c in concurrency.split(",") if c.strip()]
    bodies = [{"model": "polyspec", "messages": [{"role": "user", "content": t}], "max_tokens": 16, "temperature": 0}
              for lang in SERVED_LANGUAGES for t in mtbench_turns(lang, 20, turn=0)]
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="registry-writes-") as tmp, throwaway_postgres() as url:
        work = Path(tmp)
        backend = start_backend(work, None, token_delay_ms=token_delay_ms)
        servers: list[Server] = []
        try:
            make_registry(work, [("fake", backend.url, SERVED_LANGUAGES, True)], url=url)
            env = {"POLYSPEC_ROUTER_FLUSH_INTERVAL_S": str(flush_s)}
            servers = [start_polyspec(work, url, None, extra_env=env, router_id=f"r{i + 1}") for i in range(routers)]
            time.sleep(PG_IDLE_STATS_S)  # start-up reads reported before the first reading
            phases = [phase(url, servers, bodies, conc, seconds, flush_s) for conc in levels]
            keys = live_keys(url)
        finally:
            for server in [*servers, backend]:
                server.stop()
    payload = {"benchmark": "registry_writes", "machine": machine,
               "setup": {"routers": routers, "flush_interval_s": flush_s, "seconds_per_phase": seconds,
                         "languages": len(SERVED_LANGUAGES), "backend": f"bench/fake_openai.py, 16-token answers, {token_delay_ms:g} ms per token",
                         "registry": "PostgreSQL (Debian), throwaway cluster, fsync off",
                         "client": "one bench/loadgen.py per router, MT-Bench first turns"},
               "live_stats_rows": keys,
               # what a flush of every router writes when each saw all its keys since the last one
               "rows_per_s_if_every_key_flushed": round(keys / flush_s, 2),
               "phases": phases}
    path = write_json(out, payload)
    for p in phases:
        typer.echo(f"conc {p['concurrency_per_router']}: {p['rps']} req/s, {p['rows_written_per_s']} rows/s, "
                   f"{p['commits_per_s']} commits/s, {p['wal_kib_per_s']} KiB WAL/s  ({p['rows_by_table']})")
    typer.echo(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
