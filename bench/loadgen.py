"""A bounded async HTTP load generator (httpx), run as its own process by the router benchmarks.

Runs in a separate process (pinned to another core than the router under test) so that the client
does not steal the router's CPU. Every loop is bounded by a request count AND a deadline, and only
127.0.0.1 may be targeted. Reads a JSON spec file, prints one JSON result on stdout:

    spec:   {"url", "bodies": [obj, ...], "concurrency", "requests", "max_seconds", "stream", "warmup",
             "headers", "timeout_s", "record_outcomes"}
    result: {"ok", "errors", "error_kinds", "wall_s", "rps", "latency_ms": {...}, "ttfb_ms": {...},
             "outcomes": [...] (optional)}
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlparse


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max of ``values`` (nearest-rank); empty input gives zeros."""
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0, "n": 0}
    xs = sorted(values)

    def rank(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs) - 1e-9) - 1))]

    return {"p50": round(rank(0.50), 3), "p90": round(rank(0.90), 3), "p99": round(rank(0.99), 3),
            "mean": round(sum(xs) / len(xs), 3), "max": round(xs[-1], 3), "n": len(xs)}


def check_local(url: str) -> None:
    host = urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"loadgen only targets 127.0.0.1, not {host!r}")


def classify_stream_end(tail: bytes) -> str:
    """'ok' when an SSE stream ended with [DONE] and no error event, else the kind of failure."""
    if b'"error"' in tail and b"data: [DONE]" in tail:
        return "sse_error"
    return "ok" if tail.rstrip().endswith(b"data: [DONE]") else "truncated_stream"


async def one_request(client: Any, url: str, payload: bytes, stream: bool, headers: dict) -> dict[str, Any]:
    start = time.perf_counter()
    ttfb = None
    try:
        if stream:
            async with client.stream("POST", url, content=payload, headers=headers) as resp:
                tail = b""
                async for chunk in resp.aiter_bytes():
                    if ttfb is None:
                        ttfb = time.perf_counter() - start
                    tail = (tail + chunk)[-2048:]
                status = resp.status_code
                kind = classify_stream_end(tail) if status == 200 else f"http_{status}"
        else:
            resp = await client.post(url, content=payload, headers=headers)
            ttfb = time.perf_counter() - start
            status = resp.status_code
            kind = "ok" if status == 200 and b'"choices"' in resp.content else f"http_{status}"
            if status != 200 and b'"error"' not in resp.content:
                kind += "_not_openai_error"
    except Exception as exc:  # noqa: BLE001 - every failure is counted by its kind, none is lost
        return {"kind": type(exc).__name__, "latency": time.perf_counter() - start, "ttfb": ttfb, "status": 0,
                "detail": repr(exc)[:200]}
    return {"kind": kind, "latency": time.perf_counter() - start, "ttfb": ttfb, "status": status}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    url, conc = spec["url"], int(spec["concurrency"])
    check_local(url)
    total, max_s = int(spec["requests"]), float(spec["max_seconds"])
    stream = bool(spec.get("stream"))
    payloads = [json.dumps(b, ensure_ascii=False).encode() for b in spec["bodies"]]
    headers = {"Content-Type": "application/json", **spec.get("headers", {})}
    # Idle connections expire on the client (2 s) before uvicorn's 5 s keep-alive closes them on the server:
    # otherwise a request sent on a connection the server is closing fails with ReadError (a client race).
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc, keepalive_expiry=2.0)
    timeout = httpx.Timeout(float(spec.get("timeout_s", 60)))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        warm = int(spec.get("warmup", 0))
        for i in range(0, warm, conc):  # warm-up: open connections, let servers JIT/cache
            await asyncio.gather(*[one_request(client, url, payloads[j % len(payloads)], stream, headers)
                                   for j in range(i, min(warm, i + conc))])
        results: list[dict[str, Any]] = []
        counter = iter(range(total))
        deadline = time.monotonic() + max_s

        async def worker() -> None:
            for i in counter:  # shared iterator: the count bound
                if time.monotonic() > deadline:  # the time bound
                    return
                r = await one_request(client, url, payloads[i % len(payloads)], stream, headers)
                r["i"] = i
                results.append(r)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(conc)])
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["kind"] == "ok"]
    out: dict[str, Any] = {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_kinds": dict(Counter(r["kind"] for r in results if r["kind"] != "ok")),
        "wall_s": round(wall, 3), "rps": round(len(ok) / wall, 1) if wall > 0 else 0.0,
        "latency_ms": percentiles([r["latency"] * 1000 for r in ok]),
        "ttfb_ms": percentiles([r["ttfb"] * 1000 for r in ok if r["ttfb"] is not None]),
    }
    out["error_samples"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                            for r in results if r["kind"] != "ok"][:50]
    if spec.get("record_outcomes"):
        out["outcomes"] = [{"i": r["i"], "kind": r["kind"], "status": r["status"]} for r in results]
    return out


def main() -> None:
    spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
    try:
        import uvloop

        result = uvloop.run(run(spec))
    except ImportError:
        result = asyncio.run(run(spec))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
