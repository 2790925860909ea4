"""The DDTree-vs-chain section: per regime and DFlash baseline, the best DDTree point at the same block size and
window against the chain, with a selection-corrected interval and the baseline's scheduling named."""

from __future__ import annotations

import copy

from studies import REGIMES_CONFIG, TruePoint, build

from ddsweep.analysis.chain import chain_rows, chain_section
from ddsweep.analysis.decisions import Settings, analyse

PRESETS = {"dflash": {"kind": "dflash", "args": ["--speculative-algorithm", "DFLASH", "--port", "{port}"]},
           "dflash-nooverlap": {"kind": "dflash", "args": ["--speculative-algorithm", "DFLASH",
                                                           "--disable-overlap-schedule", "--port", "{port}"]}}


def study(seed: int) -> tuple:
    """DDTree faster than the chain at C=1, slower at C=32; a DDTree point at another window is not matched."""
    points = [TruePoint("bs8-b8-t4-w2048", decode=140.0, throughput=500.0, acceptance=5.0),
              TruePoint("bs8-b4-t1-w2048", budget=4, topk=1, decode=120.0, throughput=560.0, acceptance=4.0),
              TruePoint("bs8-b8-t4-woff", window=None, decode=200.0, throughput=900.0, acceptance=5.0),
              TruePoint("dflash-bs8-w2048", kind="dflash", budget=None, topk=None, decode=110.0,
                        throughput=700.0, acceptance=4.5),
              TruePoint("dflash-nooverlap-bs8-w2048", kind="dflash", budget=None, topk=None, decode=100.0,
                        throughput=650.0, acceptance=4.5)]
    results = build(points, seed)
    results.point("dflash-nooverlap-bs8-w2048").preset = "dflash-nooverlap"
    config = copy.deepcopy(REGIMES_CONFIG)
    config["engine"] = {"presets": PRESETS}
    return analyse(results, Settings.from_config(config))


def test_each_regime_compares_the_best_matched_ddtree_point_with_each_chain_baseline() -> None:
    decisions = study(0)
    rows = {(r["regime"], r["baseline"]): r for r in chain_rows(decisions)}
    assert set(rows) == {(regime, base) for regime in ("latency", "throughput", "max_acceptance")
                         for base in ("dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048")}
    latency = rows[("latency", "dflash-nooverlap-bs8-w2048")]
    assert latency["ddtree"] == "bs8-b8-t4-w2048" and latency["candidates"] == 2  # the woff point is not matched
    assert latency["verdict"] == "DDTree better" and 1.3 < latency["ratio"]["value"] < 1.5
    assert abs(latency["ratio"]["level"] - (1 - 0.05 / 2)) < 1e-9  # Bonferroni over the two candidates
    throughput = rows[("throughput", "dflash-bs8-w2048")]
    assert throughput["ddtree"] == "bs8-b4-t1-w2048" and throughput["verdict"] == "chain better"
    assert rows[("latency", "dflash-nooverlap-bs8-w2048")]["overlap_off"] is True
    assert rows[("latency", "dflash-bs8-w2048")]["overlap_off"] is False


def test_the_section_names_each_ratios_baseline_and_its_scheduling() -> None:
    section = chain_section(study(1))
    text = "\n".join(" | ".join(str(c) for c in row) for row in section["table"]["rows"])
    assert "`dflash-nooverlap-bs8-w2048` (overlap scheduler off, like DDTree)" in text
    assert "`dflash-bs8-w2048` (overlap scheduler on; DDTree runs with it off)" in text
    assert "chain better" in text and "DDTree better" in text
    assert "compare the tree alone" in section["text"]


def test_no_chain_baseline_means_no_section() -> None:
    results = build([TruePoint("bs8-b8-t4-w2048"), TruePoint("bs8-b4-t4-w2048", budget=4)], 0)
    assert chain_section(analyse(results, Settings.from_config(copy.deepcopy(REGIMES_CONFIG)))) is None
