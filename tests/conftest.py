"""Shared fixtures: the demo study configuration and point records built from it; how tests are spread over
pytest-xdist workers (pyproject.toml runs `-n auto --dist loadgroup --no-loadscope-reorder`).

Two tiers (pyproject.toml's `-m 'not full'`):
- The fast tier, `pytest`: every test not marked `full`. Every module's unit tests, the contract tests against the
  committed fixtures (the strict stand-in, the GPU captures) and one small end-to-end study (the smoke study,
  tests/workflow/test_smoke.py). It is the loop to run while changing the code.
- The full tier, `pytest -m full` (.ci/run runs it after the fast tier): what runs Snakemake (the demo in full,
  the adaptive study, the fault studies, resumes), Slurm, the real SGLang, the sandbox pools and the decision rule's
  seed sweeps. A test joins it with `pytest.mark.full(reason)`, the reason saying why it is not in the fast tier.

Rules that keep the suite fast and safe in parallel:
- A test that takes more than about a second (it starts Snakemake, many stand-ins, a sandbox pool, a browser) is
  marked `slow`: the slow tests start first, and `pytest -m "not slow and not full"` is the quickest subset.
- Tests that share a module-scoped fixture (one Snakemake run, one stand-in) run on one worker, in file order:
  `pytest_collection_modifyitems` below groups them by module. A test needing another group says so with
  `pytest.mark.xdist_group(name)`. Slurm tests run side by side on the one test cluster (.ci/slurm-up.sh gives
  its node more CPU slots than cores): none may depend on the queue being otherwise empty.
- No fixed ports (standin.free_port), no files outside tmp_path, no Snakemake run in the repository itself
  except `--lint` (those carry `xdist_group("repo-root")`), no process left behind. A module does no expensive
  work at import (every worker imports every module): load SGLang and start servers in fixtures.
- Workflow tests reuse one run of a study where they only read its results (a module fixture; or a session fixture
  made with `shared_study` and marked `across_workers`, which runs the study once for all workers so that its
  readers need not wait on one worker), and make their own copy (`shutil.copytree`) before changing it, unless the
  test order in the module is the point.
"""

from __future__ import annotations

import compileall
import copy
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from configs import study_yaml
from standin import free_port

from ddsweep.config.records import point_record
from ddsweep.config.study import find_point, merge_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def demo_config(**sections: dict) -> dict:
    """The demo configuration (merged over the study configuration, as Snakemake does), with sections updated."""
    config = study_yaml()
    merge_config(config, yaml.safe_load((ROOT / ".test" / "config.yaml").read_text()))
    merge_config(config, copy.deepcopy(sections))
    return validate_config(config)


def demo_record(point_id: str = "bs8-b8-t4-w2048", sim_args: list[str] | None = None, strict: bool = False,
                **sections: dict) -> dict:
    """A point record from the demo configuration; `sim_args` are appended to the stand-in's command line.

    The stand-in is lenient unless `strict` (loading SGLang's classes costs seconds of CPU per start; the
    contract tests start it strict)."""
    config = demo_config(**sections)
    strictness = ["--sim-strict", "auto" if strict else "off"]
    config["engine"]["launcher"] = config["engine"]["launcher"] + strictness + (sim_args or [])
    return point_record(config, find_point(config, point_id))


@pytest.fixture
def small_bench() -> dict:
    """A benchmark section small enough for unit tests."""
    return {"contexts": [64], "concurrency": [1, 2], "max_new_tokens": 16, "requests_per_cell": 2, "repeats": 1,
            "warmup_requests": 1}


def copy_workflow(dest: Path, strict_standin: bool = False) -> Path:
    """A working copy of the workflow (its own results/ and .snakemake/), sharing the package sources.

    Its demo configurations start the stand-in lenient unless `strict_standin`: a strict stand-in loads SGLang's
    classes at every start (about 7 s of CPU), and the tests of scheduling and selection start dozens. The demo
    study test (tests/workflow/test_workflow.py) and the contract tests run it strict."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "config", ".test", "envs", "profiles"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, symlinks=True)
        else:
            shutil.copy(source, dest / name)
    (dest / "src").symlink_to(ROOT / "src")
    (dest / "slurm").symlink_to("profiles/slurm")
    if not strict_standin:
        for path in (dest / ".test").glob("*.yaml"):
            config = yaml.safe_load(path.read_text()) or {}
            launcher = config.get("engine", {}).get("launcher")
            if launcher and "sim-server" in launcher and "--sim-strict" not in launcher:
                config["engine"]["launcher"] = [*launcher, "--sim-strict", "off"]
                path.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def needs_rsync() -> None:
    """Skip (or fail, with DDSWEEP_STORE_TESTS=require as in .ci/run) where the filesystem store's rsync is missing."""
    if shutil.which("rsync") is None:
        message = "rsync is not installed: the filesystem study store needs it (apt-get install rsync)"
        if os.environ.get("DDSWEEP_STORE_TESTS") == "require":
            pytest.fail(message)
        pytest.skip(message)


def venv_env() -> dict[str, str]:
    """The environment with this interpreter's bin directory first on PATH, so jobs find `ddsweep`."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}



def across_workers(fixture: Callable) -> Callable:
    """Mark a session fixture that makes its study with `shared_study`, once for all workers: its tests need not
    share a worker, so pytest-xdist spreads them (pytest_itemcollected groups them otherwise)."""
    fixture.across_workers = True
    return fixture


def _of_each_worker(fixture: Callable) -> Callable:
    """Mark a session fixture that every worker makes for itself and that ties no test to a worker (an autouse
    fixture used by every test): pytest_itemcollected does not group its tests by module."""
    fixture.of_each_worker = True
    return fixture


@pytest.fixture(scope="session", autouse=True)
@_of_each_worker
def _port_counter(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Where standin.free_port counts the ports it gave out: one file for all the session's workers, in the
    session's temporary directory (which pytest removes with old sessions)."""
    os.environ["DDSWEEP_TEST_PORTS"] = str(_session_root(tmp_path_factory) / "ports-given")


def _session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of the whole test session, which every pytest-xdist worker sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' basetemps share a parent


def shared_study(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The directory in which `make(directory)` ran a study, once per test session: the first pytest-xdist worker to
    ask makes it under a lock, the others wait for it and read it. If it fails, every test that asks fails with the
    same message. A test that changes files in it works on its own copy (`shutil.copytree`)."""
    root = _session_root(tmp_path_factory)
    directory, done, failed = (root / f"shared-{name}{suffix}" for suffix in ("", ".done", ".failed"))
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            pytest.fail(failed.read_text(), pytrace=False)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            try:
                make(directory)
            except BaseException as error:  # pytest's failures are BaseExceptions too
                failed.write_text(f"the shared study {name!r} failed where another test made it: {error}")
                raise
            done.touch()
    return directory


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server, with the SNAKEMAKE_STORAGE_S3_* settings the storage plugin reads set for it."""
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        server.kill()
        pytest.fail("the moto S3 server did not answer within 30 s")
    settings = {"SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": url, "SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "testing",
                "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "testing"}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    yield url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.terminate()
    server.wait(timeout=10)


# Run first, in this order (pyproject.toml keeps it: `--no-loadscope-reorder`): the two long chains of workflow runs,
# then the Slurm tests and the store's time budget, which mostly wait and so run beside the rest (the GPU test early:
# its exclusive job waits for the node to drain), then the other tests that take a minute (in the fast tier, the
# contract tests, the smoke study and the summaries of the synthetic study), so that none starts last and stretches
# the whole run. A worker whose group holds at most two tests is sent the next one at once. Of a module whose tests
# read a study shared across workers (`across_workers`), the first reader takes the module's place (it makes the
# study); the others follow with the rest of the slow tests, by when the study is made or under way.
FIRST = (
    "tests/workflow/test_adaptive.py",
    "tests/workflow/test_workflow.py",
    "tests/workflow/test_slurm.py",
    "tests/workflow/test_slurm_cluster.py::test_a_point_at_its_time_limit_stops_itself_is_resubmitted_and_its_last_"
    "attempt_recorded",
    "tests/workflow/test_adaptive_slurm.py",
    "tests/workflow/test_real_sglang.py",
    # its jobs mostly wait (20-s start-ups against a time budget): 2 to 3 minutes, most of it beside the rest
    "tests/workflow/test_store_resume.py",
    "tests/workflow/test_slurm.py::test_a_point_requesting_gpus_gets_them_from_slurm",
    "tests/workflow/test_slurm.py::test_a_cancelled_point_leaves_no_server_and_is_rerun",
    # half a minute to a minute and more each, two of them on a copy of a shared study: started with the other
    # slow tests, they ran alone at the end
    "tests/workflow/test_adaptive.py::test_a_new_confirmation_benchmark_reruns_every_launch_and_unsettled_picks_"
    "settle_on_the_regime_cells",
    "tests/workflow/test_workflow.py::test_full_humaneval_on_the_picks_runs_after_the_study_without_rerunning_a_"
    "point",
    "tests/workflow/test_failures.py::test_a_screening_that_failed_on_the_machine_runs_again_next_time_and_the_"
    "study_settles",
    "tests/workflow/test_store_resume.py::test_a_lost_machine_loses_no_finished_point_and_a_fresh_directory_resumes_"
    "from_the_store",
    "tests/contract/test_contract.py",
    "tests/workflow/test_smoke.py::test_the_smoke_study_runs_one_point_one_cell_and_three_problems_in_its_own_"
    "directory",
    "tests/report/test_summary.py",
    "tests/report/test_first_screen.py",
    "tests/workflow/test_failures.py::test_an_adaptive_study_names_screening_and_confirmation_failures_and_still_"
    "recommends",
    "tests/workflow/test_failures.py::test_a_study_with_a_failing_point_per_fault_kind_still_writes_summary_tables_"
    "and_bundle",
    "tests/workflow/test_failures.py::test_infrastructure_failures_are_retried_and_a_persistent_one_runs_again_next_"
    "time",
    "tests/contract/test_real_server.py",
    "tests/point/test_faults.py::test_workflow_records_a_crashing_point_as_a_result_and_reruns_only_it_on_request",
    "tests/coding/test_sandbox.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package once, before any worker starts: the suite starts hundreds of ddsweep processes
    (jobs, servers, stand-ins), and where PYTHONDONTWRITEBYTECODE is set each would otherwise compile the modules
    it imports again (about 0.2 s of CPU for run-point)."""
    if not hasattr(config, "workerinput"):  # the controller, or the only process with -n0
        compileall.compile_dir(ROOT / "src" / "ddsweep", quiet=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for `-n auto` (pyproject.toml): eight in the fast tier, six otherwise. The fast tier's stand-ins and
    timeouts mostly wait: with four workers its two cores were idle a quarter of the time, six took 86 s against
    92 s, eight 70 s and 71 s against 73 s and 75 s. The full tier is bound by CPU: seven took as long as six (332 s
    and 333 s) and eight longer (429 s against 406 s, an earlier version)."""
    return 8 if config.getoption("markexpr") == "not full" else 6


def _fixtures(item: pytest.Item) -> list:
    """The definitions of the fixtures the test uses (of each name, the one that applies to it)."""
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    return [] if fixtureinfo is None else [defs[-1] for defs in fixtureinfo.name2fixturedefs.values() if defs]


def _module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of this suite that lives longer than one test (module or session), other
    than a study shared across workers (`across_workers`) and what every worker makes for itself
    (`_of_each_worker`)."""
    return any(d.scope != "function" and d.func.__module__.split(".")[0] not in ("_pytest", "xdist")
               and not getattr(d.func, "across_workers", False) and not getattr(d.func, "of_each_worker", False)
               for d in _fixtures(item))


def _reads_a_shared_study(item: pytest.Item) -> bool:
    """Whether the test uses a study made once for all workers (`across_workers`)."""
    return any(getattr(d.func, "across_workers", False) for d in _fixtures(item))


def _group(item: pytest.Item) -> str | None:
    """The xdist group a test belongs to: its module when it shares a longer-lived fixture."""
    if _module_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Group the test for `--dist loadgroup` as it is collected (xdist reads the marks when collection ends)."""
    group = _group(item)
    if group and not item.get_closest_marker("xdist_group"):
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a `full` mark without its reason; put FIRST first, then the other slow tests (a stable sort: file
    order within a group)."""
    for item in items:
        for mark in item.iter_markers("full"):
            if not (mark.args and isinstance(mark.args[0], str) and mark.args[0].strip()):
                raise pytest.UsageError(f"{item.nodeid}: pytest.mark.full needs the reason the test is in the full "
                                        "tier, e.g. pytest.mark.full('runs a study of its own')")
    rank = {name: i for i, name in enumerate(FIRST)}
    slow = len(rank)
    started: set[str] = set()

    def order(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        group = str(marker.args[0]) if marker and marker.args else item.nodeid
        module = item.nodeid.split("::", 1)[0]
        if group not in rank and module in rank and _reads_a_shared_study(item) and module not in started:
            started.add(module)  # the module's first test makes its shared study: it starts at the module's rank
            return rank[module]
        return rank.get(group, slow if item.get_closest_marker("slow") else slow + 1)

    keys = {item.nodeid: order(item) for item in items}  # in file order: the first reader of a study is first
    items.sort(key=lambda item: keys[item.nodeid])
