"""The serving edge: an OpenAI-compatible router in front of vLLM engines (torch-free).

- ``router.app.create_app(RouterConfig)``: the FastAPI app (`polyspec serve` runs it with uvicorn).
- ``router.config.RouterConfig``: every knob, from ``POLYSPEC_ROUTER_*`` environment variables.
- ``router.edge.body``: request bodies decoded top level only, at a bounded cost; re-encoded for the engine.
- ``router.decision.classify``: language (fastText langid, normalised pins) and domain of a request.
- ``router.decision.routing``: the whole routing decision of one body (``route``), shared by the proxy and
  `polyspec route explain` (``router.explain``).
- ``router.decision.policy``: pool order and replica choice (blend of offline and live acceptance; formula there).
- ``router.engine.backends``: replicas: in-flight counts, served models, health with hysteresis.
- ``router.engine.upstream``, ``router.engine.engine_http``: the HTTP client to the engines.
- ``router.engine.proxy``: forwarding, failover before the first byte (``router.engine.stream``: SSE pass-through;
  ``router.edge.asgi``: the plain-ASGI plumbing of the completion endpoints; ``router.engine.job``: per-request
  bookkeeping).
- ``router.edge.server``: uvicorn with a SIGTERM drain and request-head limits (what `polyspec serve` runs).
- ``router.capture``: opt-in prompt capture, off the request path, with caps and rotation.
- ``router.telemetry``: acceptance aggregates, Prometheus metrics, ``snapshot(app)`` for the dashboard.
"""
