"""`ddsweep summarize`: aggregate every sweep point into tables, plots and the optimization summary."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.drift import load_reference_runs
from ddsweep.analysis.outcome import Outcome, SchemaError
from ddsweep.analysis.results import load_results
from ddsweep.analysis.scope import study_point_ids
from ddsweep.findings.full_coding import recommended_points
from ddsweep.findings.summary import build_outcome, picks_document
from ddsweep.findings.tables import overview_table, write_tables
from ddsweep.plotting.plots import PlotData, write_plots
from ddsweep.report.render import render_markdown
from ddsweep.storage import write_json_atomic, write_text_atomic


@dataclass
class SummaryResult:
    """What `summarize` wrote and the decisions it reached."""

    tables: dict[str, Path]
    plots: dict[str, Path]
    summary_path: Path
    summary_json_path: Path
    outcome: Outcome
    document: dict[str, Any]  # the outcome's JSON form, as summary.json holds it
    regime_winners: dict[str, str | None]
    regime_ties: dict[str, list[str]]
    priority_picks: dict[str, str | None]
    recommended: dict[str, str | None]
    pareto: list[str]
    drafter_bound: bool | None
    simulated: bool


def summarize(results_dir: Path, reports_dir: Path, config: dict[str, Any] | None,
              config_path: Path | None = None, reference: list[Path] | None = None,
              points: list[Path] | None = None, coding_full: Path | None = None,
              plots: bool = True) -> SummaryResult:
    """Write RESULTS_DIR/tables/*.csv, REPORTS_DIR/plots/*.png, REPORTS_DIR/summary.json and the Markdown
    rendered from it, REPORTS_DIR/optimization_summary.md. `reference`: the done.json files of the end-of-study
    reference runs (sweep.reference), compared with the reference point in a caveat only. `points`: the done.json
    files of this study's points (the workflow's inputs); other point directories are named as ignored.
    `coding_full`: the picks.json of the recommended points' full HumanEval runs (coding_eval.full_on_picks).
    `plots` False: no plots (drawing them takes most of the time; the summary does not depend on them)."""
    results_dir, reports_dir = Path(results_dir), Path(reports_dir)
    settings = Settings.from_config(config, config_path)
    results = load_results(results_dir, study_point_ids(config, points), settings.confidence)
    decisions = analyse(results, settings)
    decisions.reference = load_reference_runs(results_dir, reference or [], settings.confidence)
    resolved = [o.resolved for o in decisions.regimes]
    tables = write_tables(results, results_dir / "tables", overview_table(results, resolved, decisions.lossless))
    outcome = build_outcome(decisions, coding_full)
    picks = recommended_points(outcome.to_json())
    plot_data = PlotData(results, {r.regime.name: r for r in resolved}, decisions.pareto, decisions.lossless, picks)
    drawn = write_plots(plot_data, reports_dir / "plots") if plots else {}
    json_path, summary_path = write_summary(outcome, reports_dir)
    return SummaryResult(
        tables=tables, plots=drawn, summary_path=summary_path, summary_json_path=json_path, outcome=outcome,
        document=outcome.to_json(),
        regime_winners={o.resolved.regime.name: o.winner for o in decisions.regimes},
        regime_ties={o.resolved.regime.name: o.tied for o in decisions.regimes},
        priority_picks={p.name: p.point_id for p in decisions.priorities},
        recommended={e.priority: e.recommended for e in outcome.decision.priorities},
        pareto=decisions.pareto, drafter_bound=decisions.diagnosis.drafter_bound, simulated=results.simulated,
    )


def write_summary(outcome: Outcome, reports_dir: Path) -> tuple[Path, Path]:
    """Write REPORTS_DIR/summary.json (the decision object) and the Markdown rendered from it."""
    json_path = write_text_atomic(reports_dir / "summary.json", json.dumps(outcome.to_json(), indent=1) + "\n")
    summary_path = write_text_atomic(reports_dir / "optimization_summary.md", render_markdown(outcome))
    return json_path, summary_path


def summarize_from(summary_json: Path, reports_dir: Path) -> Path:
    """Render REPORTS_DIR/optimization_summary.md from a summary.json alone; the same file `summarize` writes."""
    outcome = Outcome.from_json(json.loads(Path(summary_json).read_text(encoding="utf-8")))
    return write_text_atomic(Path(reports_dir) / "optimization_summary.md", render_markdown(outcome))


def read_inputs(command: str, config_path: str | None,
                results_dir: str) -> tuple[dict[str, Any] | None, Path | None] | None:
    """The study config at `config_path` (None, None without one) for `ddsweep COMMAND`; None, after saying why on
    stderr, when the config cannot be read or the results directory does not exist."""
    config = None
    if config_path:
        try:
            config = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            print(f"ddsweep {command}: cannot read config {config_path}: {exc}", file=sys.stderr)
            return None
    if not Path(results_dir).is_dir():
        print(f"ddsweep {command}: results directory {results_dir} does not exist", file=sys.stderr)
        return None
    return config, Path(config_path) if config_path else None


def run(args: argparse.Namespace) -> int:
    """Run `ddsweep summarize` from parsed arguments; returns the exit code."""
    if args.from_json:
        try:
            print(summarize_from(Path(args.from_json), Path(args.out or Path(args.from_json).parent)))
        except (OSError, ValueError, SchemaError) as exc:
            print(f"ddsweep summarize: cannot render {args.from_json}: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.results_dir or not args.out:
        print("ddsweep summarize: RESULTS_DIR and --out are needed (or --from SUMMARY_JSON)", file=sys.stderr)
        return 2
    inputs = read_inputs("summarize", args.config, args.results_dir)
    if inputs is None:
        return 2
    config, config_path = inputs
    result = summarize(Path(args.results_dir), Path(args.out), config, config_path,
                       [Path(f) for f in args.reference], [Path(f) for f in args.points],
                       Path(args.coding_full) if args.coding_full else None, plots=not args.no_plots)
    print(result.summary_path)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `summarize` subcommand."""
    parser = subparsers.add_parser(
        "summarize", help="aggregate sweep results into tables, plots and the optimization summary",
        description="Aggregate RESULTS_DIR/points/* into RESULTS_DIR/tables/*.csv, REPORTS_DIR/plots/*.png "
                    "REPORTS_DIR/summary.json and REPORTS_DIR/optimization_summary.md (rendered from summary.json); "
                    "with --from, only the Markdown, rendered from a summary.json.")
    parser.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR",
                        help="the results directory (contains points/); not with --from")
    parser.add_argument("--out", metavar="REPORTS_DIR",
                        help="where plots and the summary go (with --from: default, the summary.json's directory)")
    parser.add_argument("--from", dest="from_json", metavar="SUMMARY_JSON",
                        help="render optimization_summary.md from this summary.json alone (the decision object), "
                             "byte for byte what the full summarize writes")
    parser.add_argument("--config", metavar="CONFIG_YAML", help="the study config (regimes, priorities, …)")
    parser.add_argument("--reference", nargs="*", default=[], metavar="DONE_JSON",
                        help="done.json of each end-of-study reference run (results/reference/end-<host>/), "
                             "compared with the reference point's own result; never ranked")
    parser.add_argument("--points", nargs="*", default=[], metavar="DONE_JSON",
                        help="done.json of each of this study's points (the workflow passes them); other directories "
                             "under RESULTS_DIR/points are ignored and named. Default: the configured grid's points")
    parser.add_argument("--coding-full", metavar="PICKS_JSON",
                        help="results/coding_full/picks.json: add the recommended points' full HumanEval "
                             "(coding_eval.full_on_picks) as a section")
    parser.add_argument("--no-plots", action="store_true",
                        help="write the tables and the summary without the plots (drawing them takes most of the time)")
    parser.set_defaults(func=run)
    register_picks(subparsers)


def _picks_command(args: argparse.Namespace) -> int:
    """`ddsweep picks`: write the recommended points and the full HumanEval runs they need."""
    inputs = read_inputs("picks", args.config, args.results)
    if inputs is None:
        return 2
    config, config_path = inputs
    doc = picks_document(Path(args.results), config, config_path, args.points)
    write_json_atomic(args.write, doc)
    print(json.dumps(doc, indent=1))
    return 0


def register_picks(subparsers: argparse._SubParsersAction) -> None:
    """Add the `picks` subcommand (coding_eval.full_on_picks; ddsweep.findings.full_coding)."""
    parser = subparsers.add_parser("picks", help="the recommended points and the full HumanEval runs they need "
                                                 "(coding_eval.full_on_picks)")
    parser.add_argument("results", help="results directory (with points/)")
    parser.add_argument("--config", help="the study's resolved config (results/study_config.yaml)")
    parser.add_argument("--points", nargs="*", type=Path, help="done.json files of this study's points")
    parser.add_argument("--write", required=True, type=Path, help="where to write picks.json")
    parser.set_defaults(func=_picks_command)
