"""Confinement: every path a request names stays inside the data directory.

The service runs beside production traces and GPU servers, so a request must
never make it read or write outside ``DIR`` (or, for downloads, outside one
job's folder). A path from a request is *relative*, made of plain names, and
resolves (symlinks followed) to a place under the root; anything else is a
:class:`PathRejected`, which the API answers with 400 before doing anything.

Rejected outright, before touching the file system: empty paths, absolute
paths (``/x``, ``\\\\x``, ``C:x``), ``..`` and ``.`` components, empty
components (``a//b``), NUL and control characters, backslashes, and any
percent-encoding (``%2e%2e``: a path in a JSON body or a query was decoded
once already; one that still holds an escape is an attempt to smuggle a
second decoding past this check). Then the path is resolved with symlinks
followed and must land under the root; the root itself is resolved once at
start-up, so a data directory that is itself a symlink works.

A check-then-open race (a symlink swapped in between) needs write access
inside ``DIR``, which only the operator has; final opens also refuse a
symlink as the last component (``O_NOFOLLOW``) where they can.

:func:`suspicious_raw_path` is the same idea for the URL itself: the raw,
undecoded request path is refused when it holds ``..``/``.`` segments or
encoded dots, slashes, backslashes or NULs, whichever route it would reach.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENCODED_BAD = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)


class PathRejected(ValueError):
    """A path from a request that is not confined to the root: a 400."""


def check_relative(text: str, what: str = "path") -> PurePosixPath:
    """``text`` as a relative path of plain components, or :class:`PathRejected`."""
    if not isinstance(text, str) or not text:
        raise PathRejected(f"{what}: want a non-empty relative path")
    if _CONTROL.search(text):
        raise PathRejected(f"{what}: control characters are not allowed")
    if "%" in text:
        raise PathRejected(f"{what}: percent-encoded paths are not allowed")
    if "\\" in text:
        raise PathRejected(f"{what}: backslashes are not allowed")
    if text.startswith("/") or re.match(r"^[A-Za-z]:", text):
        raise PathRejected(f"{what}: absolute paths are not allowed (give a path inside DIR)")
    parts = text.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise PathRejected(f"{what}: '..', '.' and empty components are not allowed")
    return PurePosixPath(*parts)


def confine(root: Path, text: str, what: str = "path", *, must_exist: bool = True) -> Path:
    """The real path ``text`` names under ``root`` (already resolved).

    Symlinks are followed and the result must stay under ``root``; with
    ``must_exist`` the target must exist too."""
    rel = check_relative(text, what)
    candidate = root.joinpath(*rel.parts)
    try:
        real = candidate.resolve(strict=must_exist)
    except FileNotFoundError:
        raise PathRejected(f"{what}: {text} does not exist") from None
    except (OSError, RuntimeError) as exc:  # symlink loops, permission
        raise PathRejected(f"{what}: {text}: {exc.__class__.__name__}") from None
    if real != root and not real.is_relative_to(root):
        raise PathRejected(f"{what}: {text} resolves outside the data directory")
    return real


def safe_name(text: str, what: str = "name") -> str:
    """A single file name: letters, digits, ``._-``, not starting with a dot."""
    if not isinstance(text, str) or not SAFE_NAME.match(text) or ".." in text:
        raise PathRejected(
            f"{what}: want 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return text


def suspicious_raw_path(raw_path: str) -> str | None:
    """Why the raw (undecoded) request path is refused, or None if it is fine."""
    path = raw_path.split("?", 1)[0]
    if _ENCODED_BAD.search(path):
        return "encoded '.', '/', '\\' or NUL in the URL path"
    if "\\" in path or _CONTROL.search(path):
        return "backslash or control character in the URL path"
    for seg in path.split("/")[1:]:
        if seg in (".", ".."):
            return "'.' or '..' segment in the URL path"
    return None
