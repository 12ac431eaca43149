"""The OpenAI-compatible router app: ``create_app(config)`` builds it; `polyspec serve` runs it with uvicorn.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /health (alive),
/ready (some replica healthy), /metrics (Prometheus). The runtime lives on ``app.state.runtime``;
``refresh_routing_table(app)`` is what POST /admin/api/refresh calls.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from polyspec.router import admin
from polyspec.router.asgi import HOT_PATHS, Endpoint, HotPath
from polyspec.router.config import RouterConfig
from polyspec.router.errors import RouterError, error_body
from polyspec.router.proxy import serve_completion
from polyspec.router.runtime import RouterRuntime
from polyspec.router.table import TableSource


def create_app(
    config: RouterConfig | None = None,
    *,
    source: TableSource | None = None,
    mount_admin: bool = True,
) -> FastAPI:
    """Build the router. ``source`` defaults to the registry at ``config.registry_url``."""
    config = config or RouterConfig()
    runtime = RouterRuntime(config, source=source)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="polyspec router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.runtime = runtime
    _install_error_handlers(app)
    _install_routes(app, runtime)
    if mount_admin:
        admin.mount(app, runtime)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RouterError)
    async def _router_error(_: Request, exc: RouterError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        # Keep the exception's headers: a 401 must still carry WWW-Authenticate.
        return JSONResponse(error_body(str(exc.detail), kind, None, code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


def _install_routes(app: FastAPI, runtime: RouterRuntime) -> None:
    handler = partial(serve_completion, runtime)
    # The completion endpoints are plain ASGI: HotPath takes them before FastAPI's layers; the routes
    # are there for what HotPath passes on (another method gets 405, as for any route).
    app.add_middleware(HotPath, handler=handler)
    for path, kind in HOT_PATHS.items():
        app.router.routes.append(Route(path, Endpoint(handler, kind), methods=["POST"]))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(runtime.telemetry.started_at)
        data = [{"id": m, "object": "model", "created": created, "owned_by": "polyspec"} for m in runtime.known_models()]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": round(time.time() - runtime.telemetry.started_at, 3)}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        ok = runtime.ready()
        body = {"ready": ok, "pools": len(runtime.table.pools),
                "healthy_replicas": sum(1 for s in runtime.backends.replicas.values() if s.healthy),
                "last_refresh_error": runtime.last_refresh_error}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        runtime.update_gauges()
        return Response(generate_latest(runtime.telemetry.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def refresh_routing_table(app: FastAPI) -> dict[str, Any]:
    """Reload the routing table from the registry now (the admin API's refresh button)."""
    runtime: RouterRuntime = app.state.runtime
    return await runtime.refresh()
