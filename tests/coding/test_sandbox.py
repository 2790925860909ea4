"""Sandbox correctness on all 164 problems and containment of adversarial programs in every available mode."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddsweep.coding.humaneval import load_problems
from ddsweep.coding.isolation import default_hidden_paths, project_root
from ddsweep.coding.sandbox import (
    IsolationError,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    detect_isolation,
    probe_isolation,
)

pytestmark = pytest.mark.full("the sandbox's pools in every isolation mode: all 164 programs, the adversarial "
                              "matrix with its wall-clock limits")

PROBLEMS = load_problems()
TIMEOUT_S = 2.0
SECRET_VAR = "DDSWEEP_TEST_SECRET"


def _modes() -> list[str]:
    """Every namespace mode that works on this host, plus rlimits-only (explicitly allowed), which always does."""
    probe = probe_isolation(os.path.realpath(sys.executable), tuple(default_hidden_paths()))
    working = [m for m in ("bubblewrap", "unshare") if probe.get(m) == "works"]
    if working == ["bubblewrap"]:
        with contextlib.suppress(IsolationError):
            Sandbox(isolation="unshare", workers=1).close()
            working.append("unshare")
    return [*working, "rlimits-only"]


MODES = _modes()


@pytest.fixture(scope="module", params=MODES)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox in each available isolation mode, with a short wall-clock limit."""
    with Sandbox(timeout_s=TIMEOUT_S, isolation=request.param, require_isolation=False,
                 limits=SandboxLimits(output_bytes=8192)) as box:
        yield box


@pytest.fixture(scope="module")
def default_sandbox() -> Iterator[Sandbox]:
    """The sandbox in the strongest mode this host supports, default limits."""
    with Sandbox(timeout_s=10.0) as box:
        yield box


@pytest.mark.slow
def test_canonical_solutions_all_pass(default_sandbox: Sandbox) -> None:
    """Every canonical HumanEval solution passes its own tests in the sandbox."""
    results = default_sandbox.run_many([p.sandbox_job(p.canonical_program()) for p in PROBLEMS])
    failed = [(p.task_id, r.status, r.error) for p, r in zip(PROBLEMS, results, strict=True) if not r.passed]
    assert failed == []
    assert len(results) == 164


@pytest.mark.parametrize("body", ["    pass\n", "    return None\n"], ids=["pass", "return-none"])
def test_empty_and_wrong_bodies_fail_every_problem(default_sandbox: Sandbox, body: str) -> None:
    """An empty body and a wrong body fail the tests of every one of the 164 problems."""
    results = default_sandbox.run_many([p.sandbox_job(p.prompt + body) for p in PROBLEMS])
    passed = [p.task_id for p, r in zip(PROBLEMS, results, strict=True) if r.passed]
    assert passed == []
    assert {r.status for r in results} <= {"assertion", "exception"}


def test_isolation_is_reported_with_guarantees(default_sandbox: Sandbox) -> None:
    """The mode is a namespace mode here (the default refuses rlimits-only) with non-empty guarantee sentences."""
    assert default_sandbox.isolation in ("bubblewrap", "unshare")
    assert detect_isolation(default_sandbox.python) == default_sandbox.isolation
    assert default_sandbox.probe[default_sandbox.isolation] == "works"
    assert len(default_sandbox.guarantees) >= 3
    assert all(s.endswith(".") for s in default_sandbox.guarantees)


ONE = "def check(candidate):\n    assert candidate() == 1, 'not one'\n"


def test_classification_of_outcomes(default_sandbox: Sandbox) -> None:
    """Syntax errors, assertion failures, other exceptions and timeouts are told apart."""
    run = default_sandbox.run
    assert run("def f(:\n", ONE, "f").status == "syntax"
    assert run("def f():\n    return 2\n", ONE, "f").status == "assertion"
    raised = run("def f():\n    raise KeyError('k')\n", ONE, "f")
    assert raised.status == "exception" and raised.error.startswith("KeyError")
    assert run("raise KeyError('k')", ONE, "f").error == "KeyError: 'k'"
    assert run("import time\ntime.sleep(5)", ONE, "f", timeout_s=0.5).status == "timeout"
    ok = run("print('hello')\ndef f():\n    return 1\n", ONE, "f")
    assert ok.passed and "hello" in ok.stdout
    assert run("def g():\n    return 1\n", ONE, "f").error == "NameError: name 'f' is not defined"


def test_values_cross_as_plain_data_only(default_sandbox: Sandbox) -> None:
    """Builtin values of every kind round-trip; anything else is refused, so no forged object reaches the tests."""
    value = "[1, 2.5, float('inf'), 'x', b'y', (1,), {2}, frozenset({3}), {'k': [None, True]}, 1 + 2j, 10 ** 40]"
    test = f"def check(candidate):\n    assert candidate({value}) == {value}\n    assert candidate(()) == ()\n"
    assert default_sandbox.run("def f(x):\n    return x\n", test, "f").passed
    forged = "class Yes:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Yes()\n"
    result = default_sandbox.run(forged, test, "f")
    assert result.status == "exception" and "cannot pass a Yes" in result.error
    # a builtin container's subclass crosses as the container: a Counter answers a dict (HumanEval/111), and a
    # subclass's own __eq__ never reaches the tests
    counter = "from collections import Counter\ndef f(x):\n    return Counter(x)\n"
    counts = "def check(candidate):\n    assert candidate('aab') == {'a': 2, 'b': 1}\n"
    assert default_sandbox.run(counter, counts, "f").passed
    lying = "class Yes(dict):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Yes()\n"
    assert default_sandbox.run(lying, counts, "f").status == "assertion"


@dataclass
class Context:
    """What the adversarial cases attack, and what the checks compare afterwards."""

    marker: str
    canary_tmp: Path
    canary_repo: Path
    port: int
    listener: socket.socket
    etc_probe: Path
    originals: dict[Path, tuple[bytes, int]] = field(default_factory=dict)

    def fill(self, code: str) -> str:
        """Substitute the placeholders of a case's code."""
        return (
            code.replace("MARKER", self.marker)
            .replace("CANARY_TMP", str(self.canary_tmp))
            .replace("CANARY_REPO", str(self.canary_repo))
            .replace("PORT", str(self.port))
            .replace("PROJECT", str(project_root()))
            .replace("ETC_PROBE", str(self.etc_probe))
        )


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    """Canary files (in the test's temp dir and in the repo), a listening socket and a secret variable."""
    marker = "ddsw" + secrets.token_hex(4)
    canary_tmp = tmp_path / "canary.txt"
    canary_tmp.write_text("canary")
    canary_repo = (project_root() or Path.cwd()) / f".sandbox-canary-{marker}"
    canary_repo.write_text("canary")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    monkeypatch.setenv(SECRET_VAR, "s3cr3t-" + marker)
    context = Context(marker, canary_tmp, canary_repo, listener.getsockname()[1], listener, Path("/etc") / marker)
    for path in (canary_tmp, canary_repo):
        context.originals[path] = (path.read_bytes(), path.stat().st_mode)
    try:
        yield context
    finally:
        listener.close()
        canary_repo.unlink(missing_ok=True)


def leftover_processes(marker: str) -> list[int]:
    """Processes whose name or command line carries `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            comm = Path(f"/proc/{name}/comm").read_text().strip()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if comm == marker or marker.encode() in cmdline:
            found.append(int(name))
    return found


def _isolated(sandbox: Sandbox) -> bool:
    """True when the mode has its own network, mount and PID namespaces."""
    return sandbox.isolation in ("bubblewrap", "unshare")


def no_connection(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """With network isolation, nothing reached the test's listening socket."""
    if not _isolated(sandbox):
        pytest.skip("rlimits-only mode does not isolate the network (stated in its guarantees)")
    with pytest.raises(BlockingIOError):
        ctx.listener.accept()


def secret_not_visible(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """The secret environment variable of the host process is not in the program's output."""
    assert "s3cr3t" not in result.stdout + result.stderr
    assert "HIDDEN-OK" in result.stdout


def project_hidden(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """Project files cannot be read where the mode hides the project directory."""
    if not _isolated(sandbox):
        pytest.skip("rlimits-only mode does not hide world-readable project files (stated in its guarantees)")
    assert "READ-OK" not in result.stdout
    assert "HIDDEN-OK" in result.stdout


def etc_untouched(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """No file appeared in /etc."""
    assert not ctx.etc_probe.exists()


def output_capped(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """Captured output stays within the cap although the program wrote far more."""
    assert len(result.stdout.encode()) <= sandbox.limits.output_bytes
    assert len(result.stderr.encode()) <= sandbox.limits.output_bytes
    assert result.stdout_bytes + result.stderr_bytes > sandbox.limits.output_bytes


def status_is(*statuses: str) -> Callable[[Sandbox, Context, SandboxResult], None]:
    """A check that the run ended with one of `statuses`."""

    def check(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
        """The run's status is one of the expected ones."""
        assert result.status in statuses, (result.status, result.error)

    return check


def host_checks(sandbox: Sandbox, ctx: Context, result: SandboxResult) -> None:
    """The case's guarantee is what the common host checks assert; the program reached its end or limit."""
    assert result.status in ("exception", "timeout"), (result.status, result.error)


# Each case: program text run before HumanEval/0's tests (which then fail), the guarantee it probes, and an
# extra check. Common checks for all cases: not passed, finished within the limit, canaries unchanged,
# no process with the case's marker left, the test process alive.
CASES: list[tuple[str, str, str, Callable[[Sandbox, Context, SandboxResult], None]]] = [
    ("infinite_loop", "while True:\n    pass", "wall-clock limit kills it", status_is("timeout")),
    ("sleep_forever", "import time\ntime.sleep(10_000)", "wall-clock limit kills it", status_is("timeout")),
    (
        "ignore_sigterm",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
        "killed with SIGKILL, not SIGTERM",
        status_is("timeout"),
    ),
    (
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "process count limited and every fork killed",
        status_is("timeout", "exception"),
    ),
    (
        "thread_bomb",
        "import threading, time\nwhile True:\n"
        "    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()",
        "thread count limited",
        status_is("exception", "timeout"),
    ),
    ("memory_bomb", "x = bytearray(4 << 30)", "address-space limit", status_is("exception")),
    (
        "memory_growth",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))",
        "address-space limit (or the wall clock, zero-filling is slow)",
        status_is("exception", "timeout"),
    ),
    (
        "write_canary_tmp",
        "try:\n    open('CANARY_TMP', 'w').write('owned')\nexcept OSError:\n    pass",
        "files outside the sandbox are not written",
        host_checks,
    ),
    (
        "delete_canary_tmp",
        "import os\ntry:\n    os.remove('CANARY_TMP')\nexcept OSError:\n    pass",
        "files outside the sandbox are not deleted",
        host_checks,
    ),
    (
        "write_canary_repo",
        "try:\n    open('CANARY_REPO', 'a').write('owned')\nexcept OSError:\n    pass",
        "repository files are not written",
        host_checks,
    ),
    (
        "delete_canary_repo",
        "import os\ntry:\n    os.remove('CANARY_REPO')\nexcept OSError:\n    pass",
        "repository files are not deleted",
        host_checks,
    ),
    (
        "chmod_canary",
        "import os\nfor p in ('CANARY_TMP', 'CANARY_REPO'):\n    try:\n        os.chmod(p, 0o777)\n"
        "    except OSError:\n        pass",
        "file modes outside the sandbox are unchanged",
        host_checks,
    ),
    (
        "symlink_escape",
        "import os\ntry:\n    os.symlink('CANARY_REPO', 'link')\n    open('link', 'w').write('owned')\n"
        "except OSError:\n    pass",
        "symlinks do not reach host files",
        host_checks,
    ),
    (
        "write_etc",
        "try:\n    open('ETC_PROBE', 'w').write('x')\nexcept OSError:\n    pass",
        "system directories are not writable",
        etc_untouched,
    ),
    (
        "kill_parent",
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass",
        "the host process survives",
        host_checks,
    ),
    (
        "kill_everything",
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass",
        "signals cannot reach host processes",
        host_checks,
    ),
    (
        "flood_stdout",
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
        "output is capped and the flood is killed",
        output_capped,
    ),
    (
        "flood_stderr_then_exit",
        "import sys\nfor _ in range(200):\n    sys.stderr.write('y' * 65536)",
        "output is capped",
        output_capped,
    ),
    (
        "daemon_double_fork",
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', 'MARKER'])\n"
        "    os._exit(0)\ntime.sleep(0.3)",
        "a daemon that leaves the process group is killed",
        host_checks,
    ),
    (
        "daemon_fork_no_exec",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
        "    os._exit(0)\ntime.sleep(0.3)",
        "a forked daemon (same name, no exec) is killed",
        host_checks,
    ),
    (
        "subprocess_escape",
        "import subprocess, time\nsubprocess.Popen(['sh', '-c', 'sleep 60; echo MARKER'], start_new_session=True)\n"
        "time.sleep(0.3)",
        "child processes in a new session are killed",
        host_checks,
    ),
    (
        "read_environment",
        "import os\nprint(os.environ.get('DDSWEEP_TEST_SECRET', 'HIDDEN-OK'))\n"
        "for pid in os.listdir('/proc'):\n    try:\n        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n        continue\n    if b's3cr3t' in data:\n        print(data)",
        "the host's environment is not visible",
        secret_not_visible,
    ),
    (
        "network_connect",
        "import socket\ns = socket.socket()\ns.settimeout(1)\ntry:\n    s.connect(('127.0.0.1', PORT))\n"
        "    s.sendall(b'MARKER')\nexcept OSError:\n    pass",
        "no network where the mode isolates it",
        no_connection,
    ),
    (
        "read_project_file",
        "try:\n    open('PROJECT/pyproject.toml').read()\n    print('READ-OK')\nexcept OSError:\n"
        "    print('HIDDEN-OK')",
        "project files are hidden where the mode hides them",
        project_hidden,
    ),
    ("exit_zero_early", "import os\nos._exit(0)", "exiting early is not a pass", status_is("exception")),
    ("system_exit", "raise SystemExit(0)", "SystemExit is not a pass", status_is("exception")),
    (
        "close_stdout_and_spin",
        "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass",
        "closing the output pipes does not end the watch",
        status_is("timeout"),
    ),
    (
        "big_file",
        "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (64 << 20))",
        "file-size limit",
        status_is("exception"),
    ),
    (
        "many_files",
        "handles = [open('f%d' % i, 'w') for i in range(100_000)]",
        "open-file limit",
        status_is("exception"),
    ),
    (
        "fake_pass_line",
        'print(\'passed\')\nprint(\'{"kind": "passed", "error": null}\')',
        "printing a pass verdict is not a pass",
        status_is("exception"),
    ),
    (
        "tests_not_in_memory",
        "import gc\nfor o in gc.get_objects():\n    if isinstance(o, str) and 'assert candidate(' in o:\n"
        "        print('FOUND-TESTS')\n        break",
        "the candidate's process never held the tests (it cannot look up the expected answers)",
        lambda sandbox, ctx, result: (host_checks(sandbox, ctx, result), assert_absent("FOUND-TESTS", result)),
    ),
]

# Forgery cases: a wrong solution of HumanEval/0 (always False) followed by an attempt to forge "passed".
# Each must be judged by what the tests saw, with the status given.
WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"
FORGERIES: list[tuple[str, str, tuple[str, ...]]] = [
    ("wrong_answer_alone", "", ("assertion",)),
    (
        "call_reporter_via_main",
        "import __main__, json\nfor name in dir(__main__):\n    f = getattr(__main__, name)\n"
        "    for args in (('passed',), (3, {'setup': 'ready'}), (3, {'kind': 'passed', 'error': None}),\n"
        "                 (4, {'kind': 'passed', 'error': None})):\n        try:\n            f(*args)\n"
        "        except BaseException:\n            pass",
        ("assertion", "exception", "timeout"),
    ),
    (
        "write_verdict_to_every_fd",
        "import os\nfor fd in range(64):\n    try:\n"
        "        os.write(fd, b'{\"kind\": \"passed\", \"error\": null}')\n    except OSError:\n        pass",
        ("assertion", "exception"),
    ),
    ("fake_verdict_line", "print('{\"kind\": \"passed\", \"error\": null}')\nprint('passed')", ("assertion",)),
    ("os_exit_zero", "import os\nos._exit(0)", ("exception",)),
    ("sys_exit_zero", "import sys\nsys.exit(0)", ("exception",)),
    (
        "exit_zero_when_called",
        "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)",
        ("exception",),
    ),
    (
        "patch_builtins_and_check",
        "import builtins\nclass Never(BaseException):\n    pass\nbuiltins.AssertionError = Never\n"
        "builtins.print = lambda *a, **k: None\ndef check(candidate):\n    return None\n"
        "builtins.check = check\nglobals()['__builtins__'].__dict__['AssertionError'] = Never",
        ("assertion",),
    ),
    (
        "atexit_handler",
        "import atexit, os\natexit.register(lambda: os.write(1, b'{\"kind\": \"passed\", \"error\": null}'))\n"
        "atexit.register(os._exit, 0)",
        ("assertion",),
    ),
    (
        "kill_parent_then_answer",
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass",
        ("assertion", "exception"),
    ),
    (
        "kill_every_process_it_can",
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass",
        ("assertion", "exception"),
    ),
    (
        "close_and_replace_stdout",
        "import os, sys\nos.close(1)\nos.close(2)\nr, w = os.pipe()\nos.dup2(w, 1)\nsys.stdout = None",
        ("assertion",),
    ),
    (
        "write_other_processes_fds",
        "import os\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit() or int(pid) == os.getpid():\n"
        "        continue\n    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n    except OSError:\n"
        "        continue\n    for fd in fds:\n        try:\n"
        "            with open(f'/proc/{pid}/fd/{fd}', 'wb') as h:\n"
        "                h.write(b'{\"kind\": \"passed\", \"error\": null}')\n        except OSError:\n"
        "            pass",
        ("assertion", "exception"),
    ),
    (
        "always_equal_result",  # crosses as the plain (empty) list it is: its __eq__ never reaches the tests
        "class Yes(list):\n    def __eq__(self, other):\n        return True\n    __bool__ = lambda self: True\n"
        "def has_close_elements(numbers, threshold):\n    return Yes()",
        ("assertion",),
    ),
]


def assert_absent(text: str, result: SandboxResult) -> None:
    """`text` does not appear in the run's output."""
    assert text not in result.stdout + result.stderr


@pytest.mark.parametrize(("name", "attack", "statuses"), FORGERIES, ids=[f[0] for f in FORGERIES])
def test_forged_verdicts_are_not_believed(sandbox: Sandbox, name: str, attack: str, statuses: tuple[str, ...]) -> None:
    """A wrong solution stays wrong whatever it does to its own process, output, exit status or parents."""
    problem = PROBLEMS[0]
    started = time.monotonic()
    result = sandbox.run_problem(problem, problem.signature_prefix + WRONG + attack)
    print(f"[sandbox-forgery] {sandbox.isolation} | {name} | {result.status} | {time.monotonic() - started:.2f} s")
    assert result.status in statuses, (name, result.status, result.error)
    again = sandbox.run_problem(problem, problem.canonical_program())
    assert again.passed, ("the sandbox still judges correctly after the attack", again.error)


@pytest.mark.parametrize(("name", "code", "guarantee", "check"), CASES, ids=[c[0] for c in CASES])
def test_adversarial_program_is_contained(
    sandbox: Sandbox, ctx: Context, name: str, code: str, guarantee: str, check: Callable
) -> None:
    """The adversarial program fails the problem within the limit and leaves the host unharmed."""
    if name in ("kill_parent", "kill_everything") and not (sandbox.drop_privileges or _isolated(sandbox)):
        pytest.skip("without namespaces or a separate user id, same-user signals are not prevented (stated)")
    problem = PROBLEMS[0]
    head = f"open('/proc/self/comm', 'w').write('{ctx.marker}')\n"
    started = time.monotonic()
    result = sandbox.run_problem(problem, head + ctx.fill(code))
    elapsed = time.monotonic() - started
    print(f"[sandbox-matrix] {sandbox.isolation} | {name} | {result.status} | {elapsed:.2f} s")
    assert not result.passed, (guarantee, result)
    assert elapsed < TIMEOUT_S + 5, guarantee
    for path, (content, mode) in ctx.originals.items():
        assert path.read_bytes() == content, f"{guarantee}: {path} changed"
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(mode), f"{guarantee}: mode of {path}"
    deadline = time.monotonic() + 2.0
    while leftover_processes(ctx.marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover_processes(ctx.marker) == [], f"{guarantee}: processes survived"
    os.kill(os.getpid(), 0)
    check(sandbox, ctx, result)


CONCURRENT_EVAL = """
import sys
from ddsweep.coding.humaneval import load_problems
from ddsweep.coding.sandbox import Sandbox
problems = load_problems()[:40]
jobs = [p.sandbox_job(p.canonical_program()) for p in problems]
results = Sandbox(timeout_s=20, workers=2).run_many(jobs)
print(sum(r.status == "passed" for r in results))
"""


def test_two_sandboxes_in_separate_processes_do_not_disturb_each_other() -> None:
    """Two coding evals on one host (two points at once) must not share user ids: cleaning up one run by
    its uid would kill the other's programs."""
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_EVAL], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=300)[0].strip() for proc in procs]
    assert outputs == ["40", "40"]


VENV_SCRIPT = """
import json
from ddsweep.coding.sandbox import IsolationError, Sandbox
out = {}
for require in (True, False):
    try:
        with Sandbox(timeout_s=10, workers=1, require_isolation=require) as box:
            result = box.run("def f():\\n    return 41 + 1\\n", "def check(c):\\n    assert c() == 42\\n", "f")
            out[str(require)] = [box.isolation, result.status, box.probe]
    except IsolationError as exc:
        out[str(require)] = ["refused", str(exc)]
print(json.dumps(out))
"""
TOOLS = ("sh", "mount", "umount", "mkdir", "mktemp", "rmdir", "setpriv")


@pytest.fixture(scope="module")
def clone_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's package and a --copies venv under /tmp, inside a 0700 'home' directory."""
    home = tmp_path_factory.mktemp("home")
    clone = home / "ddsweep"
    shutil.copytree(Path(__file__).resolve().parents[2] / "src" / "ddsweep", clone / "src" / "ddsweep")
    (clone / "pyproject.toml").write_text("[project]\nname = 'clone'\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--copies", str(clone / ".venv")], check=True)
    home.chmod(0o700)
    return clone


def _run_clone(clone: Path, tmp_path: Path, tools: Sequence[str] | None) -> dict:
    """Run VENV_SCRIPT with the clone's venv and a PATH holding only `tools` (None: the full PATH)."""
    path = os.environ["PATH"]
    if tools is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in tools:
            if shutil.which(tool):
                (bin_dir / tool).symlink_to(shutil.which(tool))
        path = str(bin_dir)
    # the package's one third-party import on this path (psutil, of the client extra), from this environment
    deps = Path(importlib.util.find_spec("psutil").origin).parents[1]
    env = {"PATH": path, "PYTHONPATH": os.pathsep.join([str(clone / "src"), str(deps)]), "HOME": str(clone.parent)}
    proc = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", VENV_SCRIPT], env=env, cwd=clone,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_default_is_bubblewrap_for_a_clone_and_venv_under_tmp(clone_in_tmp: Path, tmp_path: Path) -> None:
    """A project and venv under /tmp in a 0700 directory: with bwrap on PATH the default mode is bubblewrap."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed here (CI installs it)")
    out = _run_clone(clone_in_tmp, tmp_path, None)
    assert out["True"][:2] == ["bubblewrap", "passed"], out


def test_without_bwrap_unshare_is_next(clone_in_tmp: Path, tmp_path: Path) -> None:
    """Without bwrap on PATH, auto falls to unshare where that works, and otherwise refuses by default."""
    out = _run_clone(clone_in_tmp, tmp_path, (*TOOLS, "unshare"))
    probe = out["False"][2]
    assert "bwrap not found on PATH" in probe["bubblewrap"]
    if os.geteuid() == 0 or probe.get("unshare") == "works":
        assert out["True"][:2] == ["unshare", "passed"], out
    else:
        assert out["True"][0] == "refused", out


def test_without_namespace_tools_the_eval_refuses_unless_weak_mode_allowed(clone_in_tmp: Path,
                                                                             tmp_path: Path) -> None:
    """Neither bwrap nor unshare: the default refuses with what is missing and how to allow the weak mode;
    with require_isolation=False the weak mode runs and still judges correctly."""
    out = _run_clone(clone_in_tmp, tmp_path, TOOLS)
    refused, message = out["True"]
    assert refused == "refused"
    assert "bwrap not found" in message and "unshare not found" in message
    assert "coding_eval.require_isolation: false" in message
    assert out["False"][:2] == ["rlimits-only", "passed"], out


def test_a_worker_that_cannot_start_stops_the_run_with_the_reason() -> None:
    """If the mode breaks after the probe (here: the interpreter vanished), run() raises IsolationError naming
    the mode and the launcher's message instead of counting problems as failed."""
    with Sandbox(timeout_s=5, workers=1) as box:
        box.python = "/nonexistent/python3"
        with pytest.raises(IsolationError, match=f"{box.isolation} mode stopped working: .*did not start"):
            box.run("def f():\n    return 1\n", ONE, "f")
