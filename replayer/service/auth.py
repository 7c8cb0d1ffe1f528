"""Who may talk to the service: one bearer token, compared in constant time.

Every route but ``/healthz`` needs ``Authorization: Bearer <token>``. The
token comes from ``--token-file`` or ``$REPLAYER_SERVE_TOKEN``; with
neither, ``serve`` refuses a non-loopback address outright, and on loopback
it makes a random token and writes it to ``DIR/serve.token`` (mode 0600),
so even a head node's other local users need to read that file first.

Browsers cannot send a bearer header from a link, so ``GET``/``HEAD`` also
accept the token as the password of HTTP Basic auth (any user name): the
jobs page and its download links then work after the browser's own prompt.
Basic credentials are refused on every other method: a browser re-sends
them on cross-site form posts, and a state-changing request must not be
forgeable that way (mutating routes also take only JSON bodies, which a
cross-site form cannot send without a CORS preflight this service never
grants).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import secrets
import socket
from pathlib import Path

from replayer.errors import UsageError

MIN_TOKEN_CHARS = 16
TOKEN_ENV = "REPLAYER_SERVE_TOKEN"


def is_loopback(host: str) -> bool:
    """True if every address ``host`` names is a loopback address."""
    if host in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {i[4][0] for i in infos}
    return bool(addrs) and all(ipaddress.ip_address(str(a)).is_loopback for a in addrs)


def load_token(token_file: Path | None, data: Path, host: str) -> tuple[str, str]:
    """``(token, where it came from)``; see the module docstring."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: cannot read: {exc.strerror}") from None
        source = f"--token-file {token_file}"
    elif os.environ.get(TOKEN_ENV, "").strip():
        token, source = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        if not is_loopback(host):
            raise UsageError(
                f"refusing to listen on {host} without a token: set ${TOKEN_ENV} or pass "
                "--token-file (only a loopback address may run with a generated token)"
            )
        path = data / "serve.token"
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        source = f"generated, in {path}"
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise UsageError(
            f"the token ({source}) must be at least {MIN_TOKEN_CHARS} characters without spaces"
        )
    return token, source


SAFE_METHODS = frozenset({"GET", "HEAD"})


def authorized(header: str | None, method: str, token: str) -> bool:
    """Does this ``Authorization`` header carry the token (module docstring)?"""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    scheme = scheme.lower()
    given: str | None = None
    if scheme == "bearer":
        given = value.strip()
    elif scheme == "basic" and method.upper() in SAFE_METHODS:
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), token.encode())
