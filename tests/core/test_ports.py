"""core.ports: a port for a server that binds it later, out of the kernel's reach."""

from __future__ import annotations

import socket

from polyspec.core import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_free() -> None:
    low = ports.ephemeral_low()
    picked = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < low for p in picked)
    assert len(picked) > 1  # drawn at random: parallel callers rarely meet
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when returned


def test_a_taken_port_is_never_returned(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)  # a draw of two ports, one held
        monkeypatch.setattr(ports, "ephemeral_low", lambda: taken + 2)  # draws: taken or taken + 1
        port = ports.free_port(attempts=5)
        assert port != taken


def test_an_unreadable_range_falls_back_to_linux_default(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(ports, "RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_low() == ports.DEFAULT_EPHEMERAL_LOW
    (tmp_path / "garbage").write_text("not numbers")
    monkeypatch.setattr(ports, "RANGE_FILE", tmp_path / "garbage")
    assert ports.ephemeral_low() == ports.DEFAULT_EPHEMERAL_LOW
