"""Output files that never clobber or half-write: results are written to a
temporary sibling and renamed into place only when complete; a write that
fails (a full disk above all) becomes one :class:`~replayer.errors.OutputError`
naming the file, never a traceback."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from replayer.errors import DiskFullError, OutputError, UsageError

T = TypeVar("T")

_NO_SPACE = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "no space left (disk quota exceeded)",
    errno.EROFS: "no space left to write (read-only file system)",
}


def no_space(exc: BaseException) -> bool:
    """Is ``exc`` a write refused for want of space (full, over quota, read-only)?"""
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def output_error(exc: OSError, path: str | os.PathLike[str]) -> OutputError:
    """The one error a failed write of ``path`` becomes: a full disk is bad
    luck to report in one line (:class:`DiskFullError`), not a crash."""
    problem = _NO_SPACE.get(exc.errno or 0)
    if problem is not None:
        return DiskFullError(path, problem, "free space and rerun")
    return OutputError(path, f"cannot write: {exc.strerror or exc}")


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an ``OSError`` raised in the block into :func:`output_error` of ``path``."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise output_error(exc, path) from None


def truncate_quietly(path: str | os.PathLike[str], size: int) -> None:
    """Cut ``path`` back to ``size`` bytes (the end of its last whole record)
    after a failed write: shrinking a file needs no space, so it works on
    the disk that just refused the write."""
    with contextlib.suppress(OSError):
        os.truncate(path, size)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path; rename it to ``path`` if the block succeeds,
    remove it if not.

    An existing ``path`` is refused unless ``force``: replayer never
    overwrites a trace or a result by accident. A failed write of the
    temporary (a full disk) is one :class:`~replayer.errors.OutputError`
    naming ``path``; an ``OSError`` about another file (a source being
    read) is not ours and passes as it is."""
    out = Path(path)
    if out.exists() and not force:
        raise UsageError(f"{out} already exists (use --force to overwrite)")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, out)
    except OSError as exc:
        other = exc.filename is not None and Path(exc.filename) not in (tmp, out, out.parent)
        if other and not no_space(exc):
            raise
        raise output_error(exc, out) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """``data`` as the whole of ``path``, by a temporary and a rename: a
    reader never sees half a file, a full disk leaves the previous file as
    it was and no temporary (one :class:`~replayer.errors.OutputError`)."""
    with atomic_output(path, force=True) as tmp:
        tmp.write_bytes(data)


def load_entries(path: Path, flag: str, table: str) -> list[Any]:
    """The entries of a user's list file (``--vary``'s variants, ``bundle
    diagnose``'s profiles): TOML ``[[table]]`` tables or a JSON list, read by
    :func:`parse_json_or_toml`; a file that is none of those is one
    :class:`~replayer.errors.UsageError` naming ``flag`` and the file."""
    where = f"{flag} {path}"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = parse_json_or_toml(path, text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    if isinstance(data, dict):
        data = data.get(table, data.get(f"{table}s"))
    if not isinstance(data, list) or not data:
        raise UsageError(f"{where}: expected [[{table}]] tables (TOML) or a list of objects (JSON)")
    return data


def shipped_named(spec: str, shipped: Mapping[str, T], flag: str, what: str) -> list[T]:
    """The entries of a shipped list that ``default:NAME,NAME`` names, in
    its order; an unknown or missing name is one
    :class:`~replayer.errors.UsageError` listing what there is."""
    names = [n.strip() for n in spec[len("default:") :].split(",") if n.strip()]
    bad = [n for n in names if n not in shipped]
    if bad or not names:
        raise UsageError(
            f"{flag} {spec}: no shipped {what} {', '.join(bad) or '(none named)'}; "
            f"have {', '.join(shipped)}"
        )
    return [shipped[n] for n in names]


ENTRY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
"""A list entry's name: a word (letters, digits, - _ . +)."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def named_entry(
    entry: object, where: str, what: str, keys: Sequence[str]
) -> tuple[Mapping[str, Any], str, str]:
    """One entry of a user's list file (a ``[[variant]]`` or ``[[profile]]``
    table or JSON object) as a mapping, its name, and ``where`` naming it for
    the next error; anything but an object of known keys with a word for its
    name is one :class:`~replayer.errors.UsageError`."""
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where}: each {what} must be a table/object")
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)} (have {', '.join(keys)})")
    name = entry.get("name")
    if not isinstance(name, str) or not ENTRY_NAME.match(name):
        raise UsageError(f"{where}: 'name' must be a word (letters, digits, - _ . +)")
    return entry, name, f"{where} ({name})"


def parse_json_or_toml(path: Path, text: str) -> object:
    """``text`` as TOML for a ``.toml`` file, JSON for ``.json``, else JSON
    then TOML: the one rule for the files users hand over (fault rules,
    server variants). Raises ValueError naming what it expected."""
    import json
    import tomllib

    suffix = path.suffix.lower()
    kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "JSON or TOML")
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            if suffix == ".json":
                raise
            return tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"not {kind} ({exc})") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of an append-only JSONL journal (control runs, variant
    runs); [] when it does not exist. A torn last line (a killed writer) is
    cut off the file, so the next append starts a line of its own."""
    import orjson

    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    at = 0
    data = path.read_bytes()
    for line in data.splitlines(keepends=True):
        if line.strip():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                with path.open("r+b") as f:
                    f.truncate(at)
                break
        at += len(line)
    return out


def append_records(path: Path, records: list[bytes], *, sync: bool = True) -> None:
    """Append ``records`` (whole lines, newline included) to a journal in
    one write; ``sync`` makes them durable before returning.

    All or nothing: a write the disk refuses part-way is cut back off, so
    the file still ends on a whole line, and the refusal becomes one
    :class:`~replayer.errors.OutputError`. (A kill inside the write leaves a
    torn last line, which every reader drops.)"""
    data = b"".join(records)
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        except OSError as exc:
            truncate_quietly(path, start)
            raise output_error(exc, path) from None
    finally:
        os.close(fd)
