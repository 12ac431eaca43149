"""Who may use /admin, from where, and how a state-changing call proves it was meant.

Checked in this order, for every /admin request:

1. Host (DNS rebinding): the Host header, port stripped, must be one of ``admin_allowed_hosts`` or the
   router's own ``host`` (unless that is 0.0.0.0 / ::), or the list holds "*". Else 400. A page on
   attacker.example whose name was re-pointed at 127.0.0.1 sends ``Host: attacker.example``.
2. Who: with ``POLYSPEC_ADMIN_TOKEN`` set, the token (``Authorization: Bearer``, ``?token=`` once in
   the browser, then an HttpOnly cookie); else 401. Without a token, loopback clients only; else 403.
   A proxy on the same host makes every client look local, so without a token a client is local only when
   no proxy is declared (``trusted_proxies``) and the request carries no forwarding header
   (X-Forwarded-For, Forwarded, ...): a forwarded address is never trusted as loopback. `unsafe_admin`
   says when a router must not start at all without a token (behind a proxy, or listening beyond loopback).
3. State-changing calls (any method but GET/HEAD/OPTIONS) take an ``application/json`` body, else 415 (a
   cross-site form or no-cors fetch can only send text/plain, urlencoded or multipart), and need the admin
   token in the Authorization header, or the CSRF token: the dashboard sets a random ``polyspec_csrf``
   cookie (SameSite=Strict) and its script echoes the value in ``X-CSRF-Token``. Else 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, Request

COOKIE_NAME = "polyspec_admin"
CSRF_COOKIE = "polyspec_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
# Headers that say a proxy passed the request on: with any of them, the request is not a local client's.
FORWARDING_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host", "via")
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
_PORT = re.compile(r"[0-9]{1,5}")
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _bracketed(value: str) -> str | None:
    """The address inside ``[v6]`` or ``[v6]:port``; None when the rest is not a port."""
    end = value.find("]")
    rest = value[end + 1:] if end > 0 else "x"
    if rest and not (rest[0] == ":" and _PORT.fullmatch(rest[1:])):
        return None
    return value[1:end]


def parse_address(value: str) -> IPAddress | None:
    """An IP address as a socket or a proxy writes it (``1.2.3.4``, ``1.2.3.4:80``, ``::1``, ``[::1]:80``);
    None for anything else. IPv4-mapped IPv6 (a dual-stack socket's view of an IPv4 peer) becomes IPv4."""
    value = value.strip()
    if value.startswith("["):
        inside = _bracketed(value)
        if inside is None:
            return None
        value = inside
    elif value.count(":") == 1:
        value, _, port = value.partition(":")
        if not _PORT.fullmatch(port):
            return None
    try:
        ip = ipaddress.ip_address(value.split("%", 1)[0])  # an IPv6 zone ("%eth0") names no other host
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def host_name(value: str | None) -> str | None:
    """The host of a Host header (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), lower-cased, an IP address
    in its canonical form; None when malformed (a bare IPv6 address is not a valid Host)."""
    value = (value or "").strip().lower()
    if value.startswith("["):
        value = _bracketed(value) or ""
        try:
            return str(ipaddress.IPv6Address(value))
        except ValueError:
            return None
    if value.count(":") > 1:
        return None
    value, _, port = value.partition(":")
    if port and not _PORT.fullmatch(port):
        return None
    value = value[:-1] if value.endswith(".") else value  # "localhost." is localhost
    return value or None


def _canonical(entry: str) -> str:
    entry = entry.strip().lower().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(entry))
    except ValueError:
        return entry.removesuffix(".")


def _network(entry: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError as exc:
        raise ValueError(f"trusted_proxies: {entry!r} is not an IP address or CIDR network") from exc


@dataclass(frozen=True)
class AdminAccess:
    """The admin's network rules (from RouterConfig: trusted_proxies, admin_allowed_hosts, host)."""

    trusted_proxies: tuple[IPNetwork, ...] = ()
    allowed_hosts: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_HOSTS))
    any_host: bool = False

    @classmethod
    def from_config(cls, config: Any) -> AdminAccess:
        """From anything with ``trusted_proxies``, ``admin_allowed_hosts`` and ``host`` (a RouterConfig)."""
        hosts, any_host = host_list(config.admin_allowed_hosts, config.host)
        return cls(tuple(_network(p) for p in config.trusted_proxies), hosts, any_host)

    def is_proxy(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.trusted_proxies)

    def host_allowed(self, header: str | None) -> bool:
        return self.any_host or host_in(header, self.allowed_hosts)

    def loopback_client(self, request: Request) -> bool:
        """Whether a request without a token may use the admin: its socket peer is loopback, no proxy is
        declared (a proxy on this host makes every client look local) and the request names no forwarded
        client (`FORWARDING_HEADERS`: a proxy sent it; the address it names is never loopback's trust)."""
        if self.trusted_proxies or any(name in request.headers for name in FORWARDING_HEADERS):
            return False
        ip = parse_address(request.client.host) if request.client else None
        return ip is not None and ip.is_loopback

def host_list(entries: Iterable[str], own: str | None) -> tuple[frozenset[str], bool]:
    """(the allowed Host names, canonical, with the router's own listen address unless it is a wildcard;
    whether "*" allows any)."""
    entries = list(entries)
    hosts = {_canonical(h) for h in entries if h.strip() and h.strip() != "*"}
    if _canonical(own or "") not in _WILDCARD_BINDS:
        hosts.add(_canonical(own or ""))
    return frozenset(hosts), "*" in entries


def host_in(header: str | None, hosts: frozenset[str]) -> bool:
    name = host_name(header)
    return name is not None and name in hosts


def is_loopback_bind(host: str | None) -> bool:
    """Whether a listen address reaches only this machine: a loopback address, or ``localhost``."""
    name = _canonical(host or "")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def bearer_token(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def presented_token(request: Request) -> str | None:
    return bearer_token(request) or request.query_params.get("token") or request.cookies.get(COOKIE_NAME)


def csrf_token(request: Request) -> str:
    """The page's CSRF token: the browser's current one if it has a well-formed one (other open tabs keep
    working), else a new random one."""
    current = request.cookies.get(CSRF_COOKIE) or ""
    return current if _CSRF_SHAPE.fullmatch(current) else secrets.token_urlsafe(32)


def _same(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def _check_state_change(request: Request, expected_token: str | None, reject: Callable[[str], None]) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        reject("admin_media_type")
        raise HTTPException(415, "admin calls that change state take an application/json body")
    if expected_token and _same(bearer_token(request), expected_token):
        return  # a header a browser never adds by itself: not a forged cross-site request
    if not _same(request.headers.get(CSRF_HEADER), request.cookies.get(CSRF_COOKIE)):
        reject("admin_csrf")
        raise HTTPException(403, f"CSRF token missing or invalid: send the {CSRF_COOKIE} cookie's value in "
                                 f"{CSRF_HEADER} (the dashboard does), or the admin token as Authorization: Bearer")


def _check_host(request: Request, access: AdminAccess, reject: Callable[[str], None]) -> None:
    if not access.host_allowed(request.headers.get("host")):
        reject("admin_host")
        raise HTTPException(400, "invalid Host header for /admin: add the name to admin_allowed_hosts")


def make_host_guard(access: AdminAccess, reject: Callable[[str], None]) -> Callable[[Request], Awaitable[None]]:
    async def host_guard(request: Request) -> None:  # async: cheap, so it runs on the loop, not in a thread
        _check_host(request, access, reject)

    return host_guard


def _why_not_local(request: Request, access: AdminAccess) -> str:
    if access.trusted_proxies:
        return "; behind a proxy (trusted_proxies is set) the admin always needs the token"
    sent = [name for name in FORWARDING_HEADERS if name in request.headers]
    if sent:
        return f"; this request came through a proxy ({sent[0]}), so it needs the token"
    return ""


def unsafe_admin(config: Any, token: str | None) -> str | None:
    """Why serving the admin with this config and no token would expose it (None when it would not): a
    listen address other clients reach, or a declared proxy, through which every client looks local."""
    if token:
        return None
    if config.trusted_proxies:
        where = f"behind trusted_proxies {config.trusted_proxies} (a proxy makes every client look local)"
    elif not is_loopback_bind(config.host):
        where = f"on {config.host!r}, an address other machines reach"
    else:
        return None
    return (f"refusing to serve /admin {where} without a token. Set one, e.g. "
            "export POLYSPEC_ADMIN_TOKEN=\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\", "
            "and send it as Authorization: Bearer; or serve without the admin (`polyspec serve --no-admin`); "
            "docs/operations.md, The admin surface")


def make_guard(
    token_getter: Callable[[], str | None],
    access: AdminAccess | None = None,
    reject: Callable[[str], None] = lambda reason: None,
) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency enforcing the rules above; the token is read per request so it can rotate.
    ``reject(reason)`` is told each refusal (the router counts them in polyspec_rejected_requests)."""
    access = access or AdminAccess()

    async def guard(request: Request) -> None:
        _check_host(request, access, reject)
        expected = token_getter()
        if expected:
            given = presented_token(request)
            if not _same(given, expected):
                reject("admin_token")
                message = "admin token required" if given is None else "invalid admin token"
                raise HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})
        elif not access.loopback_client(request):
            reject("admin_client")
            raise HTTPException(403, "admin is only served to loopback clients unless POLYSPEC_ADMIN_TOKEN is set"
                                + _why_not_local(request, access))
        if request.method not in SAFE_METHODS:
            _check_state_change(request, expected, reject)

    return guard
