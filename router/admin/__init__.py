"""The /admin dashboard and its JSON API (/admin/api/...), as one FastAPI APIRouter.

The router app mounts it with ``app.include_router(create_admin_router(sources))``; ``sources`` is
whatever gives the live telemetry, backend health, registry records and the routing-table refresh
(see ``AdminSources``; ``router.admin.sources.AppSources`` adapts the router's runtime; ``mount``
is what ``router.app.create_app`` calls).
Charts are drawn in the browser with the bundled SVG code in static/: no CDN, works offline.
"""

from __future__ import annotations

from polyspec.core.settings import get_settings

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from polyspec.router.admin.sources import AppSources
from polyspec.router.admin.auth import COOKIE_NAME, make_guard, presented_token
from polyspec.router.admin.summary import BackendStatus, RegistryData, build_summary
from polyspec.router.table import LiveRow

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


class AdminSources(Protocol):
    """What the dashboard reads. Every method is cheap: counters in memory, a few registry queries."""

    router_id: str
    threshold: float | None

    def live_counters(self) -> list[LiveRow]: ...

    def langid(self) -> tuple[list[float], list[int]]: ...  # bin edges, counts per bin

    def traffic(self) -> dict[str, int] | None: ...  # routed requests per language

    def backend_statuses(self) -> list[BackendStatus]: ...

    def registry_data(self) -> RegistryData: ...

    async def refresh(self) -> dict[str, Any]: ...


def _settings_token() -> str | None:
    return get_settings().admin_token


def _templates() -> Any:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))


def summary_of(sources: AdminSources, registry: RegistryData | None = None) -> dict[str, Any]:
    edges, counts = sources.langid()
    return build_summary(
        router_id=sources.router_id,
        live=sources.live_counters(),
        langid_counts=counts,
        langid_edges=edges,
        traffic=sources.traffic(),
        backends=sources.backend_statuses(),
        registry=registry if registry is not None else sources.registry_data(),
        threshold=sources.threshold,
    )


def create_admin_router(
    sources: AdminSources | Callable[[Request], AdminSources],
    *,
    token_getter: Callable[[], str | None] = _settings_token,
    interval_s: float = 5.0,
    prefix: str = "/admin",
) -> APIRouter:
    """``sources`` may be an AdminSources or a function of the request returning one (e.g. from app.state)."""
    guard = make_guard(token_getter)
    api = APIRouter(prefix=prefix, include_in_schema=False)
    env = _templates()

    def resolve(request: Request) -> AdminSources:
        if hasattr(sources, "live_counters"):
            return sources  # type: ignore[return-value]
        return sources(request)  # type: ignore[operator]

    @api.get("", response_class=HTMLResponse, dependencies=[Depends(guard)])
    @api.get("/", response_class=HTMLResponse, dependencies=[Depends(guard)])
    def dashboard(request: Request) -> HTMLResponse:
        html = env.get_template("dashboard.html").render(
            router_id=resolve(request).router_id, api_base=f"{prefix}/api", static_base=f"{prefix}/static",
            interval_ms=int(interval_s * 1000),
        )
        response = HTMLResponse(html)
        if request.query_params.get("token") and token_getter():
            # The guard already checked it: keep it in a cookie so the page's fetches carry it.
            response.set_cookie(COOKIE_NAME, presented_token(request) or "", httponly=True, samesite="strict", path=prefix)
        return response

    @api.get("/api/summary", dependencies=[Depends(guard)])
    async def summary(request: Request) -> JSONResponse:
        src = resolve(request)
        # Registry reads block (SQLAlchemy): run them in a thread. Telemetry is read here, on the event
        # loop that updates it, so the counters are never read half-written.
        registry = await asyncio.to_thread(src.registry_data)
        body = summary_of(src, registry)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    @api.get("/api/backends", dependencies=[Depends(guard)])
    def backends(request: Request) -> list[dict[str, Any]]:
        return [vars(b) | {"languages": list(b.languages)} for b in resolve(request).backend_statuses()]

    @api.post("/api/refresh", dependencies=[Depends(guard)])
    async def refresh(request: Request) -> dict[str, Any]:
        try:
            return await resolve(request).refresh()
        except Exception as exc:  # the registry may be unreachable: say so rather than 500
            raise HTTPException(503, f"routing table refresh failed: {exc}") from exc

    @api.get("/static/{name}")
    def static(name: str) -> FileResponse:
        path = (STATIC_DIR / name).resolve()
        if path.parent != STATIC_DIR or not path.is_file() or path.suffix not in _STATIC_TYPES:
            raise HTTPException(404, "not found")
        return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})

    return api


def mount(app: Any, runtime: Any) -> None:
    """Called by ``router.app.create_app``: serve /admin from this app's runtime and the registry."""
    app.include_router(create_admin_router(lambda request: AppSources(app, runtime)))
