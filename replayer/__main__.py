"""``python -m replayer`` is the same as the ``replayer`` console script."""

from replayer.cli import main

raise SystemExit(main())
