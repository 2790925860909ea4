"""The summary's first screen: the decision per priority, ties resolved to the cheapest member, the exact
launch command, the best point per load level and the Pareto plot of per-user speed against throughput."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from configs import study_yaml
from decision_checks import check_first_screen, first_section
from resultsets import ResultSetSpec, drafter_bound_set, write_results

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.load_levels import schedule
from ddsweep.analysis.results import load_results
from ddsweep.analysis.ties import cheapest, cheapest_unbeaten, point_cost
from ddsweep.commands.summarize import summarize
from ddsweep.findings.launch import shell_line, without_port
from ddsweep.plotting.plots import PLOTS, PlotData
from ddsweep.point.lifecycle import render_server

PRESETS = study_yaml()["engine"]["presets"]


def with_rendered_commands(results: Path) -> Path:
    """Give every point.json the command and environment its preset renders, as run-point records them."""
    for path in sorted((results / "points").glob("*/point.json")):
        point = json.loads(path.read_text())
        record = {"point": {**point["knobs"], "preset": point["kind"], "kind": point["kind"]},
                  "preset": PRESETS[point["kind"]],
                  "engine": {"host": "127.0.0.1", "launcher": ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]},
                  "target": {"model_path": "/models/target", "served_model_name": "target",
                             "server_args": ["--tp-size", "8"]},
                  "drafter": {"model_path": "/models/drafter with space"}}
        spec = render_server(record, 31234)
        path.write_text(json.dumps({**point, "command": spec.command, "env": spec.env, "port": spec.port}))
    return results


@pytest.fixture(scope="module")
def summarized(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResultSetSpec, dict, str, Path]:
    """The seed-like synthetic study (ties in latency_first and balanced) summarized once."""
    root = tmp_path_factory.mktemp("first_screen")
    spec = drafter_bound_set()
    result = summarize(with_rendered_commands(write_results(spec, root)), root / "reports", spec.config,
                       plots=False)
    return spec, result.document, result.summary_path.read_text(), root


@pytest.mark.slow
def test_first_screen_names_each_decision_its_ratios_and_its_launch_command(summarized: tuple) -> None:
    _, document, markdown, _ = summarized
    check_first_screen(markdown, document, PRESETS)
    screen = "\n".join(first_section(markdown))
    assert "## Recommended default per priority" not in screen
    launch = next(p["launch"] for p in document["decision"]["priorities"] if p["recommended"] == "bs8-b8-t4-w2048")
    assert launch["removed"] == ["--port", "31234"]
    assert launch["argv"][-2:] == ["--tp-size", "8"] or "--tp-size" in launch["argv"]  # the target's arguments
    assert "'/models/drafter with space'" in launch["shell"]  # quoted, ready to paste


@pytest.mark.slow
def test_a_tie_recommends_its_cheapest_member_and_lists_the_rest(summarized: tuple) -> None:
    _, document, markdown, _ = summarized
    by_name = {p["priority"]: p for p in document["decision"]["priorities"]}
    balanced = by_name["balanced"]
    assert balanced["status"] == "tied" and len(balanced["tied_set"]) > 1
    widths = {pid: int(pid.split("-b")[1].split("-")[0]) + 1 for pid in balanced["tied_set"]}
    assert balanced["recommended"] == min(widths, key=lambda pid: (widths[pid], pid))
    assert balanced["recommended"] != balanced["leader"]  # the leader is not the cheapest here
    assert balanced["cost"]["verify_width"] == widths[balanced["recommended"]]
    firm = by_name["throughput_first"]
    assert firm["status"] == "firm" and firm["recommended"] == firm["leader"] == "bs8-b4-t4-w2048"
    priorities = {p["name"]: p for p in document["priorities"]}
    assert priorities["balanced"]["recommended"] == balanced["recommended"]
    for regime in document["regimes"]:
        if regime["tied"]:
            assert regime["recommended"] in [regime["leader"], *(t["point_id"] for t in regime["tied"])]
            assert f"recommended **`{regime['recommended']}`** (cheapest)" in markdown


@pytest.mark.slow
def test_gives_up_compares_with_each_other_regimes_leader(summarized: tuple) -> None:
    _, document, _, _ = summarized
    throughput = next(p for p in document["decision"]["priorities"] if p["priority"] == "throughput_first")
    latency = next(g for g in throughput["gives_up"] if g["regime"] == "latency")
    assert latency["best"] == "bs8-b8-t4-w2048" and not latency["is_best"]
    assert latency["ratio"]["value"] == pytest.approx(140 / 160, rel=1e-3)
    assert latency["ratio"]["ci_high"] < 1


@pytest.mark.slow
def test_load_levels_table_and_schedule(summarized: tuple) -> None:
    _, document, markdown, _ = summarized
    load = document["load_levels"]
    assert load["context"] == 128 and [lv["concurrency"] for lv in load["levels"]] == [1, 8, 32]
    assert load["levels"][-1]["recommended"] == "bs8-b4-t4-w2048" and load["levels"][-1]["status"] == "firm"
    assert load["schedule"][0][0] == 1 and load["schedule"][-1][1] == 32
    for start, end, pid in load["schedule"]:
        for level in load["levels"]:
            if start <= level["concurrency"] <= end:
                assert pid in (level["tied_set"] or [level["leader"]])
    assert "## Best configuration per load level" in markdown
    assert "| 32 | `bs8-b4-t4-w2048` | firm |" in markdown
    if load["changes"]:
        assert "**The best point changes with load**" in markdown


def test_schedule_switches_as_rarely_as_the_ties_allow(tmp_path: Path) -> None:
    results = load_results(write_results(drafter_bound_set(), tmp_path))
    levels = [(1, ["a", "b"], "a"), (4, ["b", "c"], "c"), (8, ["c"], "c"), (16, ["d"], "d")]
    assert schedule(levels, results) == [[1, 7, "b"], [8, 15, "c"], [16, 16, "d"]]
    assert schedule([(1, ["x"], "x"), (2, ["x", "y"], "y")], results) == [[1, 2, "x"]]


def test_cost_prefers_the_plans_verify_width(tmp_path: Path) -> None:
    results = load_results(write_results(drafter_bound_set(), tmp_path))
    assert point_cost(results, "bs8-b8-t4-w2048").verify_width == 9  # budget + 1 without a plan
    assert point_cost(results, "dflash-bs8").verify_width == 8 and point_cost(results, "ar").verify_width == 1
    results.plan = {"bs8-b8-t4-w2048": {"tree": {"verify_width": 3}}}
    assert cheapest(results, ["bs8-b4-t4-w2048", "bs8-b8-t4-w2048"]) == "bs8-b8-t4-w2048"
    assert cheapest(results, ["bs16-b8-t4-w2048", "bs8-b8-t2-w2048"]) == "bs8-b8-t2-w2048"  # block size next


def test_a_tie_recommends_the_cheapest_member_no_other_member_beats(tmp_path: Path) -> None:
    results = load_results(write_results(drafter_bound_set(), tmp_path))
    tied = ["bs8-b8-t4-w2048", "bs8-b4-t4-w2048", "dflash-bs8"]  # verify widths 9, 5, 8
    assert cheapest_unbeaten(results, tied, lambda a, b: False) == "bs8-b4-t4-w2048"
    # the chain beats the cheapest member with confidence (both only tied with the leader): the chain is next
    assert cheapest_unbeaten(results, tied, lambda a, b: (a, b) == ("dflash-bs8", "bs8-b4-t4-w2048")) == "dflash-bs8"
    assert cheapest_unbeaten(results, tied, lambda a, b: True) == "bs8-b4-t4-w2048"  # all beaten: the cheapest
    assert cheapest_unbeaten(results, [], lambda a, b: False) is None


def test_without_port_drops_only_the_port_option() -> None:
    argv = ["sglang", "--port", "31234", "--max-running-requests", "31234", "--nccl-port=31234", "--tp", "8"]
    assert without_port(argv, 31234) == (["sglang", "--max-running-requests", "31234", "--tp", "8"],
                                         ["--port", "31234", "--nccl-port=31234"])
    assert without_port(argv, None) == (argv, [])
    assert shell_line(["a b", "c"], {"V": "x y"}) == "V='x y' 'a b' c"


def test_pareto_plot_has_one_curve_per_point_interval_bars_and_labelled_picks(summarized: tuple) -> None:
    spec, document, _, root = summarized
    results = load_results(root / "results")
    decisions = analyse(results, Settings.from_config(spec.config))
    picks: dict[str, list[str]] = {}
    for entry in document["decision"]["priorities"]:
        picks.setdefault(entry["recommended"], []).append(entry["priority"])
    data = PlotData(results, {o.resolved.regime.name: o.resolved for o in decisions.regimes}, decisions.pareto,
                    decisions.lossless, picks)
    fig = PLOTS["pareto_per_user"](data)
    try:
        ok = {p.point_id for p in results.ok_points()}
        for ax in fig.axes[:2]:
            curves = {c.get_label().removesuffix(" (pick)"): c for c in ax.containers}
            assert set(curves) == ok  # one curve per point
            for curve in curves.values():
                line, _, bars = curve.lines
                assert len(line.get_xdata()) == 3  # C = 1, 8, 32
                assert len(bars) == 2 and all(len(b.get_segments()) == 3 for b in bars)  # x and y interval bars
        notes = [t.get_text() for ax in fig.axes for t in ax.texts]
        for pid, names in picks.items():
            assert any(note.startswith(pid) and ", ".join(names) in note for note in notes)
        tops = [child.get_xlabel() for ax in fig.axes for child in ax.child_axes]
        assert tops and all("per GPU" in label and "8 GPUs" in label for label in tops)
    finally:
        plt.close(fig)


def test_caveats_that_would_change_the_decision_come_first(tmp_path: Path) -> None:
    from resultsets import broken_set, simulated_set

    from ddsweep.findings.first_screen import decision_block

    spec = broken_set()
    decisions = analyse(load_results(write_results(spec, tmp_path / "broken")), Settings.from_config(spec.config))
    caveats = decision_block(decisions)["caveats"]
    bad = [p.point_id for p in decisions.results.points if p.shown_status != "ok"]
    assert bad and caveats[0]["kind"] == "failed_points" and all(f"`{pid}`" in caveats[0]["text"] for pid in bad[:4])
    spec = simulated_set()
    decisions = analyse(load_results(write_results(spec, tmp_path / "sim")), Settings.from_config(spec.config))
    block = decision_block(decisions)
    assert block["caveats"][0]["kind"] == "simulated" and len(block["caveats"]) <= 2


def test_a_study_that_lost_more_than_half_its_points_opens_with_what_failed(tmp_path: Path) -> None:
    from resultsets import broken_set

    from ddsweep.findings.summary import build_outcome
    from ddsweep.report.render import render_markdown

    spec = broken_set()  # 2 of 6 points completed
    decisions = analyse(load_results(write_results(spec, tmp_path / "broken")), Settings.from_config(spec.config))
    markdown = render_markdown(build_outcome(decisions))
    lines = markdown.splitlines()
    opening = lines.index("## More than half of the points were lost")
    assert opening < lines.index("## Decision") and opening <= 4, lines[:8]
    assert lines[opening + 2] == "2 of 6 points measured; 4 lost: 4 failed, 0 not started."
    causes = [line for line in lines[opening:lines.index("## Decision")] if line.startswith("- ")]
    assert len(causes) == 4 and any("`startup_timeout`" in c and "`bs8-b4-t4-w2048`" in c for c in causes)
    assert any(line.startswith("Next: ") for line in lines[opening:lines.index("## Decision")])
    fine = drafter_bound_set()
    decisions = analyse(load_results(write_results(fine, tmp_path / "fine")), Settings.from_config(fine.config))
    assert render_markdown(build_outcome(decisions)).splitlines().index("## Decision") <= 4
