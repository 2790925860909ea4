"""Decisions on synthetic studies with known truth, over many random seeds: winners, ties, diagnosis, SLOs."""

from __future__ import annotations

import copy

import pytest
from studies import REGIMES_CONFIG, TruePoint, build

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.launch_model import launch_intervals
from ddsweep.findings.summary import build_outcome

SEEDS = range(100)
MARGIN = 0.02


def settings(**analysis: object) -> Settings:
    """The synthetic studies' settings with analysis overrides."""
    config = copy.deepcopy(REGIMES_CONFIG)
    config["analysis"].update(analysis)
    return Settings.from_config(config)


def grid(decode: list[float]) -> list[TruePoint]:
    """DDTree points differing in budget, with the given true decode speeds."""
    return [TruePoint(f"bs8-b{4 * (i + 1)}-t4-w2048", budget=4 * (i + 1), decode=d, throughput=600 + 10 * i)
            for i, d in enumerate(decode)]


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the decision rule's error rate over 100 simulated studies")
def test_a_named_winner_is_truly_best_or_within_the_margin_in_95_percent_of_seeds() -> None:
    decode = [100.0, 101.5, 99.0, 103.0, 95.0, 90.0, 102.0, 85.0]
    best = max(decode)
    s = settings()
    named = wrong = 0
    for seed in SEEDS:
        outcome = analyse(build(grid(decode), seed), s).regime("latency")
        if outcome.winner is not None:
            named += 1
            truth = decode[[p.point_id for p in grid(decode)].index(outcome.winner)]
            wrong += truth * (1 + MARGIN) < best
    assert wrong <= 0.05 * len(SEEDS), (named, wrong)


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the decision rule's error rate over 100 simulated studies")
def test_a_clear_winner_is_named_in_most_seeds() -> None:
    decode = [100.0, 97.0, 120.0, 95.0, 90.0]
    s = settings()
    names = [analyse(build(grid(decode), seed), s).regime("latency").winner for seed in SEEDS]
    assert names.count("bs8-b12-t4-w2048") >= 0.8 * len(SEEDS), names.count(None)
    assert set(names) <= {"bs8-b12-t4-w2048", None}


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the decision rule's error rate over 100 simulated studies")
def test_two_identical_points_are_tied_in_95_percent_of_seeds() -> None:
    decode = [110.0, 110.0, 100.0, 95.0]
    s = settings()
    twins = {"bs8-b4-t4-w2048", "bs8-b8-t4-w2048"}
    tied = 0
    for seed in SEEDS:
        outcome = analyse(build(grid(decode), seed), s).regime("latency")
        tied += outcome.winner is None and outcome.leader in twins and twins - {outcome.leader} <= set(outcome.tied)
    assert tied >= 0.95 * len(SEEDS), tied


@pytest.mark.slow
@pytest.mark.full("a seed sweep: intervals against tests over 60 simulated studies")
def test_a_printed_comparison_interval_agrees_with_its_test() -> None:
    """A point counts as beaten exactly when the printed interval of the leader's ratio over it lies above
    1 + margin: the interval is two-sided at the level matching the one-sided Holm test."""
    s = settings()
    disagree = checked = 0
    for seed in range(60):
        outcome = analyse(build(grid([100.0, 104.0, 103.0, 99.0]), seed), s).regime("latency")
        for rank, c in enumerate(sorted(outcome.comparisons, key=lambda c: c.p_value)):
            checked += 1
            assert abs(c.ratio.level - (1 - 2 * 0.05 / (3 - rank))) < 1e-12
            if c.beaten:
                assert c.ratio.low > 1 + MARGIN, c
            disagree += (c.ratio.low > 1 + MARGIN) != c.beaten  # only where Holm stopped at an earlier failure
    assert checked == 180 and disagree <= 2, disagree
    pair = analyse(build(grid([100.0, 104.0]), 3), s)
    (c,) = pair.regime("latency").comparisons
    assert c.ratio.level == pytest.approx(0.9) and c.beaten == (c.ratio.low > 1 + MARGIN)


def test_fewer_repeats_than_the_minimum_make_no_decision() -> None:
    decode = [100.0, 130.0]
    outcome = analyse(build(grid(decode), 0, repeats=2), settings()).regime("latency")
    assert outcome.winner is None and outcome.leader == "bs8-b8-t4-w2048"
    assert "no decision possible" in outcome.no_decision and "min_repeats_for_decision" in outcome.no_decision
    assert analyse(build(grid(decode), 0, repeats=2), settings(min_repeats_for_decision=2)).regime(
        "latency").winner == "bs8-b8-t4-w2048"


def diagnosis_study(acceptance: dict[tuple[int, int], float]) -> list[TruePoint]:
    """Points keyed by (budget, block size) with true acceptance."""
    return [TruePoint(f"bs{bs}-b{b}-t4-w2048", budget=b, block_size=bs, acceptance=a)
            for (b, bs), a in acceptance.items()]


def verdicts(points: list[TruePoint], noise: float, seeds: range) -> list[str]:
    """The diagnosis verdict per seed."""
    s = settings()
    return [analyse(build(points, seed, acceptance_noise=noise, shared=0.0), s).diagnosis.verdict for seed in seeds]


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the diagnosis over 100 simulated studies")
def test_drafter_bound_study_is_diagnosed_drafter_bound() -> None:
    # Acceptance plateaus along budget (+1% at the top step) and bs16 buys +2%: the drafter is the limit.
    points = diagnosis_study({(4, 8): 4.2, (8, 8): 4.8, (16, 8): 4.85, (8, 16): 4.9})
    found = verdicts(points, 0.01, range(100))
    assert found.count("drafter-bound") >= 95, found


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the diagnosis over 100 simulated studies")
def test_budget_bound_study_is_diagnosed_budget_bound() -> None:
    points = diagnosis_study({(4, 8): 2.8, (8, 8): 3.6, (16, 8): 4.6, (8, 16): 4.5})
    found = verdicts(points, 0.02, range(100))
    assert found.count("budget-bound") >= 95, found


@pytest.mark.slow
@pytest.mark.full("a seed sweep: the diagnosis over 100 simulated studies")
def test_flat_noisy_study_is_inconclusive() -> None:
    points = diagnosis_study({(4, 8): 4.0, (8, 8): 4.0, (16, 8): 4.0, (8, 16): 4.0})
    found = verdicts(points, 0.08, range(100))
    assert found.count("inconclusive") >= 95, found
    text = analyse(build(points, 1, acceptance_noise=0.08, shared=0.0), settings()).diagnosis.text
    assert "Inconclusive" in text and "95% CI" in text


def test_budget_series_that_disagree_in_sign_make_the_verdict_inconclusive_and_are_named() -> None:
    """budget 4 -> 8 rises by a fifth at topk 1 and falls by a sixth at topk 2: no budget step may be cited."""
    points = [TruePoint("bs8-b4-t1-w2048", budget=4, topk=1, acceptance=4.0),
              TruePoint("bs8-b8-t1-w2048", budget=8, topk=1, acceptance=4.8),
              TruePoint("bs8-b4-t2-w2048", budget=4, topk=2, acceptance=4.8),
              TruePoint("bs8-b8-t2-w2048", budget=8, topk=2, acceptance=4.0)]
    for seed in range(20):
        diagnosis = analyse(build(points, seed, acceptance_noise=0.01, shared=0.0), settings()).diagnosis
        assert diagnosis.verdict == "inconclusive", diagnosis.text
        assert "disagree in sign" in diagnosis.text and "budget-bound" not in diagnosis.text
        rises, falls = diagnosis.text.split("but falls in")
        assert "topk 1" in rises and "topk 2" not in rises and "topk 2" in falls


def test_acceptance_twins_are_no_evidence_about_the_budget() -> None:
    """topk 1 past the spine drafts one chain of 7 at budgets 8 and 16: only the step from budget 4 counts."""
    points = [TruePoint("bs8-b4-t1-w2048", budget=4, topk=1, acceptance=3.0),
              TruePoint("bs8-b8-t1-w2048", budget=8, topk=1, acceptance=4.0),
              TruePoint("bs8-b16-t1-w2048", budget=16, topk=1, acceptance=4.0)]
    plan = {"bs8-b4-t1-w2048": {"alias_group": "bs8-b4-t1-w2048", "twin_group": None},
            "bs8-b8-t1-w2048": {"alias_group": "bs8-b8-t1-w2048", "twin_group": "bs8-b8-t1-w2048"},
            "bs8-b16-t1-w2048": {"alias_group": "bs8-b16-t1-w2048", "twin_group": "bs8-b8-t1-w2048"}}
    without = analyse(build(points, 0, acceptance_noise=0.01, shared=0.0), settings()).diagnosis
    assert without.verdict != "budget-bound"  # the flat twin step 8 -> 16 is all the series shows
    results = build(points, 0, acceptance_noise=0.01, shared=0.0)
    results.plan = plan
    diagnosis = analyse(results, settings()).diagnosis
    assert diagnosis.verdict == "budget-bound", diagnosis.text
    (series,) = diagnosis.series["budget"]
    assert series.point_ids == ["bs8-b4-t1-w2048", "bs8-b8-t1-w2048"] and series.flat == ["bs8-b16-t1-w2048"]
    assert "budget 4 → 8" in diagnosis.text and "Bonferroni" not in diagnosis.text  # a family of one


def test_slo_pick_is_the_best_point_meeting_every_limit_and_failures_are_named() -> None:
    points = [TruePoint("fast-but-slow-start", decode=150.0, ttft_p99=3.0),
              TruePoint("bs8-b8-t4-w2048", decode=120.0, ttft_p99=1.0),
              TruePoint("bs8-b4-t4-w2048", decode=100.0, ttft_p99=0.8)]
    s = settings(priorities={"interactive": {"latency": 1.0, "slo": {"ttft_p99_s": 2.0},
                                             "slo_cell": {"context": 128, "concurrency": 32}}})
    pick = analyse(build(points, 3), s).priority("interactive")
    assert pick.point_id == "bs8-b8-t4-w2048"
    statuses = {pid: checks[0].status for pid, checks in pick.slo.items()}
    assert statuses == {"fast-but-slow-start": "fails", "bs8-b8-t4-w2048": "meets", "bs8-b4-t4-w2048": "meets"}
    goodput = pick.goodput["bs8-b8-t4-w2048"]["goodput_requests_per_s"]
    assert goodput.value == pytest.approx(pick.goodput["bs8-b8-t4-w2048"]["requests_per_s"].value)
    # The failing point's slowest requests miss the limit: its goodput is below its throughput.
    slow = pick.goodput["fast-but-slow-start"]
    assert slow["goodput_requests_per_s"].value < slow["requests_per_s"].value


def test_slo_and_goodput_intervals_rest_on_launches_where_points_ran_in_several() -> None:
    # three repeats in two launches (2+1): the SLO check's interval is the printed figure's, from the launches
    points = [TruePoint("bs8-b8-t4-w2048", decode=120.0, ttft_p99=1.0),
              TruePoint("bs8-b4-t4-w2048", decode=100.0, ttft_p99=0.8)]
    s = settings(priorities={"interactive": {"latency": 1.0, "slo": {"ttft_p99_s": 2.0},
                                             "slo_cell": {"context": 128, "concurrency": 32}}})
    results = build(points, 3)
    results.cells["launch"] = results.cells["repeat"].map({0: 0, 1: 0, 2: 1})
    pick = analyse(results, s).priority("interactive")
    for pid in ("bs8-b8-t4-w2048", "bs8-b4-t4-w2048"):
        check = pick.slo[pid][0].estimate
        printed = launch_intervals(results.cells, {"ttft_p99_s": "ttft_p99_s"}, s.confidence)[(pid, 128, 32,
                                                                                                "ttft_p99_s")]
        assert (check.low, check.high) == printed[:2]
        rate = pick.goodput[pid]["requests_per_s"]
        assert (rate.low, rate.high) == launch_intervals(results.cells, {"r": "requests_per_s"},
                                                         s.confidence)[(pid, 128, 32, "r")][:2]
    within = build(points, 3)  # the same repeats in one launch: the interval of the repeats
    assert pick.slo["bs8-b4-t4-w2048"][0].estimate.high != analyse(within, s).priority(
        "interactive").slo["bs8-b4-t4-w2048"][0].estimate.high


@pytest.mark.parametrize(("shift", "drifts"), [(1.08, True), (1.0, False)])
def test_drift_between_replicates_of_ar_is_a_caveat_with_numbers(shift: float, drifts: bool) -> None:
    ar = {"kind": "ar", "budget": None, "topk": None, "block_size": None, "window": None, "acceptance": None}
    points = [TruePoint("ar", decode=60.0, **ar), TruePoint("ar-end", decode=60.0 * shift, **ar),
              TruePoint("bs8-b8-t4-w2048", decode=150.0)]
    doc = build_outcome(analyse(build(points, 5, noise=0.005), settings())).to_json()
    caveat = next(c for c in doc["caveats"] if c["kind"] == "reference_drift")
    assert "`ar`/`ar-end`" in caveat["text"]
    latency = next(i for i in caveat["items"] if "latency" in i)
    assert latency.startswith("**drift**") is drifts
    assert f"{shift:.2f}" in latency
