"""Cells flagged in the summary: unstable windows, saturated acceptance and first-token stalls."""

from __future__ import annotations

import math

import pandas as pd

from ddsweep.report.quality import cell_flags, measurement_caveat


def _row(repeat: int, stable: bool | None, saturated: bool | None = False, stalls: int | None = 0,
         point: str = "ngram-d16", warmup_settled: bool | None = None) -> dict:
    return {"point_id": point, "context": 512, "concurrency": 8, "repeat": repeat, "stable": stable,
            "warmup_settled": warmup_settled,
            "subwindow_spread": 0.42 if stable is False else 0.03, "saturated": saturated, "stalls": stalls,
            "worst_stall_s": 0.62 if stalls else math.nan, "acceptance_length": 16.0}


def test_flags_of_a_point_at_a_cell_count_unstable_repeats_stalls_and_saturation() -> None:
    cells = pd.DataFrame([_row(0, False, True, 1), _row(1, True, True, 0), _row(0, True, point="ar")])
    flags = cell_flags(cells, "ngram-d16", 512, 8)
    assert flags == {"repeats": 2, "unstable": 1, "unsettled_warmups": 0, "spread": 0.42, "stalls": 1,
                     "worst_stall_s": 0.62, "saturated": True}
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
