"""The OpenAI-compatible router app: ``create_app(config)`` builds it; `polyspec serve` runs it with uvicorn.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /health (alive),
/ready (some replica healthy), /metrics (Prometheus); the GET routes answer HEAD too, and another method
gets 405 with ``Allow``. With ``cors_allow_origins`` set, browsers of those origins may call the /v1 API
(CORS, Starlette's middleware); /admin, /metrics and the probes never answer another origin. The runtime
lives on ``app.state.runtime``; ``refresh_routing_table(app)`` is what POST /admin/api/refresh calls.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from polyspec.router import admin
from polyspec.router.admin.auth import host_in, host_list, is_loopback_bind
from polyspec.router.edge.asgi import HOT_PATHS, Endpoint, HostGuard, HotPath, Receive, Scope, Send
from polyspec.router.config import RouterConfig
from polyspec.router.errors import RouterError, error_body
from polyspec.router.engine.proxy import serve_completion
from polyspec.router.runtime import RouterRuntime
from polyspec.router.source import TableSource


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

    app = RouterApp(title="polyspec router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.runtime = runtime
    _install_error_handlers(app)
    _install_routes(app, runtime)
    if config.cors_allow_origins:  # in front of HotPath, so outside it; none at all when off (no cost)
        app.front = ApiCors(app.front, origins=config.cors_allow_origins)
    app.state.admin_mounted = mount_admin  # router.edge.server refuses to serve an exposed admin without a token
    if mount_admin:
        admin.mount(app, runtime)
    _guard_hosts(app, runtime)
    return app


class RouterApp(FastAPI):
    """FastAPI with the router's own ASGI layers in ``front`` of its middleware stack: HotPath (the completion
    endpoints), then CORS and the Host guard when they are on, each wrapping the one before. A completion
    reaches its handler without passing FastAPI's and Starlette's layers (their error middleware wraps every
    ``send``, and each layer is one more frame for every resumption of the request's task); any other request
    goes on to them as before. An exception no layer of ``front`` handles reaches the server, which answers
    500 as Starlette's error middleware would have."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.front: Callable[[Scope, Receive, Send], Awaitable[None]] = partial(FastAPI.__call__, self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.front(scope, receive, send)


def _guard_hosts(app: RouterApp, runtime: RouterRuntime) -> None:
    """On a loopback listen address, every route checks Host (router.edge.asgi.HostGuard); added last, so outermost."""
    config = runtime.config
    if not is_loopback_bind(config.host):
        return
    hosts, any_host = host_list(config.allowed_hosts, config.host)
    if any_host:
        return
    rejected = runtime.telemetry.metrics.rejected.labels("host").inc
    app.front = HostGuard(app.front, allowed=partial(host_in, hosts=hosts), reject=rejected,
                          setting="allowed_hosts (POLYSPEC_ROUTER_ALLOWED_HOSTS)")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RouterError)
    async def _router_error(_: Request, exc: RouterError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        # Keep the exception's headers: a 401 must still carry WWW-Authenticate, a 405 its Allow.
        headers = getattr(exc, "headers", None)
        message = str(exc.detail)
        if exc.status_code == 405 and headers and "Allow" in headers:
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}."
        return JSONResponse(error_body(message, kind, None, code), status_code=exc.status_code, headers=headers)


def _install_routes(app: RouterApp, runtime: RouterRuntime) -> None:
    handler = partial(serve_completion, runtime)
    # The completion endpoints are plain ASGI: HotPath takes them before FastAPI's layers; the routes
    # are there for what HotPath passes on (another method gets 405, as for any route).
    app.front = HotPath(app.front, handler=handler)
    for path, kind in HOT_PATHS.items():
        app.router.routes.append(Route(path, Endpoint(handler, kind), methods=["POST"]))

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models() -> dict[str, Any]:
        created = int(runtime.telemetry.started_at)
        data = [{"id": m, "object": "model", "created": created, "owned_by": "polyspec"} for m in runtime.known_models()]
        return {"object": "list", "data": data}

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": round(time.time() - runtime.telemetry.started_at, 3)}

    @app.api_route("/ready", methods=["GET", "HEAD"])
    async def ready() -> JSONResponse:
        body = runtime.readiness()  # {"ready": bool, "reason": str | None, ...}
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        runtime.update_gauges()
        return Response(generate_latest(runtime.telemetry.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# What browsers may call from another origin, when cors_allow_origins is set: the OpenAI API only.
CORS_PATHS = frozenset({*HOT_PATHS, "/v1/models"})
# Headers a browser client may read: the routing decision and the request id.
EXPOSED_HEADERS = ("X-Polyspec-Language", "X-Polyspec-Confidence", "X-Polyspec-Domain", "X-Polyspec-Backend",
                   "X-Polyspec-Draft", "X-Request-Id")


class _OpenAICors(CORSMiddleware):
    """CORSMiddleware whose refused preflight is an OpenAI-style error object, like every other refusal."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        headers = {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}
        message = bytes(response.body).decode() + "."
        return JSONResponse(error_body(message, "invalid_request_error", None, "cors_refused"), status_code=400,
                            headers=headers)


class ApiCors:
    """Starlette's CORSMiddleware on the /v1 API paths only. It wraps HotPath (it is added after it), so a
    preflight is answered before HotPath and a completion's answer, streamed or not, carries the
    Access-Control-* headers. Any request header is allowed (OpenAI's browser SDK sends its own x-stainless-*
    ones); the origin list is the gate. No credentials: the API takes its key in a header, not a cookie.
    /admin is left out on purpose: it trusts loopback clients, which a page of an allowed origin, opened on
    the router's host, would otherwise be."""

    def __init__(self, app: Any, origins: list[str]) -> None:
        self.app = app
        self.cors = _OpenAICors(app, allow_origins=origins, allow_methods=["GET", "POST"], allow_headers=["*"],
                                   expose_headers=EXPOSED_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in CORS_PATHS:
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


async def refresh_routing_table(app: FastAPI) -> dict[str, Any]:
    """Reload the routing table from the registry now (the admin API's refresh button)."""
    runtime: RouterRuntime = app.state.runtime
    return await runtime.refresh()
