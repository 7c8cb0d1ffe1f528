"""What the recording proxy is told (:class:`RecordOptions`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from replayer._declare import Declared, option

DEFAULT_SESSION_HEADERS = ("X-Session-Id", "X-Session-Affinity", "X-Correlation-ID")
"""Headers a client may name its session by, tried in order."""


def _upstream_problem(url: str) -> str | None:
    from urllib.parse import urlsplit

    up = urlsplit(url)
    if up.scheme not in ("http", "https") or not up.hostname:
        return f"wants http://HOST[:PORT][/PREFIX], not {url!r}"
    return None


def parse_listen(spec: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (loopback)."""
    s = spec.strip()
    if s.isdigit():
        return "127.0.0.1", int(s)
    if s.startswith("["):
        host, _, port = s[1:].partition("]:")
    else:
        host, _, port = s.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"wants HOST:PORT or PORT, not {spec!r}")
    return host, int(port)


def _listen_problem(spec: str) -> str | None:
    try:
        parse_listen(spec)
    except ValueError as exc:
        return str(exc)
    return None


def _regexes_problem(patterns: tuple[str, ...]) -> str | None:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            return f"bad regular expression: {exc}"
    return None


@dataclass(frozen=True)
class RecordOptions(Declared):
    """A transparent reverse proxy in front of an OpenAI-compatible server
    that records what passes into a trace (:mod:`replayer.record`)."""

    __group__ = "recording"
    __verbs__ = frozenset({"record"})

    upstream: str | None = option(
        None,
        "the server, e.g. http://gpu1:8000",
        metavar="URL",
        check=_upstream_problem,
        required=True,
    )
    """Base URL of the server (``http://host:8000``; a path prefix is kept)."""
    listen: str = option(
        "127.0.0.1:8001",
        "address to serve on (default 127.0.0.1:8001; port 0 = any free port)",
        metavar="[HOST:]PORT",
        check=_listen_problem,
    )
    flush_interval: float = option(
        1.0,
        "no effect: each exchange is written before its response ends (kept for scripts)",
        metavar="S",
        gt=0,
    )
    session_header: tuple[str, ...] = option(
        DEFAULT_SESSION_HEADERS,
        "header naming the session (repeatable; default X-Session-Id, X-Session-Affinity, "
        "X-Correlation-ID; 'none' = always infer)",
        metavar="NAME",
    )
    drop_header: tuple[str, ...] = option(
        (),
        "never store this request header (repeatable; credentials are always dropped)",
        metavar="NAME",
    )
    redact: tuple[str, ...] = option(
        (),
        "mask matches in stored bodies and outputs (repeatable)",
        metavar="REGEX",
        check=_regexes_problem,
    )
    fsync: bool = option(False, "fsync on every flush (survive power loss)")
    record_count_tokens: bool = option(
        False,
        "record Anthropic /v1/messages/count_tokens requests too (always forwarded; not "
        "recorded by default: they are not load)",
    )
    drain: float = option(
        5.0,
        "seconds in-flight exchanges get to finish at shutdown (default 5)",
        metavar="S",
        ge=0,
    )
    max_connections: int = option(4096, "upstream pool size", metavar="N", ge=1)
    connect_timeout: float = option(
        30.0,
        "upstream connect timeout (no read timeout: prefills are long)",
        metavar="S",
        gt=0,
    )
    add_request_id: bool = option(
        False,
        "send the recorded request id upstream as X-Request-Id when the client sent none",
    )
    port_file: str | None = option(None, "write the bound port here", metavar="PATH")
    progress: float = option(
        10.0, "progress line on stderr every S seconds (0 = off)", metavar="S", ge=0
    )

    @property
    def session_headers(self) -> tuple[str, ...]:
        """The headers to read sessions from (none: always infer)."""
        if any(h.lower() == "none" for h in self.session_header):
            return ()
        return self.session_header
