"""Failed points grouped by cause: the same failure on several servers is one line, a not-started point joins its
canary's cause, and the summary opens with the failures when nothing was measured or more than half was lost."""

from __future__ import annotations

from ddsweep.analysis.causes import Failure, cause_text, group_failures, group_text, overview

LIBRARY = ("the server exited with code 1 during startup (port {port}): OSError: Could not load this library: "
           "/venv/deep_gemm/_C.so; last log lines:\nTraceback (most recent call last):")
REFUSED = "the server exited with code 2 during startup (port {port}): launch_server.py: error: unrecognized arguments"


def _failure(point_id: str, error: str, port: int, failure_class: str = "infrastructure") -> Failure:
    return Failure(point_id, "startup_exit", error.format(port=port), failure_class)


def _not_started(point_id: str, canary: str, family: str, port: int) -> Failure:
    return Failure(point_id, "not_started", f"not started: the canary `{canary}` …", "infrastructure",
                   {"point_id": canary, "family": family, "error_kind": "startup_exit",
                    "error": LIBRARY.format(port=port).splitlines()[0].removesuffix("; last log lines:")})


def test_the_cause_leaves_out_what_differs_between_servers():
    assert cause_text(LIBRARY.format(port=40001)) == cause_text(LIBRARY.format(port=51234)) == (
        "the server exited with code 1 during startup: OSError: Could not load this library: /venv/deep_gemm/_C.so")
    assert cause_text("GET http://127.0.0.1:40001/server_info did not answer") == (
        "GET the server/server_info did not answer")


def test_points_that_failed_alike_are_one_group_with_the_points_not_started_because_of_it():
    failures = [_failure("ar", LIBRARY, 40001), _failure("bs8-b4-t1-w2048", LIBRARY, 40002),
                *(_not_started(f"bs8-b{b}-t1-w2048", "bs8-b4-t1-w2048", "sglang-pr29907", 40002) for b in (8, 16)),
                _failure("frefuse-bs8-b8-t4-w2048", REFUSED, 40003, "configuration")]
    library, refused = group_failures(failures)
    assert library.failed == ["ar", "bs8-b4-t1-w2048"] and library.not_started == ["bs8-b8-t1-w2048",
                                                                                  "bs8-b16-t1-w2048"]
    assert library.failure_class == "infrastructure" and refused.failed == ["frefuse-bs8-b8-t4-w2048"]
    assert group_text(library) == (
        "`startup_exit`, the machine's: \"the server exited with code 1 during startup: OSError: Could not load this "
        "library: /venv/deep_gemm/_C.so\" — 2 failed: `ar`, `bs8-b4-t1-w2048` (the canary of build sglang-pr29907); "
        "2 not started because of it: `bs8-b8-t1-w2048`, `bs8-b16-t1-w2048`")
    assert group_text(refused).startswith("`startup_exit`, the configuration's: \"the server exited with code 2")


def test_the_jobs_the_time_budget_did_not_start_are_one_group_of_points_not_started():
    refusals = [Failure(point, "time_budget", f"not started: its estimate ({estimate}, the median of the study's 2 "
                        f"finished job(s)) does not fit the {left} s left of the time budget (budget_s=62)",
                        "infrastructure")
                for point, estimate, left in (("ar", "23 s", 12), ("bs8-b16-t2-w2048", "24 s", 0))]
    (group,) = group_failures(refusals)
    assert group.failed == [] and group.not_started == ["ar", "bs8-b16-t2-w2048"]
    assert group_text(group) == (
        "`time_budget`, the machine's: \"not started: its estimate did not fit the time left of the time budget "
        "(budget_s=62)\" — 2 not started within this invocation's time budget: `ar`, `bs8-b16-t2-w2048`")
    assert overview(4, 2, refusals)["headline"] == "2 of 4 points measured; 2 lost: 0 failed, 2 not started."


def test_the_summary_opens_with_the_failures_when_nothing_or_less_than_half_was_measured():
    lost = [_failure(f"p{i}", LIBRARY, 40000 + i) for i in range(4)]
    nothing = overview(4, 0, lost)
    assert nothing["alarm"] and nothing["headline"] == "0 of 4 points measured; 4 lost: 4 failed, 0 not started."
    assert len(nothing["groups"]) == 1 and nothing["groups"][0]["failed"] == ["p0", "p1", "p2", "p3"]
    assert nothing["next"] and "run the same command again" in nothing["next"][0]
    assert overview(7, 3, lost)["alarm"]  # 4 of 7 lost
    assert not overview(8, 4, lost)["alarm"]  # half is not more than half
    assert not overview(0, 0, [])["alarm"]
