"""Admission limits from /server_info reach points.csv, and the summary flags comparisons above them."""

from __future__ import annotations

import json
from pathlib import Path

from resultsets import drafter_bound_set, write_results

from ddsweep.analysis.admission import admission_limits
from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.results import load_results
from ddsweep.findings.measurement import verification_caveats


def test_admission_limits_read_the_schedulers_figure_then_the_argument() -> None:
    dflash = {"max_running_requests": 48, "max_total_num_tokens": 500000,
              "internal_states": [{"effective_max_running_requests_per_dp": 48}]}
    assert admission_limits(dflash) == {"max_running_requests": 48, "max_total_num_tokens": 500000}
    plain = {"max_running_requests": None, "dp_size": 2, "max_total_num_tokens": 9000,
             "internal_states": [{"effective_max_running_requests_per_dp": 300}]}
    assert admission_limits(plain)["max_running_requests"] == 600
    assert admission_limits({"max_running_requests": 32}) == {"max_running_requests": 32, "max_total_num_tokens": None}
    assert admission_limits(None) == {"max_running_requests": None, "max_total_num_tokens": None}


def test_points_record_their_limits_and_the_summary_flags_concurrency_above_one(tmp_path: Path) -> None:
    spec = drafter_bound_set()
    results_dir = write_results(spec, tmp_path)
    points = sorted(p for p in (results_dir / "points").iterdir())
    levels = sorted({c["concurrency"] for c in json.loads((points[0] / "bench" / "cells.json").read_text())["cells"]})
    low = levels[-1] - 1  # below the highest concurrency measured
    for i, point in enumerate(points):
        limit = low if i == 0 else levels[-1]
        (point / "server_info.json").write_text(json.dumps({
            "max_running_requests": limit, "max_total_num_tokens": 65536,
            "internal_states": [{"effective_max_running_requests_per_dp": limit}]}))
    results = load_results(results_dir)
    frame = results.points_frame().set_index("point_id")
    assert frame.loc[points[0].name, "max_running_requests"] == low
    assert frame.loc[points[1].name, "max_total_num_tokens"] == 65536
    caveats = verification_caveats(analyse(results, Settings.from_config(spec.config)))
    (block,) = [c for c in caveats if c["kind"] == "admission_limits"]
    assert block["table"]["rows"] == [[f"`{points[0].name}`", str(low), str(levels[-1])]]
