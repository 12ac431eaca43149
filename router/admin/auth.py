"""Who may see /admin.

With ``POLYSPEC_ADMIN_TOKEN`` set, a request needs that token: ``Authorization: Bearer TOKEN``, a
``token`` query parameter (the browser's way in; it is then kept in an HttpOnly cookie) or that cookie.
Without a token, admin answers loopback clients only, so a router bound to 0.0.0.0 does not expose it.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable

from fastapi import HTTPException, Request

COOKIE_NAME = "polyspec_admin"


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query_params.get("token") or request.cookies.get(COOKIE_NAME)


def make_guard(token_getter: Callable[[], str | None]) -> Callable[[Request], None]:
    """A FastAPI dependency enforcing the rules above; the token is read per request so it can rotate."""

    def guard(request: Request) -> None:
        expected = token_getter()
        if expected:
            given = presented_token(request)
            if given is None:
                raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise HTTPException(401, "invalid admin token", headers={"WWW-Authenticate": "Bearer"})
            return
        client = request.client.host if request.client else None
        if not is_loopback(client):
            raise HTTPException(403, "admin is only served to loopback clients unless POLYSPEC_ADMIN_TOKEN is set")

    return guard
