"""A real reverse proxy in front of a router for tests: Debian's nginx (`make proxy` installs it), started by
the test itself on a free loopback port, with its files in a private folder.

nginx rather than a Python relay: it is what the docs tell operators to put in front of the router, it
sets (or passes on) X-Forwarded-For and Host the way deployments do, and it is a separate process, as a
proxy on the router's host is. `make test` installs it, so a missing nginx is a failure; only
`make test-fast` (POLYSPEC_SKIP_INTEGRATION=1) may leave it out, and only when it is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from polyspec.core.ports import free_port

# What the proxy does with the client's X-Forwarded-For and Host, as nginx configurations do.
FORWARDING = {
    # The usual configuration: the client's address appended to what the client sent.
    "append": "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n",
    # A pass-through proxy: whatever the client wrote reaches the router as it was.
    "pass": "proxy_set_header X-Forwarded-For $http_x_forwarded_for;\n",
    # A proxy that says nothing of its client, but passes the Host the client used (a public name).
    "none": "proxy_set_header Host $http_host;\n",
}


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found:
        return found
    if os.environ.get("POLYSPEC_SKIP_INTEGRATION") == "1":
        pytest.skip("POLYSPEC_SKIP_INTEGRATION=1: nginx is not installed (`make proxy`)")
    raise RuntimeError("nginx not found: run `make proxy` (Debian's nginx-light)")


@contextmanager
def nginx(upstream_port: int, forwarding: str) -> Iterator[str]:
    """nginx on 127.0.0.1:<free port> proxying to the router at 127.0.0.1:``upstream_port``; yields its URL."""
    binary = nginx_binary()
    root = Path(tempfile.mkdtemp(prefix="polyspec-nginx-"))
    port = free_port()
    temps = "".join(f"{kind}_temp_path {root / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (root / "nginx.conf").write_text(f"""
daemon off;
master_process off;
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    {temps}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream_port};
            proxy_http_version 1.1;
            {FORWARDING[forwarding]}
        }}
    }}
}}
""")
    proc = subprocess.Popen([binary, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited ({proc.returncode}): {proc.stderr.read()}"
                                   f"{(root / 'error.log').read_text() if (root / 'error.log').exists() else ''}")
            try:
                httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not start listening within 20 s") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
