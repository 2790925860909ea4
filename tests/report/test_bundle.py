"""Report bundles: create + verify round trip, tamper detection, no overwrite, atomic naming."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from resultsets import simulated_set, write_results

from ddsweep.analysis.decisions import Settings, analyse
from ddsweep.analysis.results import load_results
from ddsweep.cli import main
from ddsweep.findings.summary import build_outcome
from ddsweep.report.bundle import MANIFEST, create_bundle, extract_bundle, verify_bundle
from ddsweep.report.render import render_markdown
from ddsweep.storage import write_text_atomic

NOW = 1_750_000_000.0


@pytest.fixture
def study(tmp_path: Path) -> dict[str, Path]:
    """A results directory with tables, a reports directory with a summary and a plot, and a config."""
    spec = simulated_set()
    results = write_results(spec, tmp_path)
    (results / "tables").mkdir()
    (results / "tables" / "points.csv").write_text("point_id,simulated\nar,True\n", encoding="utf-8")
    reports = tmp_path / "reports"
    text = render_markdown(build_outcome(analyse(load_results(results), Settings.from_config(spec.config))))
    write_text_atomic(reports / "optimization_summary.md", text)
    (reports / "plots").mkdir()
    (reports / "plots" / "pareto.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    config = tmp_path / "study.yaml"
    config.write_text("study: demo\n", encoding="utf-8")
    return {"results": results, "reports": reports, "config": config}


def rewrite(bundle: Path, target: Path, change: dict[str, bytes | None], add: dict[str, bytes] | None = None) -> Path:
    """Copy a bundle, replacing (bytes) or dropping (None) members named by their path below the top dir."""
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(target, "w:gz") as dst:
        top = ""
        for member in src:
            top, _, name = member.name.partition("/")
            data = src.extractfile(member).read()
            if name in change:
                if change[name] is None:
                    continue
                data = change[name]
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
        for name, data in (add or {}).items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return target


def members(bundle: Path) -> dict[str, bytes]:
    """The bundle's files by path below the top directory."""
    with tarfile.open(bundle, "r:gz") as tar:
        return {m.name.partition("/")[2]: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_create_then_verify_round_trip(study: dict[str, Path]) -> None:
    bundle = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    assert bundle.parent == study["reports"] / "bundles"
    match = re.fullmatch(r"demo-(\d{8}T\d{6}Z)-([0-9a-f]{8})\.tar\.gz", bundle.name)
    assert match and match.group(1) == datetime.fromtimestamp(NOW, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    files = members(bundle)
    manifest = files.pop(MANIFEST)
    assert match.group(2) == hashlib.sha256(manifest).hexdigest()[:8]
    assert {"reports/optimization_summary.md", "reports/plots/pareto.png", "results/tables/points.csv",
            "config/study.yaml", "results/points/ar/point.json", "results/points/ar/server.log",
            "results/points/ar/coding/problems.jsonl", "results/points/ar/bench/cells.json"} <= set(files)
    lines = manifest.decode().splitlines()
    assert len(lines) == len(files)
    for line in lines:
        digest, name = line.split("  ", 1)
        assert hashlib.sha256(files[name]).hexdigest() == digest
    report = verify_bundle(bundle)
    assert report.ok and report.checked == len(files)
    assert not list(bundle.parent.glob(".*"))


def test_tampering_is_detected(study: dict[str, Path], tmp_path: Path) -> None:
    bundle = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    changed = verify_bundle(rewrite(bundle, tmp_path / "changed.tar.gz",
                                    {"reports/optimization_summary.md": b"# a different conclusion\n"}))
    assert changed.changed == ["reports/optimization_summary.md"] and not changed.ok
    missing = verify_bundle(rewrite(bundle, tmp_path / "missing.tar.gz", {"config/study.yaml": None}))
    assert missing.missing == ["config/study.yaml"] and not missing.ok
    extra = verify_bundle(rewrite(bundle, tmp_path / "extra.tar.gz", {}, add={"notes.txt": b"hi"}))
    assert extra.extra == ["notes.txt"] and not extra.ok
    no_manifest = verify_bundle(rewrite(bundle, tmp_path / "nomanifest.tar.gz", {MANIFEST: None}))
    assert not no_manifest.ok and any(MANIFEST in p for p in no_manifest.problems)
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not an archive")
    assert not verify_bundle(garbage).ok


def test_consistently_altered_manifest_contradicts_the_bundle_name(study: dict[str, Path], tmp_path: Path) -> None:
    bundle = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    files = members(bundle)
    new_summary = b"# forged\n"
    manifest = files[MANIFEST].decode().replace(
        hashlib.sha256(files["reports/optimization_summary.md"]).hexdigest(), hashlib.sha256(new_summary).hexdigest())
    forged = rewrite(bundle, tmp_path / bundle.name, {"reports/optimization_summary.md": new_summary,
                                                      MANIFEST: manifest.encode()})
    report = verify_bundle(forged)
    assert not report.changed and not report.ok
    assert any("name" in p for p in report.problems)


def test_an_existing_bundle_is_never_overwritten(study: dict[str, Path]) -> None:
    first = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    before = first.read_bytes()
    second = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    assert second != first and second.name.startswith(first.name.removesuffix(".tar.gz"))
    assert first.read_bytes() == before
    assert verify_bundle(second).ok
    (study["reports"] / "optimization_summary.md").write_text("# changed\n", encoding="utf-8")
    third = create_bundle("demo", study["results"], study["reports"], study["config"], now=NOW)
    assert third.name.split("-")[-1] != first.name.split("-")[-1]


def test_cli_create_and_verify(study: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "archive"
    code = main(["bundle", "create", "--study", "demo", "--results", str(study["results"]), "--reports",
                 str(study["reports"]), "--config", str(study["config"]), "--out", str(out)])
    assert code == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == out and path.exists()
    assert main(["bundle", "verify", str(path)]) == 0
    assert "OK:" in capsys.readouterr().out
    tampered = rewrite(path, tmp_path / "t.tar.gz", {"results/tables/points.csv": b"point_id\n"})
    assert main(["bundle", "verify", str(tampered)]) == 1
    assert "changed: results/tables/points.csv" in capsys.readouterr().out
    assert main(["bundle", "create", "--study", "bad name", "--results", str(study["results"]), "--reports",
                 str(study["reports"]), "--config", str(study["config"])]) == 1


def _bundle(study: dict[str, Path], now: float, **kwargs: object) -> Path:
    return create_bundle("demo", study["results"], study["reports"], study["config"], now=now, **kwargs)


def test_a_second_bundle_stores_only_what_changed_and_verifies_and_extracts_whole(study, tmp_path):
    first = _bundle(study, NOW)
    (study["reports"] / "optimization_summary.md").write_text("changed summary\n", encoding="utf-8")
    second = _bundle(study, NOW + 60)
    stored_first, stored_second = members(first), members(second)
    assert "BASE.json" not in stored_first
    changed = {n for n in stored_second if n not in (MANIFEST, "BASE.json")}
    assert changed == {"reports/optimization_summary.md"}  # every other file is referenced
    base = json.loads(stored_second["BASE.json"])
    assert base == {"bundle": first.name, "manifest_sha256": hashlib.sha256(stored_first[MANIFEST]).hexdigest()}
    report = verify_bundle(second)
    assert report.ok and report.checked == len(stored_first) - 1, report
    top = extract_bundle(second, tmp_path / "out")
    files = {p.relative_to(top).as_posix(): p.read_bytes() for p in top.rglob("*") if p.is_file()}
    assert files == {**stored_first, MANIFEST: stored_second[MANIFEST],
                     "reports/optimization_summary.md": b"changed summary\n"}
    assert sum(p.stat().st_size for p in (first, second)) < 2 * first.stat().st_size


def test_a_bundle_whose_base_is_gone_names_it_and_the_files_it_lacks(study):
    first = _bundle(study, NOW)
    (study["reports"] / "optimization_summary.md").write_text("changed\n", encoding="utf-8")
    second = _bundle(study, NOW + 60)
    first.unlink()
    report = verify_bundle(second)
    assert not report.ok and any(f"base bundle {first.name} is not next to" in p for p in report.problems)
    assert "results/tables/points.csv" in report.missing and "reports/optimization_summary.md" not in report.missing


def test_prune_keeps_the_newest_and_makes_the_oldest_kept_whole(study, tmp_path):
    paths = []
    for k in range(3):
        (study["reports"] / "optimization_summary.md").write_text(f"summary {k}\n", encoding="utf-8")
        paths.append(_bundle(study, NOW + 60 * k))
    assert main(["bundle", "prune", "--keep", "2", "--dir", str(paths[0].parent)]) == 0
    assert [p.exists() for p in paths] == [False, True, True]
    assert "BASE.json" not in members(paths[1]) and "BASE.json" in members(paths[2])
    assert len(members(paths[1])) > len(members(paths[2]))  # the kept base stores every file, the newest one
    assert verify_bundle(paths[1]).ok and verify_bundle(paths[2]).ok
    assert (extract_bundle(paths[2], tmp_path / "x") / "reports" / "optimization_summary.md").read_text() == \
        "summary 2\n"
