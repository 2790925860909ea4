"""No interval printed that means nothing: from fewer than three samples, or wider than the figure itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from decision_checks import first_section
from resultsets import drafter_bound_set, write_results
from studies import REGIMES_CONFIG, TruePoint, build

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.commands.summarize import summarize
from ddsweep.findings.summary import build_outcome
from ddsweep.formatting import interval_meaningful, no_interval, ratio_dict_text


def test_an_interval_needs_three_samples_and_a_width_below_the_figure() -> None:
    assert interval_meaningful(2.0, 1.9, 2.1, 3)
    assert not interval_meaningful(2.0, 1.9, 2.1, 2)
    assert not interval_meaningful(1.2, 0.0, 34565.0, 5)  # wider than the figure
    assert not interval_meaningful(2.0, None, None, 1)
    assert no_interval(2, ["710", "760"]) == "n = 2: 710–760; more repeats or launches are needed for an interval"
    assert ratio_dict_text({"value": 1.5, "ci_low": 0.0, "ci_high": 34565.0, "n": 2, "level": 0.95}) == (
        "1.50× (n = 2; more repeats or launches are needed for an interval)")
    assert ratio_dict_text({"value": 1.5, "ci_low": 1.4, "ci_high": 1.6, "n": 3, "level": 0.95}) == (
        "1.50× (95% CI 1.40–1.60)")


def test_a_ratio_of_two_launches_pooled_over_the_points_prints_its_interval() -> None:
    # n = 2 launches per point, but the launch variance pooled over the study's points gives 9 degrees of freedom
    launches = {"value": 1.5, "ci_low": 1.4, "ci_high": 1.6, "n": 2, "level": 0.95, "df": 9}
    assert ratio_dict_text(launches) == "1.50× (95% CI 1.40–1.60)"
    assert ratio_dict_text({**launches, "df": 1}) == (
        "1.50× (n = 2; more repeats or launches are needed for an interval)")
    assert interval_meaningful(2.0, 1.9, 2.1, 2, df=2) and not interval_meaningful(2.0, 1.9, 2.1, 5, df=1)


def test_a_speed_up_between_points_run_in_two_launches_is_printed_with_its_interval() -> None:
    points = [TruePoint("ar", decode=60.0, kind="ar", budget=None, topk=None, block_size=None, window=None,
                        acceptance=None), TruePoint("bs8-b8-t4-w2048", decode=150.0),
              TruePoint("bs8-b4-t4-w2048", decode=120.0)]
    results = build(points, 1)
    results.cells["launch"] = results.cells["repeat"].map({0: 0, 1: 0, 2: 1})  # the grid's 2+1 split
    decisions = analyse(results, Settings.from_config(copy.deepcopy(REGIMES_CONFIG)))
    latency = next(o for o in decisions.regimes if o.resolved.regime.name == "latency")
    speedup = latency.resolved.difference("bs8-b8-t4-w2048", "ar").ratio(0.95)
    assert speedup.n == 2 and speedup.df >= 2
    assert ratio_dict_text(speedup.as_dict()).startswith("2.")  # about 150 / 60
    assert "% CI" in ratio_dict_text(speedup.as_dict())


@pytest.mark.slow
def test_a_study_with_two_repeats_prints_no_interval_on_its_first_screen(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results = write_results(spec, tmp_path)
    for path in (results / "points").glob("*/bench/cells.json"):
        doc = json.loads(path.read_text())
        doc["cells"] = [c for c in doc["cells"] if c["repeat"] < 2]
        path.write_text(json.dumps(doc))
    config = {**spec.config, "analysis": {**spec.config.get("analysis", {}), "min_repeats_for_decision": 2}}
    markdown = summarize(results, tmp_path / "reports", config, plots=False).summary_path.read_text()
    screen = "\n".join(first_section(markdown))
    assert "× (n = 2; more repeats or launches are needed for an interval)" in screen
    assert "CI" not in screen


def test_the_caveats_name_the_points_that_ran_in_one_launch_beside_points_that_ran_in_several() -> None:
    # an adaptive study's baselines run once: comparisons with them pair repeats of that one launch
    points = [TruePoint("ar", decode=60.0, kind="ar", budget=None, topk=None, block_size=None, window=None,
                        acceptance=None), TruePoint("bs8-b8-t4-w2048", decode=150.0),
              TruePoint("bs8-b4-t4-w2048", decode=120.0)]
    results = build(points, 1)
    two = results.cells["repeat"].map({0: 0, 1: 0, 2: 1})
    results.cells["launch"] = two.where(results.cells["point_id"] != "ar", 0)
    text = selection_text(results)
    assert "launch is the unit of every interval and test between them" in text
    assert "`ar` ran in one launch: a comparison with it pairs the repeats" in text
    results.cells["launch"] = two  # every point in two launches: nobody to name
    assert "ran in one launch" not in selection_text(results)


def selection_text(results) -> str:
    doc = build_outcome(analyse(results, Settings.from_config(copy.deepcopy(REGIMES_CONFIG)))).to_json()
    return next(c for c in doc["caveats"] if c["kind"] == "selection")["text"]

