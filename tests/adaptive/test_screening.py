"""The adaptive study's selection: clearly worse points are dropped with their reason, points within noise
survive, the baselines always survive, refinement is listed, and the funnel counts stages and job time."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest
from conftest import demo_config

from ddsweep.adaptive.funnel import cost_against_grid, funnel, screen_failure
from ddsweep.adaptive.race import race_round, settle_round
from ddsweep.adaptive.screening import ScreenedFigure, combine, estimate, regime_scores
from ddsweep.adaptive.selection import select, select_round, settled_leaders
from ddsweep.adaptive.stages import job_minutes, stage_estimates
from ddsweep.findings.funnel_section import funnel_block, funnel_markdown, render_funnel

ADAPTIVE = {"sweep": {"strategy": "adaptive", "screen": {"launch_cv": 0.02}}}


def requests(speed: float, n: int = 8, spread: float = 0.02, seed: int = 0, drift: float = 0.0) -> list[dict]:
    """Screening requests of every demo regime cell for a point whose decode speed is about `speed` tok/s: C in
    flight, each streaming a token at a time, so the cell's throughput settles; with `drift` each request runs
    that fraction slower than the one before (a cell that does not settle)."""
    rng = random.Random(seed)
    out = []
    for context, concurrency in ((128, 1), (2048, 1), (128, 8)):
        free = [0.0] * concurrency  # when each of the C slots is free again
        for i in range(n):
            rate = speed * (1 + rng.gauss(0, spread)) / (1 + drift) ** i
            tokens = 32
            decode = (tokens - 1) / rate
            verify = round(tokens * 25 / rate)  # acceptance rises with speed, as on the stand-in
            slot = min(range(concurrency), key=lambda k: free[k])
            start = free[slot]
            chunks = [[0.01 + decode * k / (tokens - 1), k + 1] for k in range(tokens)]
            free[slot] = start + decode + 0.01
            out.append({"context": context, "concurrency": concurrency, "repeat": 0, "index": i, "warmup": False,
                        "error": None, "completion_tokens": tokens, "chunks": chunks,
                        "e2e_s": decode + 0.01, "start_ts": start, "end_ts": start + decode + 0.01,
                        "spec_verify_ct": verify, "acceptance_length": tokens / verify})
    return out


def test_a_clearly_worse_point_is_dropped_with_its_reason():
    config = demo_config(**ADAPTIVE)
    screened = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(82, seed=1)],
                "ar": [requests(40, seed=2)]}
    selection = select(config, screened)
    assert "bs8-b4-t1-w2048" not in selection.survivors
    reason = selection.dropped["bs8-b4-t1-w2048"]
    pattern = r"\u2212(\d+)% vs best at [a-z_ ]+ \(bs8-b8-t4-w2048\), band \u2212(\d+)%\u2026\u2212(\d+)% \(±1.64 se\)"
    match = re.fullmatch(pattern, reason)
    assert match, reason
    assert 10 <= int(match[1]) <= 25 and int(match[2]) > int(match[1]) > int(match[3])
    assert selection.survivors == ["bs8-b8-t4-w2048", "ar"]  # the baseline survives although it is slowest


def test_a_point_within_noise_survives():
    config = demo_config(**ADAPTIVE)
    screened = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(101, seed=1)]}
    selection = select(config, screened)
    assert set(selection.survivors) == set(screened)
    assert not selection.dropped


def _relative(config: dict, screened: dict, point: str, leader: str, regime: str = "latency") -> float:
    """The screened figure of `point` relative to `leader`'s at `regime`, minus one."""
    scores = regime_scores(config, screened)[regime]
    return scores[point].value / scores[leader].value - 1


def test_an_unsettled_point_40_percent_below_the_leader_is_dropped_with_its_widened_band():
    config = demo_config(**ADAPTIVE)
    # its C=1 cells slow down request by request (sub-windows about 25% apart): they never settle
    screened = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(71, seed=3, drift=0.05)]}
    assert _relative(config, screened, "bs8-b4-t1-w2048", "bs8-b8-t4-w2048") == pytest.approx(-0.40, abs=0.03)
    selection = select(config, screened)
    assert selection.survivors == ["bs8-b8-t4-w2048"]
    assert selection.dropped_by == {"bs8-b4-t1-w2048": "widened band"}
    assert "priority latency_first" in selection.unstable["bs8-b4-t1-w2048"]
    pattern = (r"\u2212\d+% vs best at [a-z_ ]+ \(bs8-b8-t4-w2048\), band \u2212(\d+)%\u2026\u2212(\d+)% "
               r"\(±1.64 se and ±(\d+)% unsettled\)")
    match = re.fullmatch(pattern, selection.dropped["bs8-b4-t1-w2048"])
    assert match and int(match[3]) >= 10, selection.dropped  # the spread widened the band, still below the tolerance


def test_an_unsettled_point_within_5_percent_of_the_leader_is_kept_and_never_the_best_compared_with():
    config = demo_config(**ADAPTIVE)
    for speed, seed in ((112, 3), (122, 3)):  # about 4% below the leader, and about 4% above it
        screened = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(speed, seed=seed, drift=0.05)],
                    "bs8-b8-t1-w2048": [requests(82, seed=1)]}
        assert abs(_relative(config, screened, "bs8-b4-t1-w2048", "bs8-b8-t4-w2048")) <= 0.05
        selection = select(config, screened)
        assert "bs8-b4-t1-w2048" in selection.survivors
        assert "priority latency_first" in selection.unstable["bs8-b4-t1-w2048"]
        assert selection.best["priority:latency_first"] == "bs8-b8-t4-w2048"  # the settled figure leads
        assert selection.dropped_by == {"bs8-b8-t1-w2048": "band"}  # a settled comparison still drops
        assert "(bs8-b4-t1-w2048)" not in " ".join(selection.dropped.values())


def test_where_no_figure_settled_the_highest_widened_lower_bound_leads():
    config = demo_config(sweep={"strategy": "adaptive", "screen": {"launch_cv": 0.02, "select_on": "regimes"}})
    drifting = {pid: [requests(speed, seed=seed, drift=0.05)]
                for pid, speed, seed in (("bs8-b8-t4-w2048", 100, 4), ("bs8-b4-t1-w2048", 95, 5),
                                         ("bs8-b8-t1-w2048", 40, 6))}
    scores = regime_scores(config, drifting)["latency"]
    assert all(figure.stable is False for figure in scores.values())
    selection = select(config, drifting)
    assert selection.best["regime:latency"] == "bs8-b8-t4-w2048"
    assert "bs8-b4-t1-w2048" in selection.survivors  # within the widened bands
    assert selection.dropped_by == {"bs8-b8-t1-w2048": "widened band"}  # far below even the leader's lower bound
    text = render_funnel({"stages": {}, "gpu_hours": {}, "survivors": selection.survivors, "dropped": {},
                          "failed": [], "unstable": selection.unstable}, simulated=True)
    assert "`bs8-b4-t1-w2048`: its cell did not settle (regime latency; regime long_context" in text


def test_a_leader_whose_cell_did_not_settle_gets_a_settling_launch(tmp_path):
    far = {"bs8-b8-t4-w2048": [100, 100, 100], "ar": [40, 40, 40]}
    config, previous = _settling(tmp_path, far)
    # settled and far ahead
    assert settle_round(config, tmp_path / "screen", tmp_path / "confirm", previous, 2).settle == []
    drifting = tmp_path / "confirm" / "bs8-b8-t4-w2048" / "launch-2" / "bench" / "requests.jsonl"
    drifting.write_text("".join(json.dumps(r) + "\n" for r in requests(100, seed=2, drift=0.05)))
    assert settle_round(config, tmp_path / "screen", tmp_path / "confirm", previous, 2).settle == ["bs8-b8-t4-w2048"]


def test_larger_launch_noise_keeps_more_points():
    screened = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(85, seed=1)]}
    tight = select(demo_config(**ADAPTIVE), screened)
    loose = select(demo_config(sweep={"strategy": "adaptive", "screen": {"launch_cv": 0.10}}), screened)
    assert "bs8-b4-t1-w2048" in tight.dropped
    assert "bs8-b4-t1-w2048" in loose.survivors


def test_a_near_tie_is_dropped_only_within_the_tolerance():
    exact = {"sweep": {"strategy": "adaptive", "screen": {"launch_cv": 0.0, "select_on": "regimes"}}}
    screened = {"bs8-b8-t4-w2048": [requests(100, n=64, spread=0.001)],
                "bs8-b4-t1-w2048": [requests(99.8, n=64, spread=0.001, seed=1)]}
    assert "bs8-b4-t1-w2048" in select(demo_config(**exact), screened).dropped  # default tolerance 1%
    exact["sweep"]["screen"]["tolerance"] = 0.0
    assert set(select(demo_config(**exact), screened).survivors) == set(screened)


def test_more_launches_narrow_the_between_launch_error():
    config = demo_config(sweep={"strategy": "adaptive", "screen": {"launch_cv": 0.04}})
    one = {"bs8-b8-t4-w2048": [requests(100)], "bs8-b4-t1-w2048": [requests(93, seed=1)]}
    four = {pid: [requests(speed, seed=seed + k) for k in range(4)]
            for pid, speed, seed in (("bs8-b8-t4-w2048", 100, 0), ("bs8-b4-t1-w2048", 93, 10))}
    assert "bs8-b4-t1-w2048" in select(config, one).survivors
    assert "bs8-b4-t1-w2048" in select(config, four).dropped


def _write_screen(root: Path, point_id: str, records: list[dict], minutes: float = 1.0) -> None:
    bench = root / point_id / "bench"
    bench.mkdir(parents=True)
    (bench / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / point_id / "status.json").write_text(json.dumps({"point_id": point_id, "duration_s": minutes * 60}))


def test_the_race_drops_after_each_launch_keeps_baselines_and_points_without_a_completed_launch(tmp_path):
    config = demo_config(sweep={"strategy": "adaptive", "launches": 3,
                                "screen": {"launch_cv": 0.04, "confidence": 0.95, "race_keep": None}})
    screen, confirm = tmp_path / "screen", tmp_path / "confirm"
    speeds = {"bs8-b8-t4-w2048": 100, "bs8-b4-t1-w2048": 93, "ar": 40, "bs8-b8-t1-w2048": 99}
    for pid, speed in speeds.items():  # the baseline's one full launch stands for its screening
        _write_screen(confirm / pid if pid == "ar" else screen, "launch-0" if pid == "ar" else pid,
                      requests(speed, seed=speed))
    previous = select_round(config, screen, list(speeds), None).to_json()
    assert set(previous["survivors"]) == set(speeds)  # one launch cannot separate 7% at launch_cv 0.04
    for k in range(2):
        for pid, speed in speeds.items():
            if pid not in ("bs8-b8-t1-w2048", "ar"):  # its confirmation launches crash: no status.json
                _write_screen(confirm / pid, f"launch-{k}", requests(speed, seed=speed + 1 + k))
    after_first = race_round(config, screen, confirm, previous, 0)
    after_second = race_round(config, screen, confirm, after_first.to_json(), 1)
    assert "bs8-b4-t1-w2048" in after_first.survivors
    assert after_second.survivors == ["bs8-b8-t4-w2048", "bs8-b8-t1-w2048", "ar"]
    assert after_second.dropped["bs8-b4-t1-w2048"].startswith("after confirmation launch 2: \u2212")
    assert [r["stage"] for r in after_second.rounds] == ["screen", "confirm launch 1", "confirm launch 2"]
    assert after_second.rounds[-1] == {"stage": "confirm launch 2", "entered": 4, "kept": 3}
    assert after_second.to_json()["race_launches"] == {"bs8-b4-t1-w2048": 2}  # what the funnel counts


def test_the_race_keeps_at_most_race_keep_plausible_points_but_the_screening_keeps_all(tmp_path):
    screen, confirm = tmp_path / "screen", tmp_path / "confirm"
    speeds = {"bs8-b8-t4-w2048": 100, "bs8-b8-t1-w2048": 99, "bs8-b4-t1-w2048": 98, "bs8-b4-t4-w2048": 97,
              "ar": 40}
    for pid, speed in speeds.items():
        _write_screen(screen, pid, requests(speed, seed=speed))
        _write_screen(confirm / pid, "launch-0", requests(speed, seed=speed + 1))

    def race(keep: int | None) -> dict:
        config = demo_config(sweep={"strategy": "adaptive", "screen": {"launch_cv": 0.04, "race_keep": keep}})
        previous = select_round(config, screen, list(speeds), None).to_json()
        assert set(previous["survivors"]) == set(speeds)  # the screening has no cap
        return race_round(config, screen, confirm, previous, 0).to_json()

    assert set(race(None)["survivors"]) == set(speeds)  # 3% apart: all plausible after two launches
    capped = race(2)
    assert capped["survivors"] == ["bs8-b8-t4-w2048", "bs8-b8-t1-w2048", "ar"]  # the baseline stays uncapped
    reason = capped["dropped"]["bs8-b4-t4-w2048"]
    assert reason.startswith("after confirmation launch 1: \u2212")
    assert reason.endswith("ranked 4 there, and the race keeps 2"), reason
    assert capped["dropped"]["bs8-b4-t1-w2048"].endswith("ranked 3 there, and the race keeps 2")



def test_the_final_screening_round_is_the_races_first_where_the_screening_stands_for_launch_0(tmp_path):
    screen = tmp_path / "screen"
    speeds = {"bs8-b8-t4-w2048": 100, "bs8-b8-t1-w2048": 99, "bs8-b4-t1-w2048": 98, "ar": 40}
    for pid, speed in speeds.items():  # the baseline's one full launch stands for its screening
        _write_screen(tmp_path / "confirm" / pid if pid == "ar" else screen, "launch-0" if pid == "ar" else pid,
                      requests(speed, seed=speed))

    def final(launches: int) -> dict:
        config = demo_config(sweep={"strategy": "adaptive", "launches": launches,
                                    "screen": {"launch_cv": 0.04, "race_keep": 1}})
        round1 = select_round(config, screen, [p for p in speeds if p != "ar"], None).to_json()
        assert set(round1["survivors"]) == set(speeds)  # the first round has no cap
        return select_round(config, screen, [], round1).to_json()

    capped = final(2)  # the candidates' confirmation starts at launch 1: the cap acts now, one per priority
    kept = [p for p in capped["survivors"] if p != "ar"]
    assert "ar" in capped["survivors"] and 1 <= len(kept) < 3, capped
    assert capped["dropped_by"] == dict.fromkeys(capped["dropped"], "race cap") and capped["dropped"], capped
    assert capped["rounds"][-1]["stage"] == "refine, race cap"
    uncapped = final(1)  # the one launch measures the whole matrix: every survivor runs it
    assert set(uncapped["survivors"]) == set(speeds) and uncapped["rounds"][-1]["stage"] == "refine"


def _settling(tmp_path: Path, speeds: dict[str, list[float]], **screen) -> tuple[dict, Path]:
    """A confirmed set (demo study, 3 configured launches: `sweep.launches` 3) whose points' confirmation launches
    run at `speeds` (one speed per launch), and the record of the race before the last configured launch."""
    confirm = tmp_path / "confirm"
    for pid, per_launch in speeds.items():
        for k, speed in enumerate(per_launch):
            _write_screen(confirm / pid, f"launch-{k}", requests(speed, seed=k))
    config = demo_config(sweep={"strategy": "adaptive", "launches": 3,
                                "screen": {"launch_cv": 0.03, "settle_launches": 3, **screen}})
    previous = {"screened": list(speeds), "survivors": list(speeds), "dropped": {}, "best": {}, "refine": [],
                "failed": [], "rounds": [{"stage": "confirm launch 2", "entered": 3, "kept": 3}]}
    return config, previous


def test_settling_sends_the_leader_and_its_close_rival_to_further_launches_until_settled(tmp_path):
    close = {"bs8-b8-t4-w2048": [100, 100, 100], "bs8-b8-t1-w2048": [99, 99, 99], "ar": [40, 40, 40]}
    config, previous = _settling(tmp_path, close)
    after_third = settle_round(config, tmp_path / "screen", tmp_path / "confirm", previous, 2)
    # 1% apart with three launches at launch_cv 0.03: the rival could still be more than 2% better; the baseline,
    # far behind, is settled and launches no more.
    assert after_third.settle == ["bs8-b8-t4-w2048", "bs8-b8-t1-w2048"]
    assert after_third.survivors == list(close)  # settling drops no confirmed point
    assert after_third.rounds[-1] == {"stage": "settle after launch 3", "entered": 3, "kept": 2}
    assert after_third.extra_launches == {}
    for pid in after_third.settle:  # the settling launch (launch 3) puts the rival 10% behind
        _write_screen(tmp_path / "confirm" / pid, "launch-3", requests(100 if pid == "bs8-b8-t4-w2048" else 60))
    after_fourth = settle_round(config, tmp_path / "screen", tmp_path / "confirm", after_third.to_json(), 3)
    assert after_fourth.extra_launches == {"bs8-b8-t4-w2048": [3], "bs8-b8-t1-w2048": [3]}
    assert after_fourth.to_json()["settle"] == []


def test_settling_stops_after_settle_launches_and_counts_only_the_launches_a_point_ran(tmp_path):
    close = {"bs8-b8-t4-w2048": [100] * 3, "bs8-b8-t1-w2048": [99] * 3, "bs8-b4-t1-w2048": [97] * 3,
             "ar": [40] * 3}
    config, previous = _settling(tmp_path, close, settle_launches=1)
    # left from another study: bs8-b4-t1-w2048 ranks third, so race_keep 2 gives it no settling launch
    _write_screen(tmp_path / "confirm" / "bs8-b4-t1-w2048", "launch-3", requests(1500))
    after_third = settle_round(config, tmp_path / "screen", tmp_path / "confirm", previous, 2)
    assert after_third.settle == ["bs8-b8-t4-w2048", "bs8-b8-t1-w2048"]
    for pid in after_third.settle:
        _write_screen(tmp_path / "confirm" / pid, "launch-3", requests(100))
    last = settle_round(config, tmp_path / "screen", tmp_path / "confirm", after_third.to_json(), 3)
    assert last.settle == []  # still unsettled, but the one settling launch has run
    assert set(last.extra_launches) == {"bs8-b8-t4-w2048", "bs8-b8-t1-w2048"}
    assert last.best["priority:latency_first"] == "bs8-b8-t4-w2048"  # the stale 1500 tok/s launch is ignored
    assert settle_round(demo_config(sweep={"strategy": "adaptive", "screen": {"settle_launches": 0}}),
                        tmp_path / "screen", tmp_path / "confirm", previous, 2).settle == []


def test_settling_keeps_at_most_race_keep_points_per_priority(tmp_path):
    close = {"bs8-b8-t4-w2048": [100] * 3, "bs8-b8-t1-w2048": [99.5] * 3, "bs8-b4-t1-w2048": [99] * 3}
    config, previous = _settling(tmp_path, close, race_keep=None)
    assert len(settle_round(config, tmp_path / "screen", tmp_path / "confirm", previous, 2).settle) == 3
    config, previous = _settling(tmp_path / "capped", close, race_keep=2)
    capped = settle_round(config, tmp_path / "capped" / "screen", tmp_path / "capped" / "confirm", previous, 2)
    assert capped.settle == ["bs8-b8-t4-w2048", "bs8-b8-t1-w2048"]


def test_refinement_is_around_the_best_points_or_every_survivor(tmp_path):
    screen = tmp_path / "screen"
    speeds = {"bs8-b8-t4-w2048": 100, "bs8-b4-t1-w2048": 99.5, "bs8-b4-t4-w2048": 60, "bs8-b8-t1-w2048": 61}
    for pid, speed in speeds.items():
        _write_screen(screen, pid, requests(speed, n=32, spread=0.001, seed=int(speed)))
    refine = {"strategy": "adaptive", "refine": {"budget": 2}}
    best = select_round(demo_config(sweep=refine), screen, list(speeds), None)
    assert set(best.best.values()) == {"bs8-b8-t4-w2048"} and "bs8-b4-t1-w2048" in best.survivors
    assert best.refine == ["bs8-b6-t4-w2048"]
    # around every survivor: budget 6 next to bs8-b4-t1 as well, but at block size 8 a budget of 6 <= L = 7 is the
    # spine chain whatever topk, so bs8-b6-t1 and bs8-b6-t4 are one server configuration and only one is refined
    around_all = select_round(demo_config(sweep={**refine, "refine_around": "survivors"}), screen, list(speeds), None)
    assert len(around_all.refine) == 1 and around_all.refine[0] in {"bs8-b6-t1-w2048", "bs8-b6-t4-w2048"}


def test_refinement_is_only_around_a_lead_that_settled():
    best = {"regime:latency": "a", "regime:throughput": "b", "priority:latency_first": "a"}
    unstable = {"a": ["regime latency", "priority latency_first"], "b": ["regime latency"]}
    assert settled_leaders(best, unstable) == ["b"]  # b's lead at throughput settled; a leads on unsettled figures
    assert settled_leaders(best, {"a": ["regime latency"]}) == ["a", "b"]  # a's lead at the priority settled


def test_rounds_list_refinement_points_and_the_funnel_counts_each_stage(tmp_path):
    config = demo_config(sweep={"strategy": "adaptive", "refine": {"budget": 2}})
    screen, confirm = tmp_path / "screen", tmp_path / "confirm"
    for pid, speed in (("bs8-b8-t4-w2048", 100), ("bs8-b4-t1-w2048", 60), ("bs8-b4-t4-w2048", 61),
                       ("bs8-b8-t1-w2048", 99)):
        _write_screen(screen, pid, requests(speed, seed=speed))
    baselines = ["ar", "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048"]
    for pid in baselines[1:]:  # each baseline's one full launch stands for its screening
        _write_screen(confirm / pid, "launch-0", requests(50, seed=7), minutes=3.0)
    (confirm / "ar" / "launch-0").mkdir(parents=True)  # its server exited during startup
    (confirm / "ar" / "launch-0" / "failure.json").write_text(json.dumps({
        "error_kind": "startup_exit", "duration_s": 0, "error": "the server exited with code 1 during startup\n"
                                                                  "last log lines:\nTraceback"}))
    round1 = select_round(config, screen, ["bs8-b8-t4-w2048", "bs8-b4-t1-w2048", "bs8-b4-t4-w2048",
                                           "bs8-b8-t1-w2048"], None, confirm)
    assert round1.failed == ["ar"]
    assert round1.refine == ["bs8-b6-t1-w2048"]  # bs8-b6-t4 is the same chain of 6 (budget 6 <= L = 7)
    _write_screen(screen, "bs8-b6-t1-w2048", requests(104, seed=3), minutes=0.5)
    final = select_round(config, screen, [], round1.to_json(), confirm)
    assert "bs8-b6-t1-w2048" in final.survivors and "bs8-b4-t4-w2048" in final.dropped
    assert "bs8-b4-t1-w2048" in final.dropped  # round-1 reasons are kept
    candidates = [p for p in final.survivors if p not in baselines]
    for pid in candidates:
        for k in range(2):
            (confirm / pid / f"launch-{k}").mkdir(parents=True)
            (confirm / pid / f"launch-{k}" / "status.json").write_text(json.dumps({"duration_s": 120}))
    # left by another study in the same results directory: a third launch, and a point this study dropped
    for stale in (confirm / candidates[0] / "launch-2", confirm / "bs8-b4-t1-w2048" / "launch-0"):
        stale.mkdir(parents=True)
        (stale / "status.json").write_text(json.dumps({"duration_s": 600}))
    doc = funnel(final.to_json(), screen, confirm, gpus=8, launches=2, baselines=baselines)
    assert doc["failures"] == {"ar": {"error_kind": "startup_exit",
                                      "reason": "the server exited with code 1 during startup"}}
    assert screen_failure(tmp_path / "missing")["error_kind"] == "no_results"
    assert doc["stages"]["baselines"] == {"points": 2, "job_min": 6.0}  # measured once each, not screened
    assert doc["stages"]["screen"] == {"points": 4, "job_min": 4.0}
    assert doc["stages"]["refine"] == {"points": 1, "job_min": 0.5}
    assert doc["stages"]["confirm"]["job_min"] == 4.0 * len(candidates)
    raced = {**final.to_json(), "race_launches": {"bs8-b4-t1-w2048": 1}}  # had the race dropped it after launch 1
    assert funnel(raced, screen, confirm, gpus=8, launches=2, baselines=baselines)["stages"]["confirm"][
        "job_min"] == 4.0 * len(candidates) + 10.0
    assert doc["gpu_hours"]["screen"] == 4.0 * 8 / 60
    assert doc["dropped_by_rule"] == {"band": 2, "widened band": 0, "race cap": 0}
    # the jobs that ran in the plan's cost model: 2 baseline launches, 5 screenings, the second launch of each
    # confirmed candidate (its screening stood for the first) and its coding eval
    doc["cost"] = cost = cost_against_grid(config, doc, 2, tmp_path)
    jobs, n = job_minutes(config, 0.0), len(candidates)
    assert cost["cells"] == 0 and cost["unsettled_share"] == 0.0  # these hand-made jobs recorded no cells.json
    assert cost["jobs_estimate_min"] == pytest.approx(2 * jobs["baseline"] + 5 * jobs["screen"]
                                                      + n * jobs["launches"][1] + n * jobs["coding"])
    grid = stage_estimates(config)["grid"]["expected_min"]
    assert cost["ratio_to_grid"] == pytest.approx(cost["jobs_estimate_min"] / grid)
    text = render_funnel(doc, simulated=True)
    assert "Dropped by rule: 2 by the band (clearly worse, figures that settled), 0 by the widened band" in text
    assert f"{cost['ratio_to_grid']:.0%} of the full grid's {cost['grid_estimate_min']:.1f} min" in text
    assert "SIMULATED" in text and "`bs8-b4-t1-w2048`: \u2212" in text
    failed_line = "`ar` failed in screening (startup_exit: the server exited with code 1 during startup)"
    assert f"- {failed_line}" in text
    assert funnel_markdown(tmp_path) == ""
    (screen / "funnel.json").write_text(json.dumps({**doc, "simulated": True}))
    assert funnel_markdown(tmp_path) == text
    block = funnel_block(tmp_path)
    assert block["table"]["rows"][1] == ["screen", 4, 4.0, round(4.0 * 8 / 60, 2)]
    assert any(item.startswith("`bs8-b4-t1-w2048` dropped: \u2212") for item in block["items"])
    assert failed_line in block["items"]


def test_a_throughput_cells_standard_error_is_that_of_its_slowest_request():
    # One wave of 32 requests: the cell's figure is its tokens over the slowest request's time, which varies far
    # more than the mean of the request times; the estimate's error must match the figure's spread.
    rng = random.Random(3)

    def wave() -> list[dict]:
        times = [rng.gauss(10.0, 1.0) for _ in range(32)]
        return [{"context": 128, "concurrency": 32, "warmup": False, "error": None, "completion_tokens": 256,
                 "e2e_s": t, "start_ts": 0.0, "end_ts": t} for t in times]

    figures = [estimate(wave(), "output_throughput_tok_s", 128, 32, 0.0) for _ in range(2000)]
    spread = statistics.stdev(f.value for f in figures) / statistics.fmean(f.value for f in figures)
    errors = statistics.fmean(f.within for f in figures)
    assert errors == pytest.approx(spread, rel=0.15)
    assert errors > 2 * (1.0 / 10.0) / math.sqrt(32)  # the mean's error would be less than half of it


def test_a_throughput_cells_error_ignores_the_spread_of_lengths_that_end_of_sequence_brings():
    # The same prompts give every point and launch the same lengths (lossless decoding): a quarter of the requests
    # stop early at fixed lengths, the rest at max_new_tokens. Only the time per token varies between waves.
    rng = random.Random(4)
    lengths = [16 + 15 * i if i < 8 else 512 for i in range(32)]

    def wave() -> list[dict]:
        times = [n * rng.gauss(0.02, 0.002) for n in lengths]
        return [{"context": 128, "concurrency": 32, "warmup": False, "error": None, "completion_tokens": n,
                 "e2e_s": t, "start_ts": 0.0, "end_ts": t} for n, t in zip(lengths, times, strict=True)]

    figures = [estimate(wave(), "output_throughput_tok_s", 128, 32, 0.0) for _ in range(2000)]
    spread = statistics.stdev(f.value for f in figures) / statistics.fmean(f.value for f in figures)
    assert statistics.fmean(f.within for f in figures) == pytest.approx(spread, rel=0.15)  # the e2e spread: 3x
    # No two requests of the same length (every one ends before max_new_tokens): every request's time per token.
    distinct = [{**r, "completion_tokens": 100 + i, "e2e_s": r["e2e_s"] / 512 * (100 + i)}
                for i, r in enumerate(wave())]
    assert estimate(distinct, "output_throughput_tok_s", 128, 32, 0.0).within > 0


def test_an_unsettled_figure_over_several_launches_is_widened_by_their_spread():
    settled, drifted = ScreenedFigure(100.0, 0.02, 0.03, 7, True), ScreenedFigure(130.0, 0.02, 0.03, 7, False, 0.06)
    both = combine([settled, drifted])
    assert both.stable is False and both.value == pytest.approx(math.sqrt(100 * 130))
    assert both.instability == pytest.approx(math.log(1.3) / 2)  # half the launches' range: more than 0.03
    close = combine([settled, ScreenedFigure(101.0, 0.02, 0.03, 7, False, 0.06)])
    assert close.instability == pytest.approx(0.03)  # the launches' mean instability
    assert combine([settled, settled]).instability == 0.0  # launches that settled are not widened by their spread


def test_the_within_launch_error_of_few_requests_counts_at_students_t():
    # 4 requests (3 degrees of freedom): the 90% quantile is 2.353, not 1.645; the stated launch variation keeps z.
    few = ScreenedFigure(100.0, within=0.05, launch=0.03, df=3)
    assert few.half_width(0.9) == pytest.approx(math.hypot(2.3534 * 0.05, 1.6449 * 0.03), rel=1e-3)
    assert ScreenedFigure(100.0, 0.05, 0.03).half_width(0.9) == pytest.approx(1.6449 * math.hypot(0.05, 0.03), rel=1e-3)
    records = requests(100, n=4)
    assert estimate(records, "decode_tok_s", 128, 1, 0.02).df == 3


def test_screening_takes_its_figures_from_the_shared_definitions_and_refuses_a_tail_percentile():
    cell = requests(100)
    ttft = estimate(cell, "ttft_p50_s", 128, 1, 0.0)
    assert ttft is not None and ttft.value == pytest.approx(0.01)  # the first chunk's time
    tpot = estimate(cell, "tpot_p50_s", 128, 1, 0.0)
    assert tpot is not None and 1 / tpot.value == pytest.approx(estimate(cell, "decode_tok_s", 128, 1, 0.0).value,
                                                                 rel=1e-3)  # medians of 8: mid-points differ
    with pytest.raises(ValueError, match="metric 'ttft_p99_s' cannot rank screened points; use one of decode_tok_s"):
        estimate(cell, "ttft_p99_s", 128, 1, 0.0)
