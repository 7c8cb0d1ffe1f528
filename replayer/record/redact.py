"""What the recorder refuses to write down: credentials, and whatever else the user says.

A trace is shared (bundles go to other teams), so credentials must never
reach it. Three layers, applied to everything stored (rows, meta,
provenance):

* **headers**: ``Authorization``, ``Proxy-Authorization``, cookies and any
  header whose name says key/token/secret/password/credential/auth
  (``api-key``, ``x-api-key``, ``x-goog-api-key``, ``x-auth-token`` …), plus
  the names given with ``--drop-header``, are dropped; so is any header
  whose value looks like a credential (``Bearer …``, ``Basic …``, ``sk-…``).
* **query and body fields** with credential names (``api_key``,
  ``access_token``, ``password`` …) and a string value have it replaced by
  :data:`MASK`, anywhere in the request's parameters (not in message text;
  a tool's JSON-schema property named ``password`` is an object, and kept).
* ``--redact REGEX`` (repeatable) masks every match in every stored string:
  message contents, prompts, parameters, outputs, tool-call arguments,
  errors, header and query values.

Redaction runs on the copy that is stored, after session inference (which
sees the original in memory only). The patterns themselves are never
stored: a pattern may spell the secret it hides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "[REDACTED]"

_SECRET_NAME = re.compile(
    r"(auth|cookie|api[-_]?key|apikey|token|secret|passw|credential|signature|session[-_]?key"
    r"|subscription[-_]?key|private[-_]?key)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"^\s*(bearer|basic|digest|negotiate|token)\s+\S|^\s*(sk|pk|rk)-[A-Za-z0-9_\-]{8,}",
    re.IGNORECASE,
)
# Body/query fields: exact names only, so vLLM's own *_tokens parameters are kept.
SECRET_FIELDS = frozenset(
    {
        "api_key",
        "apikey",
        "x_api_key",
        "key",
        "access_token",
        "auth_token",
        "bearer_token",
        "id_token",
        "refresh_token",
        "token",
        "authorization",
        "password",
        "passwd",
        "secret",
        "client_secret",
        "api_secret",
        "sig",
        "signature",
        "cookie",
    }
)
_CONTENT_KEYS = ("messages", "prompt")


def secret_header(name: str, value: str = "") -> bool:
    """A header the recorder never stores, by its name or its value."""
    return _secret_name(name) or bool(value and _SECRET_VALUE.search(value))


@functools.lru_cache(maxsize=1024)
def _secret_name(name: str) -> bool:
    # names repeat on every request (values are not cached: they may be secrets)
    return bool(_SECRET_NAME.search(name))


@functools.lru_cache(maxsize=64)
def _lower_set(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(h.lower() for h in names)


def secret_field(name: str) -> bool:
    return name.lower().replace("-", "_") in SECRET_FIELDS


class Redactor:
    """Masks what must not be stored.

    **Usage**::

        red = Redactor(patterns=[r"ACME-[0-9]+"], drop_headers=["X-Team"])
        body, masked = red.body(body)          # a new dict; masked: field paths
        headers = red.headers(request.headers)  # kept headers only
    """

    def __init__(self, patterns: Iterable[str] = (), drop_headers: Iterable[str] = ()) -> None:
        self.patterns = [re.compile(p) for p in patterns]
        self.drop = frozenset(h.lower() for h in drop_headers)

    @property
    def active(self) -> bool:
        """True when ``--redact`` patterns are in force."""
        return bool(self.patterns)

    def text(self, s: str) -> str:
        for p in self.patterns:
            s = p.sub(MASK, s)
        return s

    def opt_text(self, s: str | None) -> str | None:
        return None if s is None or not self.patterns else self.text(s)

    def value(self, v: Any) -> Any:
        """Every string in a JSON value, masked (a new value; the input is not changed)."""
        if not self.patterns:
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        return v

    def headers(
        self, headers: Iterable[tuple[str, str]], skip: Iterable[str] = ()
    ) -> dict[str, str]:
        """Headers that may be stored (values masked); repeated names are joined by ', '."""
        skipped = _lower_set(tuple(skip))
        out: dict[str, str] = {}
        for name, value in headers:
            low = name.lower()
            if low in self.drop or low in skipped or secret_header(low, value):
                continue
            v = self.text(value) if self.patterns else value
            out[low] = f"{out[low]}, {v}" if low in out else v
        return out

    def query(self, pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
        """Query parameters that may be stored, credential fields masked."""
        out: dict[str, str] = {}
        for k, v in pairs:
            out[k] = MASK if secret_field(k) or secret_header(k, v) else self.text(v)
        return out

    def body(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The body to store and the paths of the credential fields it masked."""
        masked: list[str] = []
        out: dict[str, Any] = {}
        for k, v in body.items():
            if k in _CONTENT_KEYS:
                out[k] = self.value(v)
            elif secret_field(k) and isinstance(v, str):
                out[k] = MASK
                masked.append(k)
            else:
                out[k] = self._params(v, k, masked)
        return out, masked

    def _params(self, v: Any, path: str, masked: list[str]) -> Any:
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for k, x in v.items():
                # credentials are strings; a dict under such a name is a JSON
                # schema property of a tool or response format, kept as is
                if secret_field(k) and isinstance(x, str):
                    out[k] = MASK
                    masked.append(f"{path}.{k}")
                else:
                    out[k] = self._params(x, f"{path}.{k}", masked)
            return out
        if isinstance(v, list):
            return [self._params(x, f"{path}[]", masked) for x in v]
        if isinstance(v, str) and self.patterns:
            return self.text(v)
        return v
