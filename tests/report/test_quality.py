"""Cells flagged in the summary: unstable windows, saturated acceptance and first-token stalls."""

from __future__ import annotations

import math

import pandas as pd

from ddsweep.findings.quality import cell_flags, measurement_caveat


def _row(repeat: int, stable: bool | None, saturated: bool | None = False, stalls: int | None = 0,
         point: str = "ngram-d16", warmup_settled: bool | None = None, launch: int | None = None,
         tok_s: float = 1000.0) -> dict:
    return {"point_id": point, "workload": "coding", "context": 512, "concurrency": 8, "repeat": repeat,
            "launch": launch, "output_throughput_tok_s": tok_s, "stable": stable,
            "warmup_settled": warmup_settled,
            "subwindow_spread": 0.42 if stable is False else 0.03, "saturated": saturated, "stalls": stalls,
            "worst_stall_s": 0.62 if stalls else math.nan, "acceptance_length": 16.0}


def test_flags_of_a_point_at_a_cell_count_unstable_repeats_stalls_and_saturation() -> None:
    cells = pd.DataFrame([_row(0, False, True, 1), _row(1, True, True, 0), _row(0, True, point="ar")])
    flags = cell_flags(cells, "ngram-d16", 512, 8)
    assert flags == {"repeats": 2, "unstable": 1, "launches_apart": None, "unsettled_warmups": 0, "spread": 0.42,
                     "stalls": 1, "worst_stall_s": 0.62, "saturated": True}
    assert cell_flags(cells, "ar", 512, 8)["unstable"] == 0 and not cell_flags(cells, "ar", 512, 8)["saturated"]


def test_the_caveat_lists_every_flagged_cell_and_none_without_flags() -> None:
    cells = pd.DataFrame([_row(0, False, True, 2, warmup_settled=False), _row(1, None, None, None),
                          _row(0, True, point="ar", warmup_settled=True)])
    caveat = measurement_caveat(cells)
    assert caveat is not None and caveat["items"] == [
        "`ngram-d16` context 512, C=8, repeat 0: unstable, sub-window throughput 42.0% apart",
        "`ngram-d16` context 512, C=8, repeat 0: measured after a warm-up whose throughput had not settled at the cap",
        "`ngram-d16` context 512, C=8, repeat 0: saturated acceptance 16.00 (all drafts accepted)",
        "`ngram-d16` context 512, C=8, repeat 0: 2 first-token stall(s), slowest 0.62 s"]
    assert measurement_caveat(pd.DataFrame([_row(0, True, point="ar")])) is None


def test_launches_of_a_point_that_disagree_on_a_cell_are_flagged_even_when_every_window_settled() -> None:
    """As on an H200: each launch's cell settled (sub-windows within 1%), the launches 2.1x apart."""
    apart = pd.DataFrame([_row(0, True, launch=0, tok_s=196.0), _row(1, True, launch=1, tok_s=94.0),
                          _row(0, True, point="ar", launch=0, tok_s=500.0),
                          _row(1, True, point="ar", launch=1, tok_s=510.0)])
    assert cell_flags(apart, "ngram-d16", 512, 8)["launches_apart"] == 196.0 / 94.0 - 1
    assert cell_flags(apart, "ar", 512, 8)["launches_apart"] is None  # 2% apart: within 5%
    caveat = measurement_caveat(apart)
    assert caveat is not None and caveat["items"] == [
        "`ngram-d16` coding context 512, C=8: server launches 108.5% apart, output throughput 196, 94 tok/s per "
        "launch"]
    one_launch = pd.DataFrame([_row(0, True, tok_s=196.0), _row(1, True, tok_s=94.0)])  # repeats of one server
    assert measurement_caveat(one_launch) is None
    assert cell_flags(one_launch, "ngram-d16", 512, 8)["launches_apart"] is None
