"""The ports `kuberl run` and the tests give their servers: free, and outside the kernel's ephemeral range, where
an outgoing connection or a port-0 listener (vLLM's own sockets) would take one before its server binds it."""

from __future__ import annotations

import socket

from kuberl_sandbox import local
from kuberl_sandbox.local import _first_ephemeral_port, free_port


def test_a_free_port_is_free_and_below_the_ephemeral_range():
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < _first_ephemeral_port() for p in ports)
    assert len(ports) > 1  # drawn, not the same one each time
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        draws = iter([port - local.LOWEST_LISTEN_PORT, port + 1 - local.LOWEST_LISTEN_PORT])
        monkeypatch.setattr(local.secrets, "randbelow", lambda _: next(draws))
        assert free_port() == port + 1  # the first draw is in use
