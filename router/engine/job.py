"""One request's bookkeeping, shared by the unary and the streamed path: the job, the payload and headers
each engine gets (encoded once per request), failed attempts, the final error, and what telemetry records
about the outcome."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from polyspec.router.edge.body import encode_body
from polyspec.router.decision.classify import HEADER_PREFIX, Decision
from polyspec.router.engine.engine_http import HOP_BY_HOP, Response, header_lines
from polyspec.router.errors import RouterError, UpstreamFailed, UpstreamTimeout
from polyspec.router.decision.policy import Target
from polyspec.router.decision.speed import Ranking
from polyspec.router.engine.upstream import is_timeout
from polyspec.router.telemetry import KeySeries

if TYPE_CHECKING:  # annotations only: the runtime imports the engine side
    from polyspec.router.runtime import RouterRuntime

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
PASSED_UPSTREAM_HEADERS = ("x-request-id",)
# Client headers an engine never gets: the hop-by-hop ones (engine_http.HOP_BY_HOP), and those the router sets
# itself: the body is re-serialised JSON, and the engine answers uncompressed (router.engine.upstream).
_NOT_FORWARDED = HOP_BY_HOP | {"content-type", "accept-encoding"}
_JSON_TYPE = b"Content-Type: application/json\r\n"
R = TypeVar("R", bound="Reported")
# What an attempt gives when its engine answered: the response, and its body read whole (True: an answer, or
# an error of the engine) or a stream's first bytes (False).
Opened = tuple[Response, bytes, bool]


@dataclass
class Job:
    kind: str
    decision: Decision
    targets: list[Target]
    body: dict[str, Any]
    strict_json: bool  # msgspec may re-encode the body (see classify.decode_body)
    alias: bool  # the client named a router alias: each engine gets its own model id
    headers: bytes  # the header lines every engine gets (`forwarded_headers`)
    stream: bool
    client_usage: bool
    started: float
    ranking: Ranking | None = None  # the speed policy's candidates (router.decision.speed); None under the MAL policy
    explain: bool = False  # the client asked for the decision in response headers (X-Polyspec-Explain)
    recorded: bool = field(default=False, init=False)
    attempt_started: float = field(default=0.0, init=False)
    batch: int = field(default=1, init=False)  # streams on the engine, this one included, when it was sent
    # The body as each engine gets it, encoded at its first attempt: the client's own (key None), or with an
    # engine's model id in place of a router alias (key: that id).
    payloads: dict[str | None, bytes] = field(default_factory=dict, init=False, repr=False)

    def begin_attempt(self, in_flight: int) -> None:
        """Called as a replica is acquired: the attempt's clock and the batch it joins (live step times)."""
        self.attempt_started = time.perf_counter()
        self.batch = max(1, in_flight)

    @property
    def endpoint(self) -> str:
        return PATHS[self.kind]


def explain_headers(job: Job, target: Target) -> list[tuple[bytes, bytes]]:
    """The speed policy's decision, for a client that sent ``X-Polyspec-Explain: 1``: the reason, the
    predicted tokens/s of the pool that answers, and the candidates as ``draft=tokens/s`` (at most 8)."""
    ranking = job.ranking
    if not job.explain or ranking is None:
        return []
    mine = next((c for c in ranking.candidates if c.pool.key == target.pool.key), None)
    reason = ranking.reason if mine is ranking.chosen else "fallback"
    listed = ",".join(f"{c.pool.draft}={'-' if c.tps is None else f'{c.tps:.2f}'}" for c in ranking.candidates[:8])
    out = [(b"x-polyspec-route-reason", reason.encode()),
           (b"x-polyspec-candidates", listed.encode("latin-1", errors="replace"))]
    if mine is not None and mine.tps is not None:
        out.append((b"x-polyspec-predicted-tps", f"{mine.tps:.2f}".encode()))
    return out


def router_headers(decision: Decision, target: Target, upstream: Mapping[str, str] | None = None,
                   job: Job | None = None) -> list[tuple[bytes, bytes]]:
    passed = [(k.encode(), upstream[k].encode("latin-1")) for k in PASSED_UPSTREAM_HEADERS
              if upstream is not None and k in upstream]
    passed += explain_headers(job, target) if job is not None else []
    return passed + [
        (b"x-polyspec-language", decision.language.encode("latin-1")),
        (b"x-polyspec-confidence", f"{decision.confidence:.4f}".encode()),
        (b"x-polyspec-domain", decision.domain.encode("latin-1")),
        (b"x-polyspec-backend", target.replica.name.encode("latin-1")),
        (b"x-polyspec-draft", target.pool.draft.encode("latin-1")),
    ]


def forwarded_headers(headers: Mapping[str, str]) -> bytes:
    """The client's headers as every engine gets them, encoded once per request: without the hop-by-hop
    ones, those the router sets itself and the router's own X-Polyspec-*, with the JSON content type."""
    return header_lines(headers, _NOT_FORWARDED, HEADER_PREFIX) + _JSON_TYPE


def payload(rt: RouterRuntime, job: Job, target: Target) -> bytes:
    """The body ``target``'s engine gets, encoded once per request (once per engine model id for an alias)."""
    model = (rt.backends.model_for(target.replica.url) or None) if job.alias else None
    encoded = job.payloads.get(model)
    if encoded is None:
        body = job.body
        if model is not None:
            body = dict(body)
            body["model"] = model
        encoded = job.payloads[model] = encode_body(body, job.strict_json)
    return encoded


def fail(rt: RouterRuntime, target: Target, reason: str, detail: str) -> None:
    rt.telemetry.metrics.upstream_errors_of(target.replica.name, reason).inc()
    rt.backends.record_failure(target.replica.url, f"{reason}: {detail}")


def attempt_failed(rt: RouterRuntime, target: Target, errors: list[tuple[str, str]], exc: BaseException) -> None:
    """An engine could not be reached or broke before answering: note it, count it, try the next one."""
    if is_timeout(exc):
        errors.append((target.replica.name, f"timeout ({type(exc).__name__})"))
        fail(rt, target, "timeout", type(exc).__name__)
    else:
        errors.append((target.replica.name, f"{type(exc).__name__}: {exc}"))
        fail(rt, target, "connection", type(exc).__name__)


def give_up(errors: list[tuple[str, str]]) -> RouterError:
    summary = "; ".join(f"{name}: {what}" for name, what in errors)
    if errors and errors[-1][1].startswith("timeout"):
        return UpstreamTimeout(f"The engine did not answer in time ({summary}).")
    return UpstreamFailed(f"Every attempt failed ({summary}).")


def record(rt: RouterRuntime, job: Job, target: Target | None, status: str, spec: Any = None, tokens: int = 0) -> None:
    job.recorded = True
    backend = target.replica.name if target else "none"
    d = job.decision
    language = d.stats_language
    rt.telemetry.observe_result(job.endpoint, language, d.domain, backend, status)
    rt.telemetry.metrics.latency_of(job.endpoint, "true" if job.stream else "false").observe(time.perf_counter() - job.started)
    if target is not None and status == "ok":
        elapsed = time.perf_counter() - job.attempt_started if job.attempt_started else 0.0
        key = (language, d.domain, target.pool.draft)
        counts = rt.telemetry.observe_acceptance(key, spec, tokens, elapsed)
        steps = counts.num_spec_steps if target.pool.speculates else tokens
        rt.live_steps.observe(target.replica.url, job.batch, elapsed, steps, tokens)
        observe_speed(rt, job, target, language, counts, rt.telemetry.metrics.series_of(key))


def observe_speed(rt: RouterRuntime, job: Job, target: Target, language: str, counts: Any,
                  series: KeySeries) -> None:
    """Predicted and observed tokens/s of the answering pool, for Prometheus (bounded labels: the stats
    language and the table's drafts); ``series``: the held children of (language, domain, draft)."""
    m = rt.telemetry.metrics
    ranking = job.ranking
    draft = target.pool.draft
    reason = "mal_policy" if ranking is None else ranking.reason
    mine = None if ranking is None else next((c for c in ranking.candidates if c.pool.key == target.pool.key), None)
    if ranking is not None and mine is not ranking.chosen:
        reason = "fallback"
    choices = series.route_choices.get(reason)
    if choices is None:
        choices = series.route_choices[reason] = m.route_choices_of(language, draft, reason)
    choices.inc()
    if mine is not None and mine.tps is not None:
        rt.telemetry.observe_prediction(language, draft, mine.tps)
    tps = counts.tokens_per_second
    if tps is not None:
        if series.request_tps is None:
            series.request_tps = m.request_tps_of(language, draft)
        series.request_tps.observe(tps)


class Reported(msgspec.Struct):
    """The two fields of a completion (or a stream's usage chunk) the router reads; decoding into this
    skips everything else of the response without building it."""

    usage: Any = None
    metrics: Any = None


def reported_telemetry(reported: Reported) -> tuple[Any, int]:
    """(``metrics.speculative_decoding``, completion tokens); (None, 0) for anything malformed."""
    metrics = reported.metrics if isinstance(reported.metrics, dict) else {}
    usage = reported.usage if isinstance(reported.usage, dict) else {}
    try:
        return metrics.get("speculative_decoding"), int(usage.get("completion_tokens") or 0)
    except (ValueError, TypeError):
        return metrics.get("speculative_decoding"), 0


def decode_reported(data: bytes, kind: type[R]) -> R | None:
    """``data`` decoded into the struct ``kind``; None when it is not a JSON object. Non-strict JSON
    (NaN and the like, which msgspec refuses) is still read, through ``json``."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.MsgspecError:
        pass
    try:
        obj = json.loads(data)
        return msgspec.convert(obj, kind) if isinstance(obj, dict) else None
    except (ValueError, msgspec.MsgspecError):
        return None


def completion_telemetry(content: bytes) -> tuple[Any, int]:
    reported = decode_reported(content, Reported)
    return reported_telemetry(reported) if reported is not None else (None, 0)
