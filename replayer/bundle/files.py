"""A repro bundle's ``manifest.json``, read and written through one declaration.

Every reader of a bundle (``bundle verify``, ``--vary`` on a bundle, the
report, the service's job page) gets the manifest at the current version
and the replay policy the bisect found the repro with, whole: a bundle is
verified under exactly that policy, never a default filled in for a field
someone forgot to copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayer._declare import specs
from replayer._runfile import JsonFile, RunFileError
from replayer.errors import OptionError
from replayer.options.replay import ReplayPolicy
from replayer.session.verdict import Chase

MANIFEST = JsonFile("manifest.json", 1, "a repro bundle")
"""Version 1 is the first stamped; nothing older was written."""


@dataclass(frozen=True)
class Manifest:
    """A bundle's manifest (see :mod:`replayer.bundle.export` for its fields)."""

    path: Path
    data: Mapping[str, Any]

    @property
    def policy(self) -> ReplayPolicy:
        """The replay policy the bisect ran the repro with, every field."""
        return policy_of(self.data.get("policy") or {}, self.path)

    @property
    def signature(self) -> Mapping[str, Any] | None:
        sig = self.data.get("signature")
        return sig if isinstance(sig, Mapping) else None

    def chase(self) -> Chase:
        """The bundle's crash, as a trial chases it."""
        return Chase.from_signature(dict(self.signature or {}))

    @property
    def requests(self) -> list[str]:
        return list(self.data.get("requests") or [])

    @property
    def status(self) -> str | None:
        s = self.data.get("status")
        return str(s) if s is not None else None


def policy_of(d: Mapping[str, Any], where: Path | str) -> ReplayPolicy:
    """A policy written by :meth:`ReplayPolicy.to_dict` (fields a later
    replayer added, missing from an older bundle, take their defaults)."""
    known = {s.name for s in specs(ReplayPolicy)}
    try:
        return ReplayPolicy(**{k: v for k, v in d.items() if k in known})
    except OptionError as exc:
        raise RunFileError(f"{where}: policy {exc}") from None


def read_manifest(bundle: Path) -> Manifest:
    """``bundle``'s manifest at the current version (a bisect directory's
    bundle is at ``DIR/bundle``)."""
    return Manifest(bundle / MANIFEST.name, MANIFEST.load(bundle))
