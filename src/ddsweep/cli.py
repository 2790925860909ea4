"""The `ddsweep` command line: one entry point, one subcommand per task."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module registers its own subcommand(s) with `register(subparsers)` and sets `func` on its parser.
SUBCOMMAND_MODULES = (
    "ddsweep.config",
    "ddsweep.runpoint",
    "ddsweep.simserver",
    "ddsweep.loadgen",
    "ddsweep.coding.eval",
    "ddsweep.summarize",
    "ddsweep.bundle",
    "ddsweep.preflight",
)


def build_parser() -> argparse.ArgumentParser:
    """Assemble the parser from every module that provides a subcommand."""
    parser = argparse.ArgumentParser(prog="ddsweep", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
