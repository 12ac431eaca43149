"""Live telemetry: per-request acceptance aggregates, Prometheus metrics and the dashboard snapshot.

Acceptance comes from vLLM's per-request ``metrics.speculative_decoding`` (engines run with
``--per-request-spec-decode-metrics summary``). ``acceptance_histogram[j]`` counts verify steps that
accepted exactly j drafts, so steps accepting at least i drafts = sum(h[i:]) -- the same quantity as
vLLM's ``spec_decode_num_accepted_tokens_per_pos_total{position=i-1}``.

Aggregates are kept twice: cumulative (for the dashboard) and as pending deltas that are flushed to
the registry (``record_live_stats`` adds them), so several routers and restarts lose nothing.
This module is torch-free: the admin dashboard imports it.
"""

from __future__ import annotations

import time
from collections import Counter
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram

from polyspec.core.counters import SpecCounts
from polyspec.router.table import LiveRow

CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
TPS_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def acceptance_summary(row: LiveRow) -> dict[str, Any]:
    """The row's counters, per-position acceptance and mean acceptance length, as the registry stores them."""
    return {"language": row.language, "domain": row.domain, "draft": row.draft, **row.counts.as_dict()}


def merge_rows(*groups: Iterable[LiveRow]) -> dict[tuple[str, str, str], LiveRow]:
    out: dict[tuple[str, str, str], LiveRow] = {}
    for rows in groups:
        for row in rows:
            old = out.get(row.key)
            out[row.key] = row if old is None else replace(old, counts=old.counts + row.counts)
    return out

class _Held:
    """The registry's updates not yet applied to prometheus_client: the hot path adds to plain Python numbers
    (no lock, no label validation) and `Metrics.registry` applies them when it is collected (a /metrics
    scrape), so a request pays a few additions instead of one locked update per metric.

    Everything runs on the event loop (requests and the async /metrics route alike), so no lock is needed.
    """

    def __init__(self) -> None:
        self.queued: list[Any] = []

    def apply(self) -> None:
        queued, self.queued = self.queued, []
        for item in queued:
            item.apply()


class _HeldChild:
    """One prometheus child series whose updates wait in `_Held` until the next collect."""

    __slots__ = ("_child", "_held", "_queued")

    def __init__(self, child: Any, held: _Held) -> None:
        self._child, self._held, self._queued = child, held, False

    def _mark(self) -> None:
        """Queue this series for the next collect, once however many updates come before it."""
        if not self._queued:
            self._queued = True
            self._held.queued.append(self)

    def apply(self) -> None:
        raise NotImplementedError


class _HeldCounter(_HeldChild):
    """``inc`` of a prometheus Counter child, summed until the next collect."""

    __slots__ = ("_amount",)

    def __init__(self, child: Any, held: _Held) -> None:
        super().__init__(child, held)
        self._amount = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:  # prometheus_client's own rule, kept on the caller's path
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._amount += amount
        if not self._queued:  # `_mark`, inline: several updates per request
            self._queued = True
            self._held.queued.append(self)

    def apply(self) -> None:
        amount, self._amount, self._queued = self._amount, 0.0, False
        if amount:
            self._child.inc(amount)


class _HeldHistogram(_HeldChild):
    """``observe`` of a prometheus Histogram child, counted per bucket until the next collect (a bisect
    instead of a locked scan of the buckets per observation).

    prometheus_client has no public call that adds n observations to one bucket, so this reads the child's
    ``_upper_bounds`` and adds to its ``_sum`` and ``_buckets`` values, as ``Histogram.observe`` does: the
    version is pinned exactly (pyproject.toml), and tests/router/test_private_apis.py fails on one that
    changes these attributes."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, child: Any, held: _Held) -> None:
        super().__init__(child, held)
        self._bounds = list(child._upper_bounds)  # ends with +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        self._sum += amount
        if amount == amount:  # NaN falls in no bucket, as in prometheus_client (it only adds to the sum)
            self._counts[bisect_left(self._bounds, amount)] += 1
        if not self._queued:  # `_mark`, inline
            self._queued = True
            self._held.queued.append(self)

    def apply(self) -> None:
        counts, total = self._counts, self._sum
        self._counts, self._sum, self._queued = [0] * len(self._bounds), 0.0, False
        child = self._child
        child._sum.inc(total)  # what Histogram.observe does, per bucket instead of per observation
        for bucket, n in zip(child._buckets, counts):
            if n:
                bucket.inc(n)


class _HeldGauge(_HeldChild):
    """``set`` of a prometheus Gauge child: the last value set before the next collect."""

    __slots__ = ("_value",)

    def __init__(self, child: Any, held: _Held) -> None:
        super().__init__(child, held)
        self._value = 0.0

    def set(self, value: float) -> None:
        self._value = float(value)
        self._mark()

    def apply(self) -> None:
        self._queued = False
        self._child.set(self._value)


_HELD_KINDS: dict[type, type[_HeldChild]] = {PCounter: _HeldCounter, Histogram: _HeldHistogram, Gauge: _HeldGauge}


def _held(child: Any, metric: PCounter | Histogram | Gauge, held: _Held) -> Any:
    return _HELD_KINDS[type(metric)](child, held)


class _Labelled:
    """``metric.labels(*values)``, memoised and held (`_Held`): prometheus_client validates the values and
    takes a lock on every labels() call and every update, which the hot path would otherwise pay several
    times per request. The child series is created at the first call, as labels() would."""

    def __init__(self, metric: Any, held: _Held) -> None:
        self.metric = metric
        self._held = held
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _held(self.metric.labels(*values), self.metric, self._held)
        return child


class KeySeries:
    """The held children one (language, domain, draft) key updates per answered request, each looked up
    (`_Labelled`) at its first update and kept: a request pays one dict lookup for them all, not one
    labels() lookup per metric. Children are created as the labels() calls would create them, no sooner,
    so /metrics shows the same series."""

    __slots__ = ("completion_tokens", "spec_steps", "draft_tokens", "accepted", "accepted_pos", "route_choices",
                 "request_tps")

    def __init__(self) -> None:
        self.completion_tokens: Any = None
        self.spec_steps: Any = None
        self.draft_tokens: Any = None
        self.accepted: Any = None
        self.accepted_pos: list[Any] = []  # per position, as far as reports have gone
        self.route_choices: dict[str, Any] = {}  # reason -> child
        self.request_tps: Any = None


class _Registry(CollectorRegistry):
    """A registry that applies the held updates (`_Held`) before every collect: /metrics, and any reader
    of the registry, sees every request counted so far."""

    def __init__(self, held: _Held) -> None:
        super().__init__()
        self.held = held

    def collect(self) -> Iterator[Any]:
        self.held.apply()
        yield from super().collect()


class Metrics:
    """Prometheus metrics on a registry of their own (one per app, so tests can build several)."""

    def __init__(self) -> None:
        self.held = _Held()
        self.registry = _Registry(self.held)
        r = self.registry
        lab = ["language", "domain", "draft"]
        self.requests = PCounter("polyspec_requests", "Requests by outcome.",
                                 ["endpoint", "language", "domain", "backend", "status"], registry=r)
        self.confidence_metric = Histogram("polyspec_langid_confidence", "fastText langid confidence of routed prompts.",
                                           buckets=CONFIDENCE_BUCKETS, registry=r)
        self.latency = Histogram("polyspec_request_latency_seconds", "Request latency through the router.",
                                 ["endpoint", "stream"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram("polyspec_time_to_first_byte_seconds", "Time to the first upstream body byte.",
                              ["endpoint", "stream"], buckets=LATENCY_BUCKETS, registry=r)
        self.spec_steps = PCounter("polyspec_spec_steps", "Speculative verify steps.", lab, registry=r)
        self.draft_tokens = PCounter("polyspec_spec_draft_tokens", "Proposed draft tokens.", lab, registry=r)
        self.accepted = PCounter("polyspec_spec_accepted_tokens", "Accepted draft tokens.", lab, registry=r)
        self.accepted_pos = PCounter("polyspec_spec_accepted_per_position",
                                     "Verify steps accepting at least position+1 drafts.", lab + ["position"], registry=r)
        self.completion_tokens = PCounter("polyspec_completion_tokens", "Generated tokens.", lab, registry=r)
        self.upstream_errors = PCounter("polyspec_upstream_errors", "Failed upstream attempts.",
                                        ["backend", "reason"], registry=r)
        self.backend_up = Gauge("polyspec_backend_up", "1 when the replica is marked healthy.", ["backend"], registry=r)
        self.in_flight = Gauge("polyspec_backend_in_flight", "Requests in flight per replica.", ["backend"], registry=r)
        # What the router did about faults (docs/operations.md lists what each one means to an operator).
        self.refresh_failures = PCounter("polyspec_registry_refresh_failures",
                                         "Routing-table refreshes that failed or were refused.", ["reason"], registry=r)
        self.table_stale = Gauge("polyspec_routing_table_stale",
                                 "1 while the router serves a last good table the registry no longer gives.", registry=r)
        self.ready = Gauge("polyspec_ready", "1 when /ready answers 200.", registry=r)
        self.draining = Gauge("polyspec_draining", "1 after SIGTERM, while in-flight requests finish.", registry=r)
        self.captured = PCounter("polyspec_capture_written", "Prompts written by capture.", registry=r)
        self.capture_dropped = PCounter("polyspec_capture_dropped", "Prompts capture dropped, by reason.",
                                        ["reason"], registry=r)
        self.rejected = PCounter("polyspec_rejected_requests",
                                 "Requests refused before routing (bad body, bad pin, too large, too slow).",
                                 ["reason"], registry=r)
        # The speed policy (router.decision.speed): what it chose and why, what it predicted, what requests got.
        self.route_choices = PCounter("polyspec_route_choices",
                                      "Answered requests by language, answering draft and why that pool answered "
                                      "(fastest, explore, fallback, no_speed_model, mal_policy).",
                                      ["language", "draft", "reason"], registry=r)
        self.predicted_tps = Gauge("polyspec_predicted_tokens_per_second",
                                   "The speed model's latest prediction for one stream, by language and draft.",
                                   ["language", "draft"], registry=r)
        self.request_tps = Histogram("polyspec_request_tokens_per_second",
                                     "Observed completion tokens per second of answered requests (engine wall time).",
                                     ["language", "draft"], buckets=TPS_BUCKETS, registry=r)
        # Memoised, held children of the metrics the hot path updates (`_Labelled`).
        h = self.held
        self.confidence = _HeldHistogram(self.confidence_metric, h)
        self.requests_of = _Labelled(self.requests, h)
        self.latency_of = _Labelled(self.latency, h)
        self.ttfb_of = _Labelled(self.ttfb, h)
        self.spec_steps_of = _Labelled(self.spec_steps, h)
        self.draft_tokens_of = _Labelled(self.draft_tokens, h)
        self.accepted_of = _Labelled(self.accepted, h)
        self.accepted_pos_of = _Labelled(self.accepted_pos, h)
        self.completion_tokens_of = _Labelled(self.completion_tokens, h)
        self.upstream_errors_of = _Labelled(self.upstream_errors, h)
        self.route_choices_of = _Labelled(self.route_choices, h)
        self.predicted_tps_of = _Labelled(self.predicted_tps, h)
        self.request_tps_of = _Labelled(self.request_tps, h)
        self._series: dict[tuple[str, str, str], KeySeries] = {}

    def series_of(self, key: tuple[str, str, str]) -> KeySeries:
        """The `KeySeries` of (language, domain, draft): bounded labels, as the metrics' own."""
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = KeySeries()
        return series


Key = tuple[str, str, str]
_MAX_PREDICTED = 4096  # (language, draft) pairs kept for the dashboard


class Telemetry:
    """Counters of one router. Languages here are the *stats* language of a request (``und`` when langid
    was not sure), which may differ from the language it was routed under."""

    def __init__(self, router_id: str) -> None:
        self.router_id = router_id
        self.started_at = time.time()
        self.metrics = Metrics()
        self.cumulative: dict[Key, SpecCounts] = {}
        self.pending: dict[Key, SpecCounts] = {}
        self.shared: dict[Key, LiveRow] = {}  # all routers, from the registry (set with set_shared)
        # shared + pending, what the policy blends; kept up to date per request instead of being merged
        # from scratch per request. None: rebuild on next read.
        self._live: dict[Key, SpecCounts] | None = None
        self.traffic: Counter[tuple[str, str]] = Counter()
        self.statuses: Counter[str] = Counter()
        self.confidence_counts = [0] * len(CONFIDENCE_BUCKETS)
        self.flushed_at: float | None = None
        # The speed model's latest prediction per (stats language, draft), for the dashboard's predicted vs
        # observed columns (the Prometheus gauge holds the same figure). Bounded as the metric labels are.
        self.predicted: dict[tuple[str, str], float] = {}

    def observe_decision(self, language: str, domain: str, confidence: float, source: str) -> None:
        self.traffic[(language, domain)] += 1
        if source in ("langid", "fallback"):
            self.metrics.confidence.observe(confidence)
            # the first bucket whose upper bound holds the confidence; none above 1.0, nor for NaN
            i = bisect_left(CONFIDENCE_BUCKETS, confidence)
            if i < len(CONFIDENCE_BUCKETS) and confidence == confidence:
                self.confidence_counts[i] += 1

    def observe_result(self, endpoint: str, language: str, domain: str, backend: str, status: str) -> None:
        self.statuses[status] += 1
        self.metrics.requests_of(endpoint, language, domain, backend, status).inc()

    def observe_prediction(self, language: str, draft: str, tps: float) -> None:
        """The predicted tokens/s of the pool that answered a request of ``language`` (its draft's name)."""
        self.metrics.predicted_tps_of(language, draft).set(tps)
        if len(self.predicted) >= _MAX_PREDICTED and (language, draft) not in self.predicted:
            self.predicted.clear()  # the labels are bounded already; this only caps a pathological table
        self.predicted[(language, draft)] = tps

    def observe_acceptance(self, key: Key, spec: Mapping[str, Any] | None, completion_tokens: int,
                           generation_s: float = 0.0) -> SpecCounts:
        """Add one answered request; returns its counts (``generation_s``: its wall time at the engine)."""
        counts = SpecCounts.from_vllm_metrics(spec, completion_tokens, generation_s)
        stores = [self.cumulative, self.pending] if self._live is None else [self.cumulative, self.pending, self._live]
        for store in stores:
            old = store.get(key)
            store[key] = counts if old is None else old + counts
        m = self.metrics
        series = m.series_of(key)
        if series.completion_tokens is None:
            series.completion_tokens = m.completion_tokens_of(*key)
        series.completion_tokens.inc(completion_tokens)
        if not spec:
            return counts
        if series.spec_steps is None:
            series.spec_steps, series.draft_tokens, series.accepted = (
                m.spec_steps_of(*key), m.draft_tokens_of(*key), m.accepted_of(*key))
        series.spec_steps.inc(counts.num_spec_steps)
        series.draft_tokens.inc(counts.num_draft_tokens)
        series.accepted.inc(counts.num_accepted_tokens)
        per_pos = series.accepted_pos
        for pos, n in enumerate(counts.accepted_per_pos):
            if pos == len(per_pos):
                per_pos.append(m.accepted_pos_of(*key, str(pos)))
            per_pos[pos].inc(n)
        return counts

    def set_shared(self, rows: dict[Key, LiveRow]) -> None:
        self.shared = rows
        self._live = None

    def take_pending(self) -> list[LiveRow]:
        rows = [LiveRow(*key, counts) for key, counts in self.pending.items()]
        self.pending = {}
        self._live = None
        return rows

    def restore_pending(self, rows: list[LiveRow]) -> None:
        """A flush failed: put its deltas back so the next flush carries them."""
        merged = merge_rows(rows, (LiveRow(*k, c) for k, c in self.pending.items()))
        self.pending = {key: row.counts for key, row in merged.items()}
        self._live = None

    def live_lookup(self) -> Mapping[Key, SpecCounts]:
        """What the policy blends: the registry's totals (all routers) plus this router's unflushed deltas.

        Read-only for callers: the mapping is the router's own, updated in place as requests finish.
        """
        if self._live is None:
            merged = merge_rows(self.shared.values(), (LiveRow(*k, c) for k, c in self.pending.items()))
            self._live = {key: row.counts for key, row in merged.items()}
        return self._live

    def local_rows(self) -> list[LiveRow]:
        return [LiveRow(*key, counts) for key, counts in sorted(self.cumulative.items())]

    def snapshot_dict(self, table: Any, backends: Any) -> dict[str, Any]:
        total = sum(self.traffic.values())
        return {
            "router_id": self.router_id,
            "started_at": self.started_at,
            "flushed_at": self.flushed_at,
            "aggregates": [acceptance_summary(r) for r in self.local_rows()],
            "shared_aggregates": [acceptance_summary(LiveRow(*k, c)) for k, c in sorted(self.live_lookup().items())],
            "traffic": [
                {"language": lang, "domain": dom, "requests": n, "share": n / total if total else 0.0}
                for (lang, dom), n in self.traffic.most_common()
            ],
            "statuses": dict(self.statuses),
            "langid_confidence": {"buckets": list(CONFIDENCE_BUCKETS), "counts": list(self.confidence_counts)},
            "predicted_tps": [{"language": lang, "draft": draft, "tps": tps}
                              for (lang, draft), tps in sorted(self.predicted.items())],
            "backends": backends.describe() if backends is not None else [],
            "routing_table": table.describe() if table is not None else [],
        }


def snapshot(app_or_runtime: Any) -> dict[str, Any]:
    """The dashboard's view of a running router (pass the FastAPI app or its RouterRuntime)."""
    runtime = getattr(getattr(app_or_runtime, "state", None), "runtime", app_or_runtime)
    return runtime.snapshot()
