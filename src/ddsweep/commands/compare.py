"""`ddsweep compare STUDY_A STUDY_B`: one study against another (a new drafter, a new SGLang build).

For the points both studies measured (matched by kind and knobs), each regime's figure of B over A with its
interval, computed from independent launch-level figures of the two studies (Welch's t on the logs); the
picks of each study side by side; and what changed in the environment: engine version and commit, drafter
path and trained block size, GPU and interconnect, and the server command lines of matched points. A study is
a results directory, a directory holding `results/`, or a report bundle (`.tar.gz`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.results import load_results
from ddsweep.findings.comparison import Study, compare
from ddsweep.findings.summary import build_outcome
from ddsweep.plotting.compare_plot import compare_plot
from ddsweep.report.bundle import BundleError, extract_bundle
from ddsweep.report.compare import render_compare
from ddsweep.storage import write_text_atomic


class StudyError(ValueError):
    """A path given to `ddsweep compare` is not a study."""


def _results_dir(root: Path) -> Path:
    """ROOT itself when it holds points/, else ROOT/results."""
    if (root / "points").is_dir():
        return root
    if (root / "results" / "points").is_dir():
        return root / "results"
    raise StudyError(f"{root}: neither {root}/points/ nor {root}/results/points/ exists (not a results directory)")


def _config_near(results_dir: Path) -> dict[str, Any] | None:
    """The study config the workflow wrote (results/study_config.yaml), else the one archived beside the results
    (a bundle's config/*.yaml) if there is exactly one."""
    configs = [results_dir / "study_config.yaml"]
    if not configs[0].is_file():
        configs = sorted((results_dir.parent / "config").glob("*.yaml"))
    if len(configs) != 1:
        return None
    try:
        loaded = yaml.safe_load(configs[0].read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def open_study(path: Path, scratch: Path, config: dict[str, Any] | None = None) -> Study:
    """Load a results directory or a bundle (extracted under SCRATCH) and decide it as `summarize` would."""
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(".tar.gz"):
            raise StudyError(f"{path}: a file must be a report bundle (.tar.gz)")
        try:  # stored and referenced files alike (a bundle may hold only what changed since its base)
            root = extract_bundle(path, scratch)
        except (OSError, tarfile.TarError, BundleError) as exc:
            raise StudyError(f"{path}: cannot read the bundle: {exc}") from exc
    elif path.is_dir():
        root = path
    else:
        raise StudyError(f"{path}: no such file or directory")
    results_dir = _results_dir(root)
    config = config if config is not None else _config_near(results_dir)
    settings = Settings.from_config(config)
    results = load_results(results_dir, None, settings.confidence)
    decisions = analyse(results, settings)
    return Study(path, results_dir, config, results, decisions, build_outcome(decisions))


def run(args: argparse.Namespace) -> int:
    """Run `ddsweep compare` from parsed arguments; returns the exit code."""
    configs = []
    for name in (args.config_a, args.config_b):
        try:
            configs.append(yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {} if name else None)
        except (OSError, yaml.YAMLError) as exc:
            print(f"ddsweep compare: cannot read config {name}: {exc}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="ddsweep-compare-") as scratch:
        try:
            a = open_study(Path(args.study_a), Path(scratch) / "a", configs[0])
            b = open_study(Path(args.study_b), Path(scratch) / "b", configs[1])
        except StudyError as exc:
            print(f"ddsweep compare: {exc}", file=sys.stderr)
            return 2
        doc = compare(a, b)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "compare.json", json.dumps(doc, indent=1) + "\n")
    markdown = write_text_atomic(out / "compare.md", render_compare(doc))
    compare_plot(doc, out / "compare.png")
    print(markdown)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` subcommand."""
    parser = subparsers.add_parser(
        "compare", help="compare two studies: matched points' ratios, picks, environment changes",
        description="Compare study B with study A (each a results directory, a directory holding results/, or a "
                    "report bundle): OUT/compare.md, OUT/compare.json and OUT/compare.png.")
    parser.add_argument("study_a", metavar="STUDY_A")
    parser.add_argument("study_b", metavar="STUDY_B")
    parser.add_argument("--out", default="reports/compare", help="output directory (default: reports/compare)")
    parser.add_argument("--config-a", help="study A's config (default: results/study_config.yaml, or the config "
                                           "archived in the bundle)")
    parser.add_argument("--config-b", help="study B's config (default: as for A)")
    parser.set_defaults(func=run)
