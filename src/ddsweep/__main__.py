"""Allow `python -m ddsweep`."""

from ddsweep.cli import main

raise SystemExit(main())
