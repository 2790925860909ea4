"""The `ddsweep` command line: one entry point, one subcommand per task."""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand -> module that registers it with `register(subparsers)`. Only the chosen subcommand's module is
# imported, so light commands (the stand-in server, run-point) do not pay for pandas and matplotlib.
SUBCOMMANDS = {
    "plan": "ddsweep.adaptive.cli",
    "validate": "ddsweep.config.study",
    "smoke": "ddsweep.config.smoke",
    "preflight": "ddsweep.point.preflight",
    "run-point": "ddsweep.point.run",
    "sim-server": "ddsweep.sim.cli",
    "bench": "ddsweep.bench.cli",
    "coding-eval": "ddsweep.coding.eval",
    "summarize": "ddsweep.commands.summarize",
    "picks": "ddsweep.commands.summarize",
    "bundle": "ddsweep.report.bundle",
    "compare": "ddsweep.commands.compare",
    "status": "ddsweep.commands.status",
    "select": "ddsweep.adaptive.cli",
    "funnel": "ddsweep.adaptive.cli",
    "merge-launches": "ddsweep.point.launches",
    "reference-hosts": "ddsweep.config.reference",
    "canary": "ddsweep.point.canary",
    "store": "ddsweep.store",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Assemble the parser from the module of `command`, or from every module when none is chosen."""
    parser = argparse.ArgumentParser(prog="ddsweep", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [SUBCOMMANDS[command]] if command in SUBCOMMANDS else list(dict.fromkeys(SUBCOMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
