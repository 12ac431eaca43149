"""The serving edge: an OpenAI-compatible router in front of vLLM engines (torch-free).

- ``router.app.create_app(RouterConfig)``: the FastAPI app (`polyspec serve` runs it with uvicorn).
- ``router.config.RouterConfig``: every knob, from ``POLYSPEC_ROUTER_*`` environment variables.
- ``router.classify``: language (fastText langid, pins) and domain of a request.
- ``router.policy``: pool order and replica choice (blend of offline and live acceptance; formula there).
- ``router.backends``: pooled httpx client, in-flight counts, health with hysteresis.
- ``router.proxy``: forwarding, failover before the first byte, SSE pass-through.
- ``router.telemetry``: acceptance aggregates, Prometheus metrics, ``snapshot(app)`` for the dashboard.
"""
