"""Loopback ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port free right now (a server under test binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepting(port: int) -> bool:
    """Whether something accepts connections on loopback ``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
