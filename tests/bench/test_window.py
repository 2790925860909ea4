"""Cells measured over a window: the stopping rule, stability, first-token stalls and saturated acceptance, against
stand-ins with injected faults, and the figures behind them on hand-made records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from standin import FAST, Sim, healthy_together

from ddsweep import figures, storage
from ddsweep.bench.cells import BenchSettings, prebuilt_extra, run_benchmark
from ddsweep.bench.closed_loop import StopRule

PROSE = {"name": "prose", "kind": "prose", "ignore_eos": True}
DDTREE = ("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8")


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    """Stand-ins started in parallel: a healthy one, one that holds every 9th request 0.6 s before its first token,
    one that slows down steadily while busy, and one whose drafts are always all accepted."""
    started = {"ok": Sim(*DDTREE, *FAST, wait=False),
               "stall": Sim(*DDTREE, *FAST, "--sim-fault", "stall-every:9,0.6", wait=False),
               "drift": Sim(*DDTREE, *FAST, "--sim-fault", "drift:4", wait=False),
               "saturated": Sim(*DDTREE, *FAST, "--sim-accept-fixed", "4", wait=False)}
    yield from healthy_together(started)


def _settings(**changes: object) -> BenchSettings:
    base = {"contexts": [64], "concurrency": [4], "max_new_tokens": 16, "requests_per_cell": 4, "repeats": 1,
            "warmup_requests": 1, "workloads": [PROSE], "min_window_s": 0.6, "max_window_s": 3.0}
    return BenchSettings(**{**base, **changes})


def test_a_cell_runs_its_minimum_window_with_c_in_flight_and_records_it(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["ok"].url, tmp_path, _settings(), simulated=True)
    (cell,) = doc["cells"]
    window = cell["window"]
    measured = [r for r in storage.read_jsonl(tmp_path / "requests.jsonl") if not r["warmup"]]
    assert window["duration_s"] >= 0.6 and window["start_ts"] < window["end_ts"]
    assert window["requests_sent"] == len(measured) == cell["requests"] > 4  # far beyond the 4 requested
    assert 0 < window["requests_measured"] <= window["requests_sent"]
    # The stand-in competes with the client for the CPU: the stop is the monitor's (50 ms bins), the record is
    # recomputed from the raw records and says what it found.
    # On a loaded machine the healthy stand-in may not settle before the cap; either way the record says which
    assert window["stopped_by"] in ("stable", "cap") and window["stable"] == (window["spread"] <= 0.1)
    assert len(window["subwindow_tok_s"]) == 3 and min(window["subwindow_tok_s"]) > 0
    assert len({r["prompt_fingerprint"] for r in measured}) == len(measured)  # no prompt repeats
    assert cell["at_concurrency_fraction"] > 0.5  # C in flight for most of the cell, ramps included
    assert not cell["saturation"]["saturated"]
    # A first token held up by a loaded CPU may count as a stall; each one listed is past the threshold
    stalls = cell["stalls"]
    assert stalls["count"] >= len(stalls["requests"]) and all(s["ttft_s"] > stalls["threshold_s"]
                                                              for s in stalls["requests"])


def test_a_cell_that_never_settles_stops_at_its_cap_and_is_unstable(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["drift"].url, tmp_path, _settings(min_window_s=0.3, max_window_s=1.0), simulated=True)
    window = doc["cells"][0]["window"]
    assert window["stopped_by"] == "cap" and window["stable"] is False
    assert window["spread"] > 0.1 and 1.0 <= window["duration_s"] < 2.5
    first, *_, last = window["subwindow_tok_s"]
    assert last < first  # the server slows down: the last sub-window is the slowest


def test_a_first_token_stall_is_counted_with_its_delay_and_stays_in_the_figures(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["stall"].url, tmp_path, _settings(min_window_s=1.0), simulated=True)
    stalls = doc["cells"][0]["stalls"]
    assert stalls["count"] >= 1
    assert stalls["threshold_s"] == max(10 * stalls["median_ttft_s"], 0.25)
    assert all(0.55 <= s["ttft_s"] < 1.0 and s["delay_s"] == s["ttft_s"] - stalls["median_ttft_s"]
               for s in stalls["requests"])
    assert doc["cells"][0]["ttft_s"]["p99"] >= 0.55  # the stalled requests are part of the measurement


def test_acceptance_of_drafts_always_all_accepted_is_flagged_saturated(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["saturated"].url, tmp_path, _settings(min_window_s=0), simulated=True)
    saturation = doc["cells"][0]["saturation"]
    assert saturation["saturated"] and saturation["tokens_per_step"] == 4
    assert "all 4 tokens" in saturation["reason"]


def test_a_counted_cell_sends_exactly_its_requests(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["ok"].url, tmp_path, _settings(min_window_s=0, requests_per_cell=6), simulated=True)
    assert doc["cells"][0]["requests"] == 6 and doc["cells"][0]["window"]["stopped_by"] == "count"


def test_a_warmup_runs_until_its_throughput_settles_and_is_recorded(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["ok"].url, tmp_path, _settings(warmup_window_s=0.3), simulated=True)
    (warmup,) = doc["warmups"]
    assert (warmup["context"], warmup["concurrency"]) == (64, 4)
    assert warmup["requests"] > 1 and warmup["window"]["min_window_s"] == 0.3  # far beyond warmup_requests: 1
    assert warmup["window"]["stopped_by"] in ("stable", "cap") and warmup["window"]["duration_s"] >= 0.3
    records = storage.read_jsonl(tmp_path / "requests.jsonl")
    assert sum(r["warmup"] for r in records) == warmup["requests"] and len(doc["cells"]) == 1
    warm = [r["prompt_fingerprint"] for r in records if r["warmup"]]
    assert len(set(warm)) == len(warm)  # every prompt of the warm-up is new


def test_a_warmup_that_never_settles_stops_at_the_cap_and_says_so(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["drift"].url, tmp_path, _settings(warmup_window_s=0.3, min_window_s=0,
                                                                      max_window_s=1.0),
                        simulated=True)
    window = doc["warmups"][0]["window"]
    assert window["stopped_by"] == "cap" and window["stable"] is False and window["spread"] > 0.1
    assert doc["cells"][0]["requests"] == 4  # the measured cell runs after it all the same


def test_a_counted_warmup_sends_exactly_its_requests(sims, tmp_path: Path) -> None:
    doc = run_benchmark(sims["ok"].url, tmp_path, _settings(warmup_requests=2, min_window_s=0), simulated=True)
    (warmup,) = doc["warmups"]
    assert warmup["requests"] == 2 and warmup["window"]["stopped_by"] == "count"


# --------------------------------------------------------------------------- the figures, on hand-made records
def _record(index: int, ttft: float, tokens: list[int], verify: int | None = None, start: float = 100.0) -> dict:
    chunks = [[ttft + 0.01 * k, sum(tokens[: k + 1])] for k in range(len(tokens))]
    return {"index": index, "start_ts": start, "end_ts": start + chunks[-1][0], "e2e_s": chunks[-1][0],
            "chunks": chunks, "completion_tokens": sum(tokens), "spec_verify_ct": verify, "error": None,
            "concurrency": 1}


def test_stalls_need_ten_times_the_median_and_the_floor() -> None:
    records = [_record(i, 0.01, [1, 2]) for i in range(9)] + [_record(9, 0.2, [1, 2]), _record(10, 0.9, [1, 2])]
    found = figures.stalls(records)
    assert found["count"] == 1 and found["threshold_s"] == 0.25  # 0.2 s is 20x the median but under the floor
    assert found["requests"] == [{"index": 10, "ttft_s": 0.9, "delay_s": pytest.approx(0.89)}]
    assert figures.stalls(records, floor_s=0.1)["count"] == 2


def test_saturation_allows_a_partial_last_step_but_not_one_partial_step_in_the_middle() -> None:
    full = [_record(i, 0.01, [1, 4, 4, 4, 2], verify=4) for i in range(3)]  # 15 tokens: ceil(15 / 4) = 4 steps
    assert figures.saturation(full)["saturated"]
    assert figures.saturation(full)["tokens_per_step"] == 4
    partial = [*full[:2], _record(2, 0.01, [1, 4, 3, 4, 3], verify=5)]
    assert not figures.saturation(partial)["saturated"]
    assert not figures.saturation([_record(0, 0.01, [1, 4, 4], verify=2)])["saturated"]  # too few steps to tell


def test_saturation_is_found_where_one_chunk_carried_several_steps_and_not_where_steps_differ() -> None:
    # SGLang streams the latest of the outputs queued since its last event: 8 is two steps of 4
    coalesced = [_record(i, 0.01, [1, 4, 8, 4, 2], verify=5) for i in range(3)]  # 19 tokens: ceil(19 / 4) = 5
    assert figures.saturation(coalesced)["saturated"] and figures.saturation(coalesced)["tokens_per_step"] == 4
    uneven = [_record(i, 0.01, [1, 4, 6, 4, 2], verify=5) for i in range(3)]  # a step of 2 inside the 6
    assert not figures.saturation(uneven)["saturated"]


def test_spread_and_prebuilt_prompts() -> None:
    assert figures.spread([100.0, 110.0, 90.0]) == pytest.approx(0.2)
    assert figures.spread([5.0]) is None
    rule = StopRule(8, min_window_s=20, max_window_s=60)
    assert prebuilt_extra(rule, 2.0, 4) == 48 + 8 - 8  # 2/s x 20 s x 1.2, plus 2C, less the 8 planned
    assert prebuilt_extra(rule, None, 4) == 0 and prebuilt_extra(StopRule(8), 2.0, 4) == 0


def test_the_plan_counts_a_cell_as_at_least_its_window() -> None:
    from ddsweep.config.plan import cell_minutes

    assert cell_minutes({"cell_min": 0.02}, {"min_window_s": 20}) == pytest.approx(1 / 3)
    assert cell_minutes({"cell_min": 1.5}, {"min_window_s": 20}) == 1.5


def test_the_plan_counts_every_launchs_warmups_as_at_least_their_window() -> None:
    from ddsweep.config.plan import warmup_minutes

    bench = {"contexts": [512, 2048], "concurrency": [1, 8], "workloads": [{"name": "coding"}],
             "warmup_requests": 2, "warmup_window_s": 30}
    assert warmup_minutes(bench) == pytest.approx(4 * 0.5)  # four (context, concurrency) groups of 30 s
    assert warmup_minutes({**bench, "warmup_requests": 0}) == 0.0


def test_the_cap_never_cuts_a_cell_below_its_requests_only_failures_stop_it_earlier() -> None:
    from ddsweep.bench.closed_loop import _decide, _Watch

    rule = StopRule(4, min_window_s=1.0, max_window_s=5.0, max_failure_fraction=0.5)
    watch = _Watch(origin=0.0, window_start=0.5, completed=3)
    assert _decide(watch, rule, [], now=100.0, started=0.0) is None  # far past the cap, 3 of 4 requests ended
    watch.completed = 4
    assert _decide(watch, rule, [], now=100.0, started=0.0) == "cap"
    failing = _Watch(origin=0.0, completed=1, failed=3)
    assert _decide(failing, rule, [], now=0.2, started=0.0) == "failures"


def _back_to_back(slowdown: float, duration: float = 2.0) -> list:
    """Records of a C=1 cell of 10-token requests sent back to back for `duration` seconds, each request's tokens
    `slowdown` times slower than the one before."""
    from ddsweep.bench.records import RequestRecord

    records, t, per_token = [], 0.0, 0.01
    while t < duration:
        rec = RequestRecord(64, 1, 0, len(records), False, completion_tokens=10, start_ts=t, end_ts=t + 10 * per_token,
                            e2e_s=10 * per_token, chunks=[[per_token * k, k] for k in range(1, 11)])
        records.append(rec)
        t, per_token = rec.end_ts, per_token * (1 + slowdown)
    return records


def test_a_cell_the_record_would_call_unsettled_is_extended_within_its_cap() -> None:
    from ddsweep.bench.closed_loop import _decide, _Watch

    rule = StopRule(4, min_window_s=1.0, max_window_s=3.0)
    steady, slowing = _back_to_back(0.0), _back_to_back(0.03)
    assert not figures.stability([vars(r) for r in slowing])["stable"]
    for records, expected in ((steady, "stable"), (slowing, None)):
        # the monitor's 50 ms bins agree in both cells; only the requests themselves tell the slowing one apart
        watch = _Watch(origin=0.0, window_start=0.0, completed=len(records), bins=dict.fromkeys(range(40), 5))
        assert _decide(watch, rule, records, now=2.0, started=0.0) == expected
    watch = _Watch(origin=0.0, window_start=0.0, completed=len(slowing), bins=dict.fromkeys(range(70), 5))
    assert _decide(watch, rule, slowing, now=3.1, started=0.0) == "cap"  # extended up to its cap, no further
