"""The /admin dashboard and its JSON API (/admin/api/...), as one FastAPI APIRouter.

The router app mounts it with ``app.include_router(create_admin_router(sources))``; ``sources`` is
whatever gives the live telemetry, backend health, registry records and the routing-table refresh
(see ``AdminSources``; ``router.admin.sources.AppSources`` adapts the router's runtime; ``mount``
is what ``router.app.create_app`` calls).
Charts are drawn in the browser with the bundled SVG code in static/: no CDN, works offline.
"""

from __future__ import annotations

from polyspec.core.settings import get_settings

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from polyspec.router.admin.auth import (
    COOKIE_NAME, CSRF_COOKIE, AdminAccess, csrf_token, make_guard, make_host_guard, presented_token,
)
from polyspec.router.admin.sources import AppSources
from polyspec.router.admin.summary import BackendStatus, RegistryData, build_summary
from polyspec.router.table import LiveRow

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The assets by name, listed once: a request's name is only ever a key here, never a path handed to the
# filesystem (NUL bytes, "..", over-long or undecodable names are simply not keys: 404).
STATIC_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in _STATIC_TYPES and p.is_file()}
REGISTRY_TIMEOUT_S = 2.0  # the summary's wait for the registry; the page polls every 5 s


class AdminSources(Protocol):
    """What the dashboard reads. Telemetry reads are cheap counters in memory; the registry may hang, so
    its read is awaited with a bound, and so is the refresh."""

    router_id: str
    threshold: float | None

    def live_counters(self) -> list[LiveRow]: ...

    def langid(self) -> tuple[list[float], list[int]]: ...  # bin edges, counts per bin

    def traffic(self) -> dict[str, int] | None: ...  # routed requests per language

    def predictions(self) -> dict[tuple[str, str], float]: ...  # (language, draft) -> latest predicted tokens/s

    def backend_statuses(self) -> list[BackendStatus]: ...

    async def registry_data(self, timeout_s: float) -> RegistryData: ...  # an error after timeout_s

    async def refresh(self, timeout_s: float | None = None) -> dict[str, Any]: ...  # raises after timeout_s


def _settings_token() -> str | None:
    return get_settings().admin_token


def _templates() -> Any:
    return Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))


def summary_of(sources: AdminSources, registry: RegistryData) -> dict[str, Any]:
    edges, counts = sources.langid()
    return build_summary(
        router_id=sources.router_id,
        live=sources.live_counters(),
        langid_counts=counts,
        langid_edges=edges,
        traffic=sources.traffic(),
        predicted=sources.predictions(),
        backends=sources.backend_statuses(),
        registry=registry,
        threshold=sources.threshold,
    )


def _page(request: Request, html: str, *, csrf: str, prefix: str, keep_token: bool) -> HTMLResponse:
    response = HTMLResponse(html, headers={"Cache-Control": "no-store"})
    secure = request.url.scheme == "https"
    # Double-submit CSRF token: the page carries it (data-csrf) for its script to echo in X-CSRF-Token; a
    # cross-site page can neither read it nor make the browser send the cookie (SameSite=Strict).
    response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=prefix, secure=secure)
    if keep_token:
        # The guard already checked it: keep it in a cookie so the page's fetches carry it.
        response.set_cookie(COOKIE_NAME, presented_token(request) or "", httponly=True, samesite="strict",
                            path=prefix, secure=secure)
    return response


def create_admin_router(
    sources: AdminSources | Callable[[Request], AdminSources],
    *,
    access: AdminAccess | Any = None,
    token_getter: Callable[[], str | None] = _settings_token,
    interval_s: float = 5.0,
    prefix: str = "/admin",
    registry_timeout_s: float = REGISTRY_TIMEOUT_S,
    refresh_timeout_s: float | None = None,
    on_reject: Callable[[str], None] = lambda reason: None,
) -> APIRouter:
    """``sources`` may be an AdminSources or a function of the request returning one (e.g. from app.state).

    ``access``: an AdminAccess, or a RouterConfig-like object to build one from (trusted_proxies,
    admin_allowed_hosts, host); default: no proxies, the loopback names. ``refresh_timeout_s``: longest wait
    for a refresh (None: the runtime's own bound). ``on_reject(reason)`` is told each refusal.
    """
    if not isinstance(access, AdminAccess):
        access = AdminAccess() if access is None else AdminAccess.from_config(access)
    guard = Depends(make_guard(token_getter, access, on_reject))
    host_only = Depends(make_host_guard(access, on_reject))
    api = APIRouter(prefix=prefix, include_in_schema=False)
    env = _templates()

    def resolve(request: Request) -> AdminSources:
        if hasattr(sources, "live_counters"):
            return sources  # type: ignore[return-value]
        return sources(request)

    @api.get("", response_class=HTMLResponse, dependencies=[guard])
    @api.get("/", response_class=HTMLResponse, dependencies=[guard])
    async def dashboard(request: Request) -> HTMLResponse:
        csrf = csrf_token(request)
        html = env.get_template("dashboard.html").render(
            router_id=resolve(request).router_id, api_base=f"{prefix}/api", static_base=f"{prefix}/static",
            interval_ms=int(interval_s * 1000), csrf_token=csrf,
        )
        keep_token = bool(request.query_params.get("token") and token_getter())
        return _page(request, html, csrf=csrf, prefix=prefix, keep_token=keep_token)

    @api.get("/api/summary", dependencies=[guard])
    async def summary(request: Request) -> JSONResponse:
        src = resolve(request)
        # The registry read runs in its own thread with a bound (see sources.py). Telemetry is read here, on
        # the event loop that updates it, so the counters are never read half-written.
        registry = await src.registry_data(registry_timeout_s)
        body = summary_of(src, registry)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    @api.get("/api/backends", dependencies=[guard])
    async def backends(request: Request) -> list[dict[str, Any]]:
        return [vars(b) | {"languages": list(b.languages)} for b in resolve(request).backend_statuses()]

    @api.post("/api/refresh", dependencies=[guard])
    async def refresh(request: Request) -> dict[str, Any]:
        try:
            return await resolve(request).refresh(refresh_timeout_s)
        except Exception as exc:  # the registry may be unreachable or hung: say so rather than 500
            raise HTTPException(503, f"routing table refresh failed: {exc}") from exc

    @api.get("/static/{name}", dependencies=[host_only])
    async def static(name: str) -> FileResponse:
        path = STATIC_FILES.get(name)
        if path is None:
            raise HTTPException(404, "not found")
        return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})

    return api


def mount(app: Any, runtime: Any, **options: Any) -> None:
    """Called by ``router.app.create_app``: serve /admin from this app's runtime and the registry, with the
    runtime's config for the network rules; ``options`` go to create_admin_router (tests shorten bounds)."""
    rejected = runtime.telemetry.metrics.rejected

    def on_reject(reason: str) -> None:
        rejected.labels(reason=reason).inc()

    app.include_router(create_admin_router(lambda request: AppSources(app, runtime), access=runtime.config,
                                           on_reject=on_reject, **options))
