"""Start the emulator with a new seed on every launch (``COUNTER BASE ARGS...``).

Flaky faults draw from a generator seeded by ``--seed``; a server restarted
with the same seed would draw the same numbers and the "flaky" crash would be
deterministic per candidate. This launcher counts its launches in the file
COUNTER and passes ``--seed BASE + count``: every trial draws anew, and a
bisect is still reproducible from its base seed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    counter, base, *args = sys.argv[1:]
    path = Path(counter)
    n = int(path.read_text()) + 1 if path.exists() else 0
    path.write_text(str(n))
    argv = [sys.executable, "-m", "replayer.emulator", *args, "--seed", str(int(base) + n)]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
