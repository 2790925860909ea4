"""`ddsweep smoke`: run the smoke study (config/smoke.yaml) through the real set-up before the sweep.

One point, one benchmark cell and a few coding problems: start-up, knob verification, benchmark, coding eval,
stop and the summary, in minutes, with the study's own launcher, presets, model paths and resources. It runs
in a directory of its own (default `smoke/`: its `config/`, `results/` and `reports/`), so that nothing it
writes mixes with the study's results. Arguments after `--` go to Snakemake (`-- --profile slurm`, `-- -n`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from ddsweep.config.study import ConfigError, load_config, merge_config
from ddsweep.storage import write_text_atomic


def prepare(configs: list[str], smoke: Path, directory: Path) -> tuple[Path, Path]:
    """Write the study's configuration (the given files merged) and the smoke overlay into DIRECTORY/config/,
    after checking that the two validate together; returns their paths."""
    merged: dict = {}
    for path in configs:
        try:
            merge_config(merged, yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
        except OSError as exc:
            raise ConfigError(f"configuration file not readable: {path}: {exc}") from exc
    load_config(*configs, smoke)  # the error names the key when the smoke overlay does not fit the study
    study, overlay = directory / "config" / "config.yaml", directory / "config" / "smoke.yaml"
    study.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(study, yaml.safe_dump(merged, sort_keys=False))
    write_text_atomic(overlay, smoke.read_text(encoding="utf-8"))
    return study, overlay


def snakemake_command(snakefile: Path, directory: Path, overlay: Path, extra: list[str]) -> list[str]:
    """The Snakemake command of the smoke study: the repository's workflow, run in DIRECTORY."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile.resolve()), "--directory",
            str(directory.resolve()), "--cores", "all", "--configfile", str(overlay.resolve()), *extra]


def _run(args: argparse.Namespace) -> int:
    """`ddsweep smoke`: prepare the smoke directory and run the workflow there."""
    directory, snakefile = Path(args.dir), Path(args.snakefile)
    if not snakefile.is_file():
        print(f"ddsweep smoke: no workflow at {snakefile} (run from the repository root, or give --snakefile)",
              file=sys.stderr)
        return 2
    try:
        study, overlay = prepare(args.config, Path(args.smoke), directory)
    except ConfigError as exc:
        print(f"ddsweep smoke: {exc}", file=sys.stderr)
        return 2
    extra = [a for a in args.snakemake_args if a != "--"]
    command = snakemake_command(snakefile, directory, overlay, extra)
    print("ddsweep smoke: " + " ".join(command), file=sys.stderr, flush=True)
    code = subprocess.run(command, check=False).returncode
    logs = directory / "results" / "logs" / "points"
    if code != 0:
        print(f"ddsweep smoke: FAILED (exit {code}); the point's log: {logs}", file=sys.stderr)
        return code
    if "-n" in extra or "--dry-run" in extra:
        return 0
    # the workflow ends with its summary even when its point failed: the smoke study passes only if it measured
    if subprocess.run(status_command(directory, study, overlay), check=False).returncode != 0:
        print(f"ddsweep smoke: FAILED: nothing was measured (the table above says why); the point's log: {logs}",
              file=sys.stderr)
        return 1
    print(f"ddsweep smoke: the set-up works; summary in {directory / 'reports' / 'optimization_summary.md'}",
          file=sys.stderr)
    return 0


def status_command(directory: Path, study: Path, overlay: Path) -> list[str]:
    """`ddsweep status` of the smoke study, failing when no point was measured."""
    return [sys.executable, "-m", "ddsweep", "status", "--config", str(study), str(overlay), "--results",
            str(directory / "results"), "--expect-measured", "1"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `smoke` subcommand."""
    parser = subparsers.add_parser("smoke", help="run the smoke study (one point, one cell, a few coding problems)",
                                   description=__doc__)
    parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"],
                        help="the study's configuration file(s), merged as Snakemake merges them")
    parser.add_argument("--smoke", default="config/smoke.yaml", help="the smoke overlay (default config/smoke.yaml)")
    parser.add_argument("--dir", default="smoke", help="the smoke study's own directory (default smoke/)")
    parser.add_argument("--snakefile", default="Snakefile", help="the workflow (default ./Snakefile)")
    parser.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                        help="after --: arguments for Snakemake, e.g. -- --profile slurm")
    parser.set_defaults(func=_run)
