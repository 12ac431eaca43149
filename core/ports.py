"""A free local TCP port for a server that another process will bind a moment later.

The kernel's own pick (bind to port 0) comes from its ephemeral range, the range it also hands to every outgoing
connection and to sockets such as vLLM's ZMQ ones: between the pick and the server's bind, such a socket can take
the port, and the server fails with EADDRINUSE (a fleet test lost its router port this way, while its engine
started). Ports are therefore drawn below the ephemeral range, where the kernel never assigns one on its own.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: well-known and registered services more often listen
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default when the range cannot be read


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port that is free on ``host`` now, below the ephemeral range when there is room; else the kernel's pick."""
    high = ephemeral_low() - 1
    if high > LOWEST:
        for _ in range(attempts):
            port = random.randint(LOWEST, high)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
