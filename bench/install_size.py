"""What ``pip install replayer`` puts on disk: a fresh venv's site-packages.

``python -m bench install_size [-- --ref REV]``

Builds a wheel of this checkout (``pip wheel --no-deps``), or of commit REV
(``git archive``, so an older state is measured the same way), installs it
into a fresh venv with its dependencies from the package index, as a user
would, and sums that venv's site-packages: in total and per distribution
(the files its RECORD lists). Sizes are disk usage, as ``du`` counts it
(allocated blocks, a hard-linked file once), in MiB: the total is what
``du -sh SITE_PACKAGES`` prints. The venv's own pip and setuptools are part
of the total on both sides of a comparison.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
SHOWN = 8
"""Distributions listed by name, largest first; the rest are summed."""


def _source(ref: str | None, into: Path) -> Path:
    """The tree to build: this checkout, or REV's committed files."""
    if ref is None:
        return REPO
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref], check=True, capture_output=True
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def install(src: Path, work: Path) -> Path:
    """Build ``src``'s wheel and install it into a fresh venv; the venv's site-packages."""
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        check=True,
    )
    (wheel,) = wheels.glob("replayer-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True
    )
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)


def _disk(path: Path, seen: set[tuple[int, int]]) -> int:
    """Bytes ``path`` takes on disk, 0 if already counted (a hard link) or gone."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0
    key = (st.st_dev, st.st_ino)
    if key in seen:
        return 0
    seen.add(key)
    return st.st_blocks * 512


def measure(site: Path) -> dict[str, Any]:
    """Total and per-distribution disk usage of ``site`` (see the module docstring)."""
    seen: set[tuple[int, int]] = set()
    dists: dict[str, int] = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        name = record.parent.name.removesuffix(".dist-info")
        with record.open(newline="") as f:
            # ../../../bin/replayer and the like lie outside site-packages
            inside = [site / row[0] for row in csv.reader(f) if row and row[0][:3] != "../"]
        dists[name] = sum(_disk(p, seen) for p in inside)
    other = 0
    for root, dirnames, filenames in os.walk(site):
        for n in filenames + dirnames:
            other += _disk(Path(root) / n, seen)
    total = sum(dists.values()) + other
    by_size = sorted(dists.items(), key=lambda kv: -kv[1])
    return {
        "site_packages_mib": round(total / MIB, 1),
        "distributions_mib": {k: round(v / MIB, 1) for k, v in by_size},
        "other_mib": round(other / MIB, 1),
    }


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench install_size --")
    ap.add_argument("--ref", help="measure this commit's wheel instead of the checkout's")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        figures = measure(install(_source(args.ref, Path(d) / "src"), Path(d)))
    figures["ref"] = ref = args.ref or "checkout"
    dists: list[tuple[str, float]] = list(figures["distributions_mib"].items())
    rest = sum(mib for _, mib in dists[SHOWN:]) + figures["other_mib"]
    print(f"site-packages of a fresh venv with replayer ({ref}): "
          f"{figures['site_packages_mib']:.0f} MiB\n")  # fmt: skip
    print("| distribution | MiB |\n|---|---|")
    for name, mib in dists[:SHOWN]:
        print(f"| {name} | {mib:.1f} |")
    print(f"| the other {len(dists) - SHOWN} and directories | {rest:.1f} |")
    return figures
