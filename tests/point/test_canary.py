"""The canary start: each engine build's canary (the `ar` baseline, else its cheapest point), what its record says
about the build's set-up, the not-started records of a blocked build, and how the next invocation drops them."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import demo_config

from ddsweep.cli import main
from ddsweep.config.families import canaries_line, canary_records, families, first_stage, job_dirs
from ddsweep.point.canary import NOT_STARTED, decide, shared_cause
from ddsweep.point.failures import drop_persisted_records

ONE_LAUNCH = {"sweep": {"launches": 1}}
LIBRARY = ("the server exited with code 1 during startup (port 40123): OSError: Could not load this library: "
           "/venv/deep_gemm/_C.so; last log lines:\nTraceback (most recent call last):\n...")


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _failed(job_dir: Path, kind: str = "startup_exit", error: str = LIBRARY, failure_class: str = "infrastructure",
            server: str = "started", persisted: bool = True) -> None:
    """A job's failure.json and done.json as run-point leaves them after its last attempt."""
    point_id = job_dir.parent.name if job_dir.name.startswith("launch-") else job_dir.name
    _write(job_dir / "failure.json", {"point_id": point_id, "status": "failed", "error_kind": kind,
                                      "error": error, "failure_class": failure_class, "steps": {"server": server},
                                      "classified_by": "why", **({"persisted": True} if persisted else {})})
    _write(job_dir / "done.json", {"point_id": point_id, "status": "failed", "error_kind": kind,
                                   "reason": error.splitlines()[0],
                                   **({"persisted": True, "attempts": 1} if persisted else {})})


def test_each_build_starts_with_ar_or_its_cheapest_point():
    config = demo_config(**ONE_LAUNCH)
    by_name = {f.name: f for f in families(config)}
    assert by_name["sglang"].canary == "ar" and set(by_name["sglang"].others) == {
        "dflash-bs8-w2048", "dflash-nooverlap-bs8-w2048"}
    ddtree = by_name["sglang-pr29907"]
    # the smallest verify width (budget 4 + 1), then the first in expansion order; aliases do not run
    assert ddtree.canary == "bs8-b4-t1-w2048" and "bs8-b8-t8-w2048" not in ddtree.members
    assert ddtree.members[0] == ddtree.canary and len(ddtree.members) == 5
    assert canaries_line(config).endswith(": ar (sglang, before 2 other point(s)), bs8-b4-t1-w2048 (sglang-pr29907, "
                                          "before 4 other point(s))")
    # a study's own preset without a build is a family of its own
    custom = {**config["engine"]["presets"]["ddtree"]}
    custom.pop("build")
    config = demo_config(engine={"presets": {"mine": custom}}, sweep={
        "launches": 1, "points": [{"preset": "mine", "budget": 16, "topk": 4, "block_size": 8, "window": 2048}]})
    assert {f.name: f.canary for f in families(config)}["mine"] == "mine-bs8-b16-t4-w2048"


def test_the_first_stage_is_where_the_first_server_launches_write():
    results = Path("results")
    config = demo_config(**ONE_LAUNCH)
    assert first_stage(config) == "points" and job_dirs(config, results, "ar") == [results / "points/ar"]
    config = demo_config()  # the demo's two launches per point
    assert job_dirs(config, results, "ar") == [results / "launches/ar/launch-0", results / "launches/ar/launch-1"]
    assert canary_records(config, results)[0] == results / "launches/ar/launch-0/done.json"
    config = demo_config(sweep={"strategy": "adaptive"})
    assert first_stage(config) == "screen" and job_dirs(config, results, "ar") == [results / "confirm/ar/launch-0"]
    # a baseline is measured once, not screened: its one launch is its first job; a candidate's is its screening
    assert job_dirs(config, results, "bs8-b8-t4-w2048") == [results / "screen/bs8-b8-t4-w2048"]


def test_only_a_start_up_failure_on_the_machine_is_a_cause_the_build_shares(tmp_path):
    _failed(tmp_path / "shared")
    assert shared_cause(tmp_path / "shared") == {
        "error_kind": "startup_exit", "classified_by": "why", "failure_class": "infrastructure",
        "error": "the server exited with code 1 during startup (port 40123): OSError: Could not load this library: "
                 "/venv/deep_gemm/_C.so"}
    _failed(tmp_path / "refused", error="exited with code 2: unrecognized arguments", failure_class="configuration",
            persisted=False)
    _failed(tmp_path / "crashed", kind="server_crash", server="ok")
    _failed(tmp_path / "stopped", kind="interrupted")
    _write(tmp_path / "ok/done.json", {"point_id": "ok", "status": "ok"})
    for name in ("refused", "crashed", "stopped", "ok", "missing"):
        assert shared_cause(tmp_path / name) is None, name


def test_a_blocked_build_records_its_other_jobs_as_not_started_and_keeps_every_record(tmp_path):
    config = demo_config()  # two launches per point: the canary's second launch is not started either
    results = tmp_path / "results"
    _failed(results / "launches/bs8-b4-t1-w2048/launch-0")
    _write(results / "launches/ar/launch-0/done.json", {"point_id": "ar", "status": "ok"})
    kept = results / "launches/bs8-b8-t1-w2048/launch-1"
    _write(kept / "done.json", {"point_id": "bs8-b8-t1-w2048", "status": "ok"})
    verdicts = {v.family: v for v in decide(config, results)}
    assert verdicts["sglang"].status == "ok" and not verdicts["sglang"].not_started
    blocked = verdicts["sglang-pr29907"]
    assert blocked.status == "blocked" and blocked.cause["error_kind"] == "startup_exit"
    written = {Path(d).relative_to(results).as_posix() for d in blocked.not_started}
    others = ("bs8-b8-t1-w2048", "bs8-b8-t4-w2048", "bs16-b8-t4-w2048", "bs8-b8-t4-woff")
    assert written == {"launches/bs8-b4-t1-w2048/launch-1",
                       *(f"launches/{p}/launch-{k}" for p in others for k in (0, 1))} - {
                           "launches/bs8-b8-t1-w2048/launch-1"}
    assert json.loads((kept / "done.json").read_text())["status"] == "ok"  # a record is never replaced
    job = results / "launches/bs8-b8-t4-w2048/launch-0"
    done = json.loads((job / "done.json").read_text())
    assert done["status"] == "failed" and done["error_kind"] == NOT_STARTED and done["persisted"] is True
    failure = json.loads((job / "failure.json").read_text())
    assert failure["failure_class"] == "infrastructure" and failure["canary"]["point_id"] == "bs8-b4-t1-w2048"
    assert failure["canary"]["family"] == "sglang-pr29907" and failure["steps"] == {}
    assert ("not started: the canary `bs8-b4-t1-w2048` of build sglang-pr29907 failed at start-up on the machine "
            "(startup_exit: the server exited with code 1 during startup (port 40123): OSError: Could not load "
            f"this library: /venv/deep_gemm/_C.so; its failure.json and server.log are in {results}/launches/"
            "bs8-b4-t1-w2048/launch-0)") in failure["error"]
    point = json.loads((job / "point.json").read_text())
    assert point["knobs"]["budget"] == 8 and "--speculative-ddtree-budget" in point["command"]
    assert not (job / "server.log").exists()  # no server was started

    # the next invocation drops the canary's record and every not-started one, and the verdict with the summary
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/summary.json").write_text("{}")
    (results / "canary.json").write_text("{}")
    ids = {p for f in families(config) for p in f.members}
    dropped = drop_persisted_records(results, ids, ["points", "launches"], canary_records(config, results))
    assert len(dropped) == 1 + len(written)
    assert not (results / "canary.json").exists() and not (tmp_path / "reports/summary.json").exists()


def test_a_canary_that_failed_because_of_its_configuration_stops_nothing(tmp_path):
    config = demo_config(**ONE_LAUNCH)
    results = tmp_path / "results"
    _failed(results / "points/bs8-b4-t1-w2048", error="unrecognized arguments", failure_class="configuration",
            persisted=False)
    _failed(results / "points/ar", kind="server_crash", server="ok")
    out = tmp_path / "canary.json"
    assert main(["canary", "--config-json", json.dumps(config), "--results", str(results), "--write", str(out)]) == 0
    verdicts = {v["family"]: v for v in json.loads(out.read_text())["families"]}
    assert verdicts["sglang-pr29907"]["status"] == "failed" and verdicts["sglang"]["status"] == "failed"
    assert not any(v["not_started"] for v in verdicts.values())
    assert sorted(p.name for p in (results / "points").iterdir()) == ["ar", "bs8-b4-t1-w2048"]
