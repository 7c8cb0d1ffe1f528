"""Loopback ports."""

from __future__ import annotations

import random
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


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive loopback ports free right now (a pool
    file's ``port``: server i listens on port + i)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000 - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")
