"""One sweep point's whole job: start the server, verify its knobs, benchmark, coding eval, record, stop.

`status.json` is written last and only on success, so a point that failed or was interrupted never looks
complete; everything measured before a failure stays on disk next to `failure.json`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddsweep.bench.feasibility import describe as describe_infeasible
from ddsweep.budget import ENV as BUDGET_ENV
from ddsweep.budget import KIND as BUDGET_KIND
from ddsweep.budget import TimeBudget, observed_like
from ddsweep.config.knobs import KNOBS
from ddsweep.config.operational import record_digest, with_operations
from ddsweep.config.records import point_record
from ddsweep.config.study import DEMO_HINT, ConfigError, find_point, load_config
from ddsweep.point.environment import collect_environment
from ddsweep.point.failures import (
    INFRASTRUCTURE,
    Classification,
    classify,
    engine_exceptions,
    previous_failure,
    read_record,
)
from ddsweep.point.gpus import check_gpus
from ddsweep.point.lifecycle import (
    ManagedServer,
    ServerError,
    ServerSpec,
    describe_failed_checks,
    find_free_port,
    log_tail,
    render_server,
    verify_settings,
)
from ddsweep.point.marks import AttemptMarks, wait_for_live_attempts
from ddsweep.point.multinode import group_spec, is_multinode
from ddsweep.point.preflight import PROBE_PORT, Finding
from ddsweep.point.progress import PROGRESS_LOG, logged, to_stderr
from ddsweep.point.signals import Interrupted, install_handlers
from ddsweep.point.workflow_watch import WorkflowWatch, launching_workflow
from ddsweep.slurm import slurm_time_left_s
from ddsweep.storage import read_json, write_json_atomic
from ddsweep.store import STARTED

PORT_ATTEMPTS = 3
# Seconds a server whose requests failed is given to end, before the failure is named a crash or not.
CRASH_GRACE_S = 5.0


class PointFailed(RuntimeError):
    """A point could not be completed; `kind` is one of the error kinds in docs/results-schema.md."""

    def __init__(self, kind: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.classification: Classification | None = None
        self.details = details or {}  # further keys of failure.json (a hang's `hang`)

    @property
    def is_result(self) -> bool:
        """Whether the failure is a configuration result (done.json) rather than the machine's (retried)."""
        return self.classification is not None and self.classification.is_result


@dataclass
class PointRun:
    """Bookkeeping of one run: when it started and which steps it reached."""

    point_id: str
    simulated: bool
    started_utc: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    started: float = field(default_factory=time.monotonic)
    steps: dict[str, str] = field(default_factory=dict)
    startup_s: float | None = None
    failed_cells: list[dict] = field(default_factory=list)  # a partial point's failed benchmark cells
    infeasible_cells: list[dict] = field(default_factory=list)  # cells no prompt of the workload can be sized to

    def record(self, status: str, **extra: Any) -> dict:
        """The status.json / failure.json record."""
        return {"point_id": self.point_id, "status": status, "simulated": self.simulated,
                "started_utc": self.started_utc,
                "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "duration_s": round(time.monotonic() - self.started, 3), "startup_s": self.startup_s,
                "steps": dict(self.steps), "failed_cells": list(self.failed_cells),
                "infeasible_cells": list(self.infeasible_cells), **job_placement(), **extra}


def job_placement() -> dict[str, Any]:
    """Where this run executes: host name, and the Slurm job id and node list when under Slurm."""
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST")}


def _can_import_sglang(python: str) -> bool:
    """Whether the interpreter `python` finds the sglang package."""
    probe = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') "
                            "is None)"], capture_output=True, timeout=120, check=False)
    return probe.returncode == 0


def check_local_engine(record: dict, command: list[str]) -> None:
    """Fail in seconds, before any server start, when the launcher or (for a real server) SGLang/GPU is missing."""
    program = command[0]
    if shutil.which(program) is None and not Path(program).exists():
        raise PointFailed("config", f"the server launcher {program!r} (engine.launcher) is not on PATH; {DEMO_HINT}")
    if record.get("simulated"):
        return
    module = command[command.index("-m") + 1] if "-m" in command[:-1] else ""
    if module.startswith("sglang") and not _can_import_sglang(program):
        raise PointFailed("config", f"SGLang is not installed for {program!r} (engine.launcher); install it "
                          "or point engine.launcher at the Python of your SGLang build; " + DEMO_HINT)


def check_gpus_free(out_dir: Path, progress: Callable[[str], None]) -> None:
    """Fail as infrastructure (`gpus_busy`) when another process computes on the GPUs this job was given; the
    check and its tool (or why it was skipped) are kept in gpu_check.json."""
    check = check_gpus(os.environ)
    write_json_atomic(out_dir / "gpu_check.json", check.as_dict())
    if check.note:
        progress(f"GPU check {check.note}")
    if check.busy:
        raise PointFailed("gpus_busy", check.describe())


def _archive_previous_attempt(out_dir: Path) -> None:
    """Move the files of an earlier attempt into attempts/<time>/, so a rerun never mixes or loses data."""
    entries = [p for p in out_dir.iterdir() if p.name not in ("attempts", STARTED)] if out_dir.exists() else []
    if not entries:
        return
    target = out_dir / "attempts" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    target.mkdir(parents=True)
    for entry in entries:
        entry.rename(target / entry.name)


def _watch_workflow(named: list[str], progress: Callable[[str], None]) -> WorkflowWatch | None:
    """Watch the Snakemake process that launched this job, if one did: when it is gone, name the cause in `named`
    and send this process SIGTERM, which stops the server and records the point as interrupted."""
    workflow = launching_workflow()
    if workflow is None:
        return None

    def gone(cause: str) -> None:
        named.append(cause)
        os.kill(os.getpid(), signal.SIGTERM)

    watch = WorkflowWatch(workflow, gone).start()
    progress(f"watching the workflow that launched this job, {watch.description}: the point stops if it ends")
    return watch


def write_point_file(record: dict, spec: ServerSpec, out_dir: Path, run: PointRun) -> None:
    """point.json: the point's knobs and the server command it runs (or would have run)."""
    write_json_atomic(out_dir / "point.json", {
        "point_id": record["point_id"], "preset": record["point"]["preset"], "kind": record["point"]["kind"],
        "knobs": {k: record["point"][k] for k in KNOBS},
        "command": spec.command, "env": spec.env, "host": spec.host, "port": spec.port,
        "study": record["study"], "simulated": run.simulated, "record_digest": record_digest(record)})


def preflight_errors(path: Path | None) -> list[str]:
    """The errors of a preflight result file (`ddsweep preflight --write`), one line each; none when it passed."""
    if path is None:
        return []
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PointFailed("config", f"cannot read the preflight result {path}: {exc}") from exc
    if result.get("ok", False):
        return []
    errors = [Finding(**f).render().removeprefix("ERROR: ") for f in result.get("findings", [])
              if f.get("level") == "error"]
    return errors or [f"the preflight of {path} did not pass and names no error"]


def _stop_after_preflight(record: dict, out_dir: Path, run: PointRun, errors: list[str]) -> None:
    """Record a point whose preset the preflight refused: its command and why; no server is started."""
    write_point_file(record, render_server(record, PROBE_PORT), out_dir, run)
    run.steps["preflight"] = "failed"
    raise PointFailed("preflight", "stopped by the preflight before any server start: " + "; ".join(errors))


def _start_server(record: dict, out_dir: Path, run: PointRun, progress: Callable[[str], None]) -> ManagedServer:
    """Start the server on a free port (a new one if the port was taken meanwhile) and wait until healthy."""
    engine = record["engine"]
    host = engine["host"]
    for attempt in range(1, PORT_ATTEMPTS + 1):
        spec = render_server(record, find_free_port(host))
        if attempt == 1:
            check_local_engine(record, spec.command)
            if not record.get("simulated"):
                check_gpus_free(out_dir, progress)
        if is_multinode(record):
            spec = group_spec(record, spec.port, out_dir)
        write_point_file(record, spec, out_dir, run)
        server = ManagedServer(spec, out_dir / "server.log", engine["shutdown_timeout_s"])
        progress(f"starting server on {spec.url}: {' '.join(spec.command)}")
        try:
            server.start()
            run.startup_s = server.wait_until_healthy(engine["startup_timeout_s"], progress)
        except ServerError as exc:
            server.stop()
            if exc.kind != "port_in_use":
                raise PointFailed(exc.kind, str(exc)) from exc
            if attempt < PORT_ATTEMPTS:
                progress(f"port {spec.port} was taken before the server bound it; retrying on another port")
                continue
            raise PointFailed("startup_exit", f"the port was already in use on all {PORT_ATTEMPTS} attempts; "
                              f"last attempt: {exc}") from exc
        except BaseException:
            server.stop()
            raise
        progress(f"server healthy after {run.startup_s:.1f} s")
        return server
    raise AssertionError("unreachable: the loop returns or raises")


def _verify(server: ManagedServer, out_dir: Path, run: PointRun) -> dict:
    """Record /server_info and fail the point if the server did not apply every configured knob."""
    try:
        info = server.server_info()
    except ServerError as exc:
        raise PointFailed(exc.kind, str(exc)) from exc
    write_json_atomic(out_dir / "server_info.json", info)
    run.simulated = run.simulated or bool(info.get("simulated"))
    verification = verify_settings(server.spec, info, server.log_path.read_text(errors="replace"))
    write_json_atomic(out_dir / "verification.json", verification)
    if not verification["ok"]:
        raise PointFailed("verify", "the server did not apply the requested settings:\n"
                          + describe_failed_checks(verification))
    return info


def _crash_or(server: ManagedServer, step: str, kind: str, message: str) -> PointFailed:
    """Name a server crash during `step` as such when the process is gone (with the exception it died of, when
    its log has a traceback), else keep the given kind. A dying server's connections close before its process
    has ended, so it is given CRASH_GRACE_S to end: one crash is then named alike on every attempt, which is what
    tells a deterministic crash from the machine's (point/failures.py)."""
    code = server.exited(within_s=CRASH_GRACE_S)
    if code is not None:
        raised = engine_exceptions(server.log_path.read_text(errors="replace") if server.log_path.exists() else "")
        died_of = f": {raised[-1].line}" if raised else ""
        return PointFailed("server_crash", f"the server exited with code {code} during the {step}{died_of} "
                           f"({message}); last log lines:\n{log_tail(server.log_path)}")
    return PointFailed(kind, message)


def _check_alive(server: ManagedServer, step: str, requests_failed: bool,
                 message: str = "its results are incomplete") -> None:
    """Fail the point when the server died during `step`, even if the step tolerated the requests it lost (when
    some failed, the server is given CRASH_GRACE_S to end: it may be dying)."""
    if server.exited(within_s=CRASH_GRACE_S if requests_failed else 0) is not None:
        raise _crash_or(server, step, "server_crash", message)


def _with_failed_cells(message: str, out_dir: Path) -> str:
    """The benchmark's error, preceded by the cells that failed before it (where a dying server first showed)."""
    try:
        earlier = read_json(out_dir / "bench" / "cells.json").get("failed_cells") or []
    except (OSError, ValueError, AttributeError):
        earlier = []
    reasons = [str(cell.get("failure_reason")) for cell in earlier if isinstance(cell, dict)]
    return "; ".join([*(f"failed cell {reason}" for reason in reasons), message])


def _benchmark(record: dict, server: ManagedServer, out_dir: Path, run: PointRun,
               progress: Callable[[str], None]) -> None:
    """Run the benchmark matrix against the server."""
    from ddsweep.bench.cells import BenchmarkError, BenchSettings, infeasible_cells, run_benchmark, without_cells
    from ddsweep.bench.hangs import ServerHang

    bench = record["benchmark"]
    settings = BenchSettings(**{k: v for k, v in bench.items() if k in BenchSettings.__dataclass_fields__})
    try:
        counted: dict[bytes, tuple[int, ...]] = {}  # this server's /tokenize answers, for both
        run.infeasible_cells = infeasible_cells(server.spec.url, settings, counted)
        feasible = without_cells(settings, run.infeasible_cells)
        if feasible is None:
            raise PointFailed("infeasible", "no cell of the benchmark matrix can be measured: "
                              + describe_infeasible(run.infeasible_cells))
        if run.infeasible_cells:
            progress(f"cells not measurable, left out: {describe_infeasible(run.infeasible_cells)}")
        doc = run_benchmark(server.spec.url, out_dir / "bench", feasible, simulated=run.simulated, progress=progress,
                            known=counted)
    except BenchmarkError as exc:
        raise _crash_or(server, "benchmark", "bench_failures", _with_failed_cells(str(exc), out_dir)) from exc
    except ServerHang as exc:  # a server that died closes its connections: a silent one is alive, so no grace
        if server.exited() is not None:
            raise _crash_or(server, "benchmark", "server_crash", str(exc)) from exc
        raise PointFailed("server_hang", _with_failed_cells(str(exc), out_dir), {"hang": exc.record()}) from exc
    _check_alive(server, "benchmark", bool(doc.get("failed_cells")),
                 _with_failed_cells("its results are incomplete", out_dir))
    run.failed_cells = [{key: cell.get(key) for key in ("workload", "context", "concurrency", "repeat",
                                                         "failure_reason")} for cell in doc.get("failed_cells", [])]
    if doc.get("cells") and len(run.failed_cells) == len(doc["cells"]):
        reasons = "; ".join(str(cell["failure_reason"]) for cell in run.failed_cells[:3])
        raise PointFailed("bench_failures", f"no measured cell: all {len(doc['cells'])} cells failed their "
                          f"failure threshold (benchmark.max_failure_fraction); {reasons}")


def _coding_eval(record: dict, server: ManagedServer, out_dir: Path, run: PointRun,
                 progress: Callable[[str], None]) -> None:
    """Run the HumanEval coding eval against the server."""
    from ddsweep.coding.eval import CodingEvalError, CodingSettings, run_coding_eval

    coding = dict(record["coding_eval"])
    coding["model"] = record["target"].get("served_model_name")
    settings = CodingSettings(**{k: v for k, v in coding.items() if k in CodingSettings.__dataclass_fields__})
    # `ar` asks every problem twice: the ar-vs-ar exact-match floor of the losslessness check.
    settings.repeat_answers = bool(coding["ar_repeat"]) and record["preset"]["kind"] == "ar"
    try:
        summary = run_coding_eval(server.spec.url, out_dir / "coding", settings, simulated=run.simulated,
                                  progress=progress)
    except CodingEvalError as exc:
        raise _crash_or(server, "coding eval", "coding", str(exc)) from exc
    _check_alive(server, "coding eval", bool(summary.get("request_failures")))


def run_point(record: dict, out_dir: Path, progress: Callable[[str], None] = to_stderr,
              preflight: Path | None = None, time_limit_lead_s: float = 0) -> dict:
    """Run one point end to end; returns the status record, raises PointFailed (after writing failure.json).

    `preflight`: the preflight result of the point's preset; when it records errors (`sweep.on_preflight_error:
    record`), the point fails with them as its result and no server is started. `time_limit_lead_s`: inside a
    Slurm job with a time limit, the point stops itself (as if interrupted) that long before the limit, so its
    job ends on its own instead of being signalled with the Snakemake that runs it (0: off)."""
    out_dir = Path(out_dir)
    _archive_previous_attempt(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress, to_log = logged(progress, out_dir / PROGRESS_LOG)
    to_log(f"{record['point_id']}: started {datetime.now().astimezone().isoformat(timespec='seconds')} on "
           f"{socket.gethostname()}, pid {os.getpid()}")
    run = PointRun(point_id=record["point_id"], simulated=bool(record.get("simulated")))
    prior = previous_failure(out_dir)
    digest = record_digest(record)

    def failed(exc: PointFailed) -> PointFailed:
        """Classify the failure and write failure.json with its class, attempt and record digest."""
        log_path = out_dir / "server.log"
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        exc.classification = classify(exc.kind, log_text, record.get("failure_patterns") or {}, digest, prior,
                                      str(exc))
        attempt = int(prior.get("attempt") or 1) + 1 if prior else 1
        write_json_atomic(out_dir / "failure.json", run.record(
            "failed", error_kind=exc.kind, error=str(exc), failure_class=exc.classification.failure_class,
            classified_by=exc.classification.why, attempt=attempt, record_sha256=digest, **exc.details))
        to_log(f"FAILED ({exc.kind}, {exc.classification.failure_class}): {exc}")
        return exc
    received: list[str] = []
    left = slurm_time_left_s() if time_limit_lead_s > 0 else None
    cause = f"the Slurm job's time limit (stopped {time_limit_lead_s:g} s before it, resources.signal_lead_s)"
    live: list[ManagedServer] = []
    named: list[str] = []  # why run-point signalled itself: its workflow is gone
    benchmarking = threading.Event()
    previous = install_handlers(received, cause, lambda: [started.terminate() for started in live], named,
                                benchmarking)
    if left is not None:
        signal.setitimer(signal.ITIMER_REAL, max(1.0, left - time_limit_lead_s))
    watch = _watch_workflow(named, progress)
    server: ManagedServer | None = None
    try:
        try:
            refused = preflight_errors(preflight)
            if refused:
                _stop_after_preflight(record, out_dir, run, refused)
            run.steps["server"] = "started"
            server = _start_server(record, out_dir, run, progress)
            live.append(server)
            run.steps["server"] = "ok"
            info = _verify(server, out_dir, run)
            run.steps["verify"] = "ok"
            write_json_atomic(out_dir / "environment.json", collect_environment(
                info, run.simulated, launcher=server.spec.command, launcher_env=server.spec.env))
            if record["benchmark"] is None:  # a full HumanEval job of a recommended point: coding only
                run.steps["bench"] = "skipped"
            else:
                run.steps["bench"] = "started"
                benchmarking.set()
                try:
                    _benchmark(record, server, out_dir, run, progress)
                finally:
                    benchmarking.clear()
                if received:  # the benchmark ended on its own after the signal (its cancellation absorbed)
                    raise Interrupted(received[0])
                run.steps["bench"] = "ok"
            if record["coding_eval"]["enabled"]:
                run.steps["coding"] = "started"
                _coding_eval(record, server, out_dir, run, progress)
                run.steps["coding"] = "ok"
        finally:
            if server is not None:
                killed = server.stop()
                run.steps["stop"] = "ok" if not killed else f"killed {len(killed)} process(es) that ignored SIGTERM"
    except PointFailed as exc:
        if received and exc.kind != "interrupted":
            message = (f"interrupted by {received[0]}; the server was stopped and the point is incomplete (rerun "
                       f"it); what failed after the signal: {exc.kind}: {exc}")
            raise failed(PointFailed("interrupted", message)) from None
        failed(exc)
        raise
    except (Interrupted, asyncio.CancelledError):
        if not received:  # a cancellation no signal asked for
            raise
        message = f"interrupted by {received[0]}; the server was stopped and the point is incomplete (rerun it)"
        raise failed(PointFailed("interrupted", message)) from None
    except OSError as exc:
        error = PointFailed("io", f"could not write results under {out_dir}: {exc}")
        with contextlib.suppress(OSError):
            failed(error)
        error.classification = error.classification or classify("io", "", {}, digest, None)
        raise error from exc
    finally:
        if watch is not None:
            watch.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status = run.record("ok")
    write_json_atomic(out_dir / "status.json", status)
    return status


def _run_point_command(args: argparse.Namespace) -> int:
    """`ddsweep run-point`: run one point from a record (as the workflow does) or from a config and id."""
    try:
        if args.record:
            record = json.loads(args.record)
            if args.operations_json:
                record = with_operations(record, json.loads(args.operations_json))
        else:
            config = load_config(*args.config)
            record = point_record(config, find_point(config, args.point))
    except (ConfigError, json.JSONDecodeError) as exc:
        print(f"ddsweep run-point: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or f"results/points/{record['point_id']}")
    if wait_for_live_attempts(out_dir, to_stderr) and args.done and _finished_record(Path(args.done)):
        print(f"ddsweep run-point: point {record['point_id']} was finished by the attempt this one waited for; its "
              f"record stands ({args.done})", file=sys.stderr)
        return 0
    budget = TimeBudget.from_env(os.environ.get(BUDGET_ENV))
    refusal = budget.refusal(observed=observed_like(out_dir)) if budget is not None else None
    if refusal and args.done:
        _record_not_started(record, out_dir, Path(args.done), refusal)
        print(f"ddsweep run-point: point {record['point_id']} {refusal}", file=sys.stderr)
        return 0
    with AttemptMarks(out_dir) as marks:
        code = _run_and_record(args, record, out_dir, marks)
    return code


def _finished_record(done: Path) -> bool:
    """Whether `done` holds a result of the study (completed, or failed because of its configuration); a failure
    of the machine recorded as persisted runs again in this invocation."""
    record = read_record(done)
    return record.get("status") in ("ok", "failed") and not record.get("persisted")


def _record_not_started(record: dict, out_dir: Path, done: Path, refusal: str) -> None:
    """A point the time budget did not let start: its command, why (failure.json) and a persisted done.json, which
    the next invocation drops and runs again."""
    _archive_previous_attempt(out_dir)
    run = PointRun(point_id=record["point_id"], simulated=bool(record.get("simulated")))
    write_point_file(record, render_server(record, PROBE_PORT), out_dir, run)
    write_json_atomic(out_dir / "failure.json", run.record(
        "failed", error_kind=BUDGET_KIND, error=refusal, failure_class=INFRASTRUCTURE, persisted=True, attempts=0,
        classified_by="the invocation's time budget: no server was started"))
    write_json_atomic(done, done_record(record["point_id"], "failed", BUDGET_KIND, refusal, persisted_after=0))


def _run_and_record(args: argparse.Namespace, record: dict, out_dir: Path, marks: AttemptMarks) -> int:
    """Run the point and write its terminal record (args.done) as the workflow reads it; the exit code."""
    try:
        status = run_point(record, out_dir, preflight=args.preflight, time_limit_lead_s=args.time_limit_lead_s)
    except PointFailed as exc:
        marks.ended(exc.kind, str(exc))
        print(f"ddsweep run-point: point {record['point_id']} FAILED ({exc.kind}): {exc}\n"
              f"  details: {out_dir / 'failure.json'}; server log: {out_dir / 'server.log'}", file=sys.stderr)
        if exc.classification is not None:
            print(f"  {exc.classification.failure_class}: {exc.classification.why}", file=sys.stderr)
        if args.done and exc.is_result:
            write_json_atomic(args.done, done_record(record["point_id"], "failed", exc.kind, str(exc),
                                                     interruptions=marks.interruptions()))
            print(f"  recorded as a result of the study in {args.done}", file=sys.stderr)
            return 0
        if args.done and args.attempt is not None and args.attempt >= args.attempts:
            _record_persisted(out_dir, Path(args.done), record["point_id"], exc, args.attempt, marks.interruptions())
            print(f"  failed-infrastructure on the last of {args.attempts} attempt(s): recorded as this invocation's "
                  f"result of the point in {args.done}; the next invocation runs it again", file=sys.stderr)
            return 0
        if args.done:
            print("  failed-infrastructure: not recorded as a result; Snakemake retries the point "
                  "(resources.retries), and the next invocation runs it again", file=sys.stderr)
        return 143 if exc.kind == "interrupted" else 1
    if args.done:  # the local record first: a job killed while the end mark goes to the store keeps its point
        write_json_atomic(args.done, done_record(record["point_id"], "ok", interruptions=marks.interruptions()))
    marks.ended(None, None)
    label = " [SIMULATED]" if status["simulated"] else ""
    partial = f", PARTIAL: {len(status['failed_cells'])} failed cell(s)" if status["failed_cells"] else ""
    print(f"point {record['point_id']} done in {status['duration_s']:.1f} s{partial}{label}: {out_dir}",
          file=sys.stderr)
    return 0


def done_record(point_id: str, status: str, error_kind: str | None = None, error: str | None = None,
                persisted_after: int | None = None, interruptions: list[dict] | None = None) -> dict:
    """The terminal marker of a point: completed, failed because of its configuration, or (`persisted_after`:
    the attempts it took) failed because of the machine on every attempt of this invocation (one-line reason);
    `interruptions`: earlier attempts of the job that never finished (a lost machine, a signal, a time limit)."""
    reason = (error or "").strip().splitlines()[0] if error else None
    done = {"point_id": point_id, "status": status, "error_kind": error_kind, "reason": reason,
            "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if persisted_after is not None:
        done.update(failure_class=INFRASTRUCTURE, persisted=True, attempts=persisted_after)
    if interruptions:
        done["interrupted_attempts"] = interruptions
    return done


def _record_persisted(out_dir: Path, done: Path, point_id: str, exc: PointFailed, attempts: int,
                      interruptions: list[dict]) -> None:
    """Record an infrastructure failure that outlasted the retries: failure.json and done.json say so."""
    failure = out_dir / "failure.json"
    with contextlib.suppress(OSError, ValueError):
        write_json_atomic(failure, {**read_json(failure), "persisted": True, "attempts": attempts})
    write_json_atomic(done, done_record(point_id, "failed", exc.kind, str(exc), persisted_after=attempts,
                                        interruptions=interruptions))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `run-point` subcommand."""
    parser = subparsers.add_parser("run-point", help="run one sweep point: server, verify, benchmark, coding eval",
                                   description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--point", help="point id from the configuration (with --config)")
    source.add_argument("--record", help="the point's record as JSON (what the workflow passes)")
    parser.add_argument("--operations-json", metavar="JSON",
                        help="with --record: the study's operational settings (timeouts, sandbox isolation), which "
                             "the workflow keeps out of the record so that changing them reruns no point")
    parser.add_argument("--config", "-c", nargs="+", default=["config/config.yaml"], help="configuration file(s)")
    parser.add_argument("--out", help="output directory (default results/points/POINT)")
    parser.add_argument("--preflight", metavar="FILE", type=Path,
                        help="the preflight result of the point's preset (ddsweep preflight --write); when it records "
                             "errors the point fails with them and no server is started")
    parser.add_argument("--done", metavar="FILE",
                        help="write the point's terminal outcome here and exit 0 when it completed or failed "
                             "because of its configuration; interruptions and missing software still exit non-zero")
    parser.add_argument("--attempt", type=int, metavar="N",
                        help="with --done: this job's attempt (Snakemake's, from 1); on the last one (--attempts) an "
                             "infrastructure failure is recorded in --done as persisted, and the job exits 0")
    parser.add_argument("--attempts", type=int, default=1, metavar="N",
                        help="how many attempts Snakemake makes (resources.retries + 1; default 1)")
    parser.add_argument("--time-limit-lead-s", type=float, default=0, metavar="S",
                        help="inside a Slurm job with a time limit: stop the point S seconds before it, recorded as "
                             "interrupted (resources.signal_lead_s; default 0: off)")
    parser.set_defaults(func=_run_point_command)

