"""The serving edge: an OpenAI-compatible router in front of vLLM engines (torch-free).

- ``router.app.create_app(RouterConfig)``: the FastAPI app (`polyspec serve` runs it with uvicorn).
- ``router.config.RouterConfig``: every knob, from ``POLYSPEC_ROUTER_*`` environment variables.
- ``router.classify``: language (fastText langid, pins) and domain of a request.
- ``router.policy``: pool order and replica choice (blend of offline and live acceptance; formula there).
- ``router.backends``: replicas: in-flight counts, served models, health with hysteresis.
- ``router.upstream``: the aiohttp client to the engines.
- ``router.proxy``: forwarding, failover before the first byte (``router.stream``: SSE pass-through;
  ``router.asgi``: the plain-ASGI plumbing of the completion endpoints; ``router.job``: per-request bookkeeping).
- ``router.telemetry``: acceptance aggregates, Prometheus metrics, ``snapshot(app)`` for the dashboard.
"""
