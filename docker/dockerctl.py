#!/usr/bin/env python3
"""Restart a container and print its log through the Docker Engine API.

replayer restarts a crashed vLLM between bisect trials with a ``restart_cmd``
and reads its log with a ``log_cmd`` (``targets.toml``). In the compose lab
the vLLM servers are sibling containers, so those commands go through a
docker-socket-proxy that allows only container restarts and reads
(``ALLOW_RESTARTS=1 CONTAINERS=1 POST=0``): the replayer container never
holds the Docker socket itself. Standard library only, so the image needs
no Docker CLI.

    dockerctl restart NAME            # returns once the container restarted
    dockerctl logs NAME [--since T]   # T: unix seconds (replayer's {since_unix})

``$DOCKER_HOST`` is ``tcp://HOST:PORT`` (default ``tcp://docker-proxy:2375``).
"""

from __future__ import annotations

import argparse
import http.client
import os
import struct
import sys
import urllib.parse

API = "/v1.43"


def _conn() -> http.client.HTTPConnection:
    url = urllib.parse.urlsplit(os.environ.get("DOCKER_HOST", "tcp://docker-proxy:2375"))
    if url.scheme not in ("tcp", "http") or not url.hostname:
        raise SystemExit(f"dockerctl: DOCKER_HOST must be tcp://HOST:PORT, not {url.geturl()!r}")
    return http.client.HTTPConnection(url.hostname, url.port or 2375, timeout=600)


def demux(data: bytes) -> bytes:
    """The Engine API multiplexes stdout and stderr of a non-TTY container:
    frames of ``[stream, 0, 0, 0, size (4 bytes, big endian)] + payload``."""
    out = bytearray()
    i = 0
    while i + 8 <= len(data):
        stream, size = data[i], struct.unpack(">I", data[i + 4 : i + 8])[0]
        if stream not in (0, 1, 2) or data[i + 1 : i + 4] != b"\0\0\0":
            return data  # a TTY container: the log is not framed
        out += data[i + 8 : i + 8 + size]
        i += 8 + size
    return bytes(out)


def restart(name: str, grace: int) -> int:
    conn = _conn()
    conn.request("POST", f"{API}/containers/{urllib.parse.quote(name)}/restart?t={grace}")
    resp = conn.getresponse()
    body = resp.read().decode(errors="replace").strip()
    if resp.status != 204:
        print(f"dockerctl: restart {name}: HTTP {resp.status} {body}", file=sys.stderr)
        return 1
    return 0


def logs(name: str, since: str | None) -> int:
    query = {"stdout": "1", "stderr": "1", "timestamps": "0"}
    if since:
        query["since"] = since
    conn = _conn()
    path = f"{API}/containers/{urllib.parse.quote(name)}/logs?{urllib.parse.urlencode(query)}"
    conn.request("GET", path)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        print(f"dockerctl: logs {name}: HTTP {resp.status} {data[:200]!r}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(demux(data))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dockerctl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("restart")
    r.add_argument("name")
    r.add_argument("--grace", type=int, default=30, help="seconds before SIGKILL (default 30)")
    lg = sub.add_parser("logs")
    lg.add_argument("name")
    lg.add_argument("--since", default=None)
    args = p.parse_args(argv)
    if args.verb == "restart":
        return restart(args.name, args.grace)
    return logs(args.name, args.since)


if __name__ == "__main__":
    sys.exit(main())
