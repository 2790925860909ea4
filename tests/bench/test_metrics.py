"""Statistics helpers against known values."""

from __future__ import annotations

import pytest

from ddsweep import figures
from ddsweep.bench import metrics


def test_percentile_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert figures.percentile(values, 50) == 2.5
    assert figures.percentile(values, 0) == 1.0 and figures.percentile(values, 100) == 4.0
    assert figures.percentile(list(range(1, 101)), 90) == pytest.approx(90.1)
    assert figures.percentiles([5.0]) == {"p50": 5.0, "p90": 5.0, "p99": 5.0}
    assert figures.percentiles([]) == {"p50": None, "p90": None, "p99": None}
    with pytest.raises(ValueError):
        figures.percentile([], 50)


def test_summarize_repeats_skips_missing() -> None:
    doc = metrics.summarize_repeats([10.0, None, 12.0, 11.0])
    assert doc["median"] == 11.0 and doc["values"] == [10.0, None, 12.0, 11.0]
    assert (doc["min"], doc["max"]) == (10.0, 12.0) and "ci_low" not in doc  # no interval claimed here
    assert metrics.summarize_repeats([None])["median"] is None


def test_percentiles_match_single_percentile_on_unsorted_values() -> None:
    values = [9.0, 1.0, 5.0, 3.0, 7.0, 2.0]
    assert figures.percentiles(values, (0, 10, 50, 90, 100)) == {
        f"p{q}": figures.percentile(values, q) for q in (0, 10, 50, 90, 100)}
    assert figures.percentiles(values, (10,)) == {"p10": pytest.approx(1.5)}
    with pytest.raises(ValueError):
        figures.percentiles(values, (101,))


def test_context_check_flags_a_cell_off_its_target_context():
    ok = metrics.context_check([4000, 4096, 4150], 4096, 0.05)
    assert ok["prompt_tokens_off_target"] is False and ok["prompt_tokens_min"] == 4000
    assert abs(ok["prompt_tokens_max_rel_error"] - 96 / 4096) < 1e-12
    off = metrics.context_check([4096, 3000], 4096, 0.05)
    assert off["prompt_tokens_off_target"] is True and off["prompt_tokens_max"] == 4096
    assert metrics.context_check([None, None], 128, 0.05)["prompt_tokens_off_target"] is True


def test_inside_one_cell_a_records_times_are_worked_out_once_and_outside_every_time() -> None:
    record = {"chunks": [[0.1, 1], [0.2, 3], [0.4, 4]], "e2e_s": 0.5, "completion_tokens": 4, "error": None}
    same_fields = dict(record)
    with figures.one_cell():
        first = figures.request_times(record)
        assert figures.request_times(record) is first
        assert figures.request_times(same_fields) is not first and figures.request_times(same_fields) == first
    again = figures.request_times(record)
    assert again is not first and again == first
    assert first.token_gaps_s == pytest.approx([0.05, 0.05, 0.2]) and first.tpot_s == pytest.approx(0.4 / 3)
