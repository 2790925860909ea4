"""The full HumanEval on the points the summary recommends (`coding_eval.full_on_picks`).

A point job answers the configured subset of HumanEval; losslessness needs the whole set only where a decision
rests on it: the reference `ar` (`full_on_ar`) and the recommended points. After every point, `ddsweep picks`
writes the recommended points (results/coding_full/picks.json); each one is launched once more with every problem
and no benchmark (results/coding_full/<point>/), and the summary reports pass rates and agreement with `ar` in a
section of its own. The picks are not decided again on the full answers: a pick whose answers agree with `ar`
clearly less often than `ar` agrees with itself is named in a caveat, as is a full run that failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddsweep.analysis.results import is_truncated, read_coding_repeat
from ddsweep.coding.lossless import assess_lossless, wilson_interval
from ddsweep.config.plan import HUMANEVAL_PROBLEMS
from ddsweep.storage import read_json, read_jsonl


def recommended_points(document: dict[str, Any]) -> dict[str, list[str]]:
    """Each recommended point of a summary document with the priorities that recommend it."""
    picks: dict[str, list[str]] = {}
    for entry in document["decision"]["priorities"]:
        if entry["recommended"]:
            picks.setdefault(entry["recommended"], []).append(entry["priority"])
    return picks


def answered_all(results_dir: Path, point_id: str) -> bool:
    """Whether the point's own job already answered every HumanEval problem (e.g. `ar` with full_on_ar)."""
    path = results_dir / "points" / point_id / "coding" / "problems.jsonl"
    return path.is_file() and len({r.get("task_id") for r in read_jsonl(path)}) >= HUMANEVAL_PROBLEMS


def _rate(successes: int, trials: int, confidence: float) -> dict[str, Any]:
    """A proportion with its Wilson interval."""
    low, high = wilson_interval(successes, trials, confidence)
    return {"successes": successes, "trials": trials, "rate": successes / trials if trials else None,
            "ci_low": low, "ci_high": high}


def _rate_text(rate: dict[str, Any], confidence: float) -> str:
    if not rate["trials"]:
        return "–"
    return (f"{rate['successes']}/{rate['trials']} = {rate['rate']:.1%} "
            f"({confidence:.0%} CI {rate['ci_low']:.1%}–{rate['ci_high']:.1%})")


def _reference_answers(results_dir: Path, ar_id: str | None) -> tuple[list[dict], list[dict] | None]:
    """ar's answers (its full run when it had one, else its own job's) and its repeated answers (the floor)."""
    if ar_id is None:
        return [], None
    full = results_dir / "coding_full" / ar_id / "coding" / "problems.jsonl"
    own = results_dir / "points" / ar_id / "coding" / "problems.jsonl"
    answers = read_jsonl(full) if full.is_file() else read_jsonl(own) if own.is_file() else []
    return answers, read_coding_repeat(results_dir, ar_id)


def full_coding_block(results_dir: Path, picks_path: Path | None, ar_id: str | None,
                      confidence: float = 0.95) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The summary section on the picks' full HumanEval and the caveats it raises; None when it did not run."""
    if picks_path is None or not picks_path.is_file():
        return None
    doc = read_json(picks_path)
    reference, repeat = _reference_answers(results_dir, ar_id)
    answers_of: dict[str, list[dict[str, Any]]] = {}
    for point_id in sorted(doc["picks"]):
        directory = results_dir / ("coding_full" if point_id in doc["run"] else "points") / point_id
        answers_of[point_id] = (read_jsonl(directory / "coding" / "problems.jsonl")
                                if (directory / "coding").is_dir() else [])
    # every pick against the floor at once, so that the family-wise error holds over them together
    compared = {pid: answers for pid, answers in answers_of.items()
                if pid != ar_id and any(r.get("error_kind") != "request" for r in answers)}
    matches = assess_lossless(reference, repeat, compared, confidence)["points"] if reference and compared else {}
    rows, table, caveats = [], [], []
    for point_id in sorted(doc["picks"]):
        where = "coding_full" if point_id in doc["run"] else "points"
        directory = results_dir / where / point_id
        answers = answers_of[point_id]
        failure = read_json(directory / "failure.json") if (directory / "failure.json").is_file() else None
        answered = [r for r in answers if r.get("error_kind") != "request"]
        passed = _rate(sum(bool(r.get("passed")) for r in answered), len(answered), confidence)
        truncated = sum(is_truncated(r) for r in answered)
        match = matches.get(point_id)
        row = {"point_id": point_id, "priorities": doc["picks"][point_id], "source": where,
               "problems": len(answered), "passed": passed, "truncated": truncated,
               "failure": None if failure is None else {"kind": failure.get("error_kind"),
                                                        "error": failure.get("error")},
               "exact_match": None if match is None else _rate(match["exact_match"], match["compared"], confidence),
               "floor_rate": None if match is None else match["floor_rate"],
               "below_floor": None if match is None else match["below_floor"]}
        rows.append(row)
        table.append([f"`{point_id}`", ", ".join(row["priorities"]),
                      f"{row['problems']}" + (" (its own job)" if where == "points" else ""),
                      _rate_text(passed, confidence), str(truncated),
                      "ar itself" if point_id == ar_id else "no ar answers" if match is None
                      else _rate_text(row["exact_match"], confidence)
                      + ("" if row["floor_rate"] is None else f" (ar vs ar {row['floor_rate']:.1%})")])
        if failure is not None:
            caveats.append({"kind": "full_coding_failed", "title": f"The full HumanEval of `{point_id}` failed",
                            "text": f"{failure.get('error_kind')}: {failure.get('error')}. Its pass rate and "
                                    "agreement with ar rest on the subset its point job answered."})
        elif row["below_floor"]:
            caveats.append({"kind": "full_coding_not_lossless",
                            "title": f"`{point_id}` is not lossless on the full HumanEval",
                            "text": f"It matches ar's answers in {_rate_text(row['exact_match'], confidence)}, "
                                    f"below ar's agreement with itself ({row['floor_rate']:.1%}) with confidence: "
                                    "speculation changed its greedy outputs more often than two runs of ar differ. "
                                    "That is a bug in the build, or numerics that verifying several tokens in one "
                                    "forward pass changes at near-ties; read the differing answers before deploying "
                                    "it."})
    section = {
        "kind": "full_coding", "title": "Full HumanEval on the recommended points",
        "text": ("Each recommended point was launched once more and answered every HumanEval problem "
                 "(coding_eval.full_on_picks); points whose own job had answered them all are read from it. "
                 "Agreement with ar counts identical answers on the problems both answered, next to ar's agreement "
                 "with its own repeat (the floor; greedy decoding is not bit-reproducible). The picks were decided "
                 "on the benchmark and are not decided again here."),
        "table": {"columns": ["point", "recommended for", "problems", "pass rate", "truncated",
                              "identical to ar"], "rows": table},
        "rows": rows,
    }
    if ar_id is not None and len(reference) < max((row["problems"] for row in rows), default=0):
        section["text_after"] = (f"ar answered {len(reference)} problems, so agreement with it covers only those; "
                                 "coding_eval.full_on_ar: true gives it the whole set.")
    return section, caveats
