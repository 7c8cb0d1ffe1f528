"""Where the sample traces are (``replayer demo`` replays one), installed or not.

Their home is the checkout's top-level ``traces/``. The wheel carries them as
package data, ``replayer/_traces/`` (``force-include`` in ``pyproject.toml``),
because an installed package has no checkout around it. A checkout (an
editable install, or ``PYTHONPATH``) has no ``_traces/``: there the files are
read where they live, so the repository keeps one copy.

A path, not a stream: traces are memory-mapped and named on the command line
of the servers and runs a command starts.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKAGED = "_traces"
"""The folder inside the installed ``replayer`` package that holds the samples."""
CHECKOUT = Path(__file__).resolve().parents[1] / "traces"


def sample_trace(name: str) -> Path:
    """The path of sample trace ``name`` (``agents-8x10.arrow``): the packaged
    copy, else the checkout's. Where neither exists, the packaged path, so
    the error a caller raises on opening it names what the install lacks."""
    packaged = resources.files("replayer").joinpath(PACKAGED, name)
    # A wheel installs as files (a Path); a zipped import has no path to hand out.
    if isinstance(packaged, Path) and packaged.is_file():
        return packaged
    checkout = CHECKOUT / name
    if checkout.is_file():
        return checkout
    return Path(str(packaged))
