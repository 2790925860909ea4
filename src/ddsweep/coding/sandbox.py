"""Run untrusted, model-written Python in isolated, limited processes and judge it where it cannot reach.

One long-lived worker per sandbox slot runs ``python -I -S`` (the program in sandbox_worker.py) inside the
isolation mode; for every problem it forks a fresh candidate process (the model's code, resource-limited, as
an unprivileged user id when the host runs as root) and a separate judge process (the problem's tests, with
the candidate's function reached through a socket that carries plain data only). The verdict is written by
the judge to a pipe the candidate never holds; nothing the candidate prints, exits with or patches decides it.

Isolation modes (``isolation="auto"`` picks the first that works; a probe records why the others did not):
- ``bubblewrap``: ``bwrap`` with a read-only bind of ``/``, private ``/tmp`` and ``/var/tmp``, fresh ``/dev``
  and ``/proc``, the project, working and home directories hidden behind empty tmpfs mounts (the
  interpreter's prefixes bound back read-only), new PID, network, IPC, UTS and cgroup namespaces (and a user
  namespace when not root), the worker as PID 1, ``--die-with-parent``.
- ``unshare``: util-linux ``unshare --mount --pid --fork --net --mount-proc`` with the same tmpfs mounts and
  prefix binds (capabilities dropped with ``setpriv`` when not root).
- ``rlimits-only``: resource limits, separate user ids (as root) and a child-subreaper cleanup only; allowed
  only with ``require_isolation=False``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddsweep.coding.isolation import build_command, default_hidden_paths

ISOLATION_MODES = ("bubblewrap", "unshare", "rlimits-only")
ISOLATION_CHOICES = ("auto", *ISOLATION_MODES)
WORKER_SOURCE = (Path(__file__).with_name("sandbox_worker.py")).read_text()
_HEADER = struct.Struct(">I")
_WORKER_GRACE_S = 10.0


class IsolationError(RuntimeError):
    """The requested isolation is not available on this host (the message says what is missing)."""


class WorkerError(RuntimeError):
    """A sandbox worker died or stopped answering; it is replaced and the run counts as failed."""


@dataclass
class SandboxLimits:
    """Per-run resource limits; `cpu_s` None means the wall-clock timeout rounded up plus one second."""

    cpu_s: int | None = None
    memory_bytes: int = 1 << 30
    nproc: int = 64
    fsize_bytes: int = 16 << 20
    nofile: int = 256
    output_bytes: int = 64 << 10


@dataclass
class SandboxResult:
    """The outcome of one run: status is passed, assertion, exception, timeout or syntax."""

    status: str
    error: str | None
    duration_s: float
    returncode: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int

    @property
    def passed(self) -> bool:
        """True when the tests ran to completion against the candidate's answers."""
        return self.status == "passed"


def acquire_uid(base: int, lease_range: int = 4096) -> tuple[int, int]:
    """Lease a user id that no other sandbox on this host uses meanwhile (an flock per uid): (uid, lock fd);
    closing the fd releases it. Cleaning up by uid therefore never touches another eval's programs."""
    lease_dir = Path(tempfile.gettempdir()) / "ddsweep-sandbox-uids"
    lease_dir.mkdir(mode=0o700, exist_ok=True)
    for uid in range(base, base + lease_range):
        fd = os.open(lease_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise RuntimeError(f"all {lease_range} sandbox user ids from {base} are in use on this host")


def _read_frame(fd: int, deadline: float) -> dict:
    """Read one length-prefixed JSON frame from `fd` before `deadline`; raises WorkerError otherwise."""
    data = b""
    need = _HEADER.size
    header_done = False
    while len(data) < need:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise WorkerError("the sandbox worker did not answer in time")
        chunk = os.read(fd, need - len(data))
        if not chunk:
            raise WorkerError("the sandbox worker exited")
        data += chunk
        if len(data) == need and not header_done:
            header_done, need, data = True, _HEADER.unpack(data)[0], b""
            if need == 0:
                break
    return json.loads(data)


class _Worker:
    """One running sandbox worker process (one slot)."""

    def __init__(self, argv: list[str], env: dict[str, str], config: dict) -> None:
        """Start the worker, send its configuration and wait until it is ready."""
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker; closed in kill())
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, cwd="/", start_new_session=True, close_fds=True)
        try:
            self.send(config)
            _read_frame(self.proc.stdout.fileno(), time.monotonic() + 60)
        except (WorkerError, OSError) as exc:
            reason = self.failure_text()
            self.kill()
            raise WorkerError(f"the sandbox worker did not start ({exc}): {reason}") from exc

    def send(self, obj: dict) -> None:
        """Write one frame to the worker."""
        payload = json.dumps(obj).encode()
        self.proc.stdin.write(_HEADER.pack(len(payload)) + payload)
        self.proc.stdin.flush()

    def run(self, job: dict) -> dict:
        """Send a job and wait for its result (the worker enforces the job's timeout itself)."""
        self.send(job)
        return _read_frame(self.proc.stdout.fileno(), time.monotonic() + job["timeout_s"] + _WORKER_GRACE_S)

    def failure_text(self) -> str:
        """The last lines the worker or its launcher wrote to stderr."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.wait(timeout=1)
        self.stderr.seek(0)
        lines = self.stderr.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
        status = f"exit status {self.proc.returncode}" if self.proc.returncode is not None else "still running"
        return (lines[-1] if lines else "no message") + f" ({status})"

    def kill(self) -> None:
        """Kill the worker and everything in its namespace or process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.stderr.close()


class Sandbox:
    """Runs candidate programs against tests in isolated, limited processes, several at once (one per slot)."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        limits: SandboxLimits | None = None,
        isolation: str = "auto",
        require_isolation: bool = True,
        workers: int | None = None,
        hidden_paths: Sequence[str] | None = None,
        python: str | None = None,
        uid_base: int = 62000,
    ) -> None:
        """Configure the sandbox and choose the mode; raises IsolationError when the mode cannot be used."""
        if isolation not in ISOLATION_CHOICES:
            raise ValueError(f"isolation must be one of {ISOLATION_CHOICES}, got {isolation!r}")
        self.timeout_s = timeout_s
        self.limits = limits or SandboxLimits()
        self.workers = workers or os.cpu_count() or 1
        self.drop_privileges = os.geteuid() == 0
        self.python = os.path.realpath(python or sys.executable)
        self.hidden_paths = list(default_hidden_paths() if hidden_paths is None else hidden_paths)
        self.uid_base = uid_base
        self.requested = isolation
        self.require_isolation = require_isolation
        self.probe: dict[str, str] = {}
        if isolation == "auto":
            self.probe = probe_isolation(self.python, tuple(self.hidden_paths), uid_base)
            isolation = next((m for m in ISOLATION_MODES[:-1] if self.probe[m] == "works"), "rlimits-only")
        elif isolation != "rlimits-only":
            reason = probe_mode(isolation, self.python, tuple(self.hidden_paths), uid_base)
            self.probe = {isolation: reason}
            if reason != "works":
                raise IsolationError(f"coding_eval.isolation: {isolation} does not work on this host: {reason}")
        if isolation == "rlimits-only" and require_isolation:
            missing = "; ".join(f"{mode}: {why}" for mode, why in self.probe.items()) or "rlimits-only requested"
            raise IsolationError(
                "no namespace isolation works on this host for the coding sandbox (" + missing + "). Install "
                "bubblewrap or allow user namespaces, or accept the weak mode explicitly with "
                "coding_eval.require_isolation: false (then candidates can reach the network and world-readable "
                "files; see docs/sandbox.md)."
            )
        self.isolation = isolation
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._running: dict[int, tuple[_Worker, list[tuple[int, int]]]] = {}
        self._nproc_base = 0 if self.drop_privileges else _user_process_count(os.getuid())
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawn")
        self._finalizer = weakref.finalize(self, _shutdown, self._running, self._spawner)

    @property
    def guarantees(self) -> list[str]:
        """Sentences stating what this mode does and does not guarantee, for the summary."""
        limits = self.limits
        common = [
            "The verdict is written by a separate judge process that runs the tests and reaches the candidate's "
            "function only through a socket carrying plain data (no objects, no code); the candidate never "
            "holds the verdict channel, so its output, exit status, patched builtins or forged objects cannot "
            "make it pass.",
            f"Each program runs in a fresh process forked from a warmed interpreter, with a wall-clock limit of "
            f"{self.timeout_s:g} s after which it and all its descendants are killed; CPU time is limited to "
            f"{self._cpu_limit()} s (RLIMIT_CPU), address space to {limits.memory_bytes >> 20} MiB (RLIMIT_AS), "
            f"single files to {limits.fsize_bytes >> 20} MiB (RLIMIT_FSIZE), open files to {limits.nofile}, "
            "core dumps to 0.",
            "The environment is scrubbed (only PATH, HOME, LANG and TMPDIR are set); stdout and stderr are "
            f"captured and capped at {limits.output_bytes >> 10} KiB each.",
        ]
        if self.drop_privileges:
            common.append(
                f"Candidate and judge run under two unprivileged user ids leased per slot (from {self.uid_base} "
                f"on, unique across processes on this host): RLIMIT_NPROC ({limits.nproc}) is enforced, "
                "root-owned files cannot be written and neither the judge nor host processes can be signalled."
            )
        else:
            common.append(
                "Programs run as the invoking user: RLIMIT_NPROC is that user's process count plus "
                f"{limits.nproc}; the judge is not dumpable (not readable or traceable by the candidate), and a "
                "candidate that kills it only fails its own problem."
            )
        if self.isolation == "bubblewrap":
            return common + [
                "bubblewrap: the root file system is mounted read-only, /tmp and /var/tmp are private tmpfs; the "
                "project, working and home directories are hidden (the interpreter is bound back read-only).",
                "bubblewrap: new PID, network, IPC, UTS and cgroup namespaces: no network (not even the host's "
                "loopback), no view of host processes, and every process dies with the worker.",
                "Not guaranteed: total size written to the private /tmp (it is RAM-backed) is bounded only per "
                "file and by the time limit; the kernel itself is shared.",
            ]
        if self.isolation == "unshare":
            return common + [
                "unshare: new mount, PID and network namespaces: private tmpfs over /tmp, /var/tmp and /dev/shm, "
                "the project, working and home directories hidden, no network, no view of host processes, and "
                "every process dies with the worker.",
                "Not guaranteed: the rest of the file system is protected by permissions only, not mounted "
                "read-only; the kernel itself is shared.",
            ]
        return common + [
            "rlimits-only (explicitly allowed): no namespaces. The network is reachable, files readable by the "
            "sandbox user (including world-readable project files) can be read, and host processes are visible.",
            "rlimits-only: leftovers are killed as descendants of a child-subreaper"
            + (" and by user id." if self.drop_privileges else "; a candidate that kills its zygote first can "
               "leave a process behind."),
        ]

    def _cpu_limit(self) -> int:
        """CPU-seconds limit for one run."""
        return self.limits.cpu_s or int(self.timeout_s + 0.999) + 1

    def _config(self, cand_uid: int | None, judge_uid: int | None) -> dict:
        """The worker's configuration: user ids and the limits each child applies to itself."""
        limits = self.limits
        cpu = self._cpu_limit()
        return {
            "cand_uid": cand_uid,
            "judge_uid": judge_uid,
            "limits": {
                "RLIMIT_CPU": cpu,
                "RLIMIT_AS": limits.memory_bytes,
                "RLIMIT_NPROC": limits.nproc + self._nproc_base,
                "RLIMIT_FSIZE": limits.fsize_bytes,
                "RLIMIT_NOFILE": limits.nofile,
                "RLIMIT_CORE": 0,
                "output_bytes": limits.output_bytes,
            },
            "judge_limits": {"RLIMIT_CPU": cpu, "RLIMIT_AS": max(limits.memory_bytes, 1 << 30), "RLIMIT_CORE": 0},
        }

    def _spawn(self) -> tuple[_Worker, list[tuple[int, int]]]:
        """Start one worker (on the spawner thread, so the worker's parent-death signal follows the Sandbox)."""
        leases = [acquire_uid(self.uid_base) for _ in range(2)] if self.drop_privileges else []
        uids = [uid for uid, _ in leases] or [None, None]
        config = self._config(*uids)
        try:
            argv = build_command(self.isolation, [self.python, "-I", "-S", "-c", WORKER_SOURCE], self.hidden_paths,
                                 self.drop_privileges)
        except (OSError, subprocess.SubprocessError) as exc:
            for _, fd in leases:
                os.close(fd)
            raise WorkerError(f"the sandbox worker did not start ({type(exc).__name__}: {exc})") from exc
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": tempfile.gettempdir()
               if self.isolation == "rlimits-only" else "/tmp", "LANG": "C.UTF-8"}
        try:
            return _Worker(argv, env, config), leases
        except BaseException:
            for _, fd in leases:
                os.close(fd)
            raise

    def run(self, program: str, test: str, entry_point: str, timeout_s: float | None = None) -> SandboxResult:
        """Define `program`, run `test` (which defines check(candidate)) against its `entry_point` in the
        judge, and classify the outcome; blocks while all slots are busy."""
        slot = self._slots.get()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        job = {"program": program, "test": test, "entry_point": entry_point, "timeout_s": timeout_s}
        started = time.monotonic()
        try:
            if slot not in self._running:
                try:
                    self._running[slot] = self._spawner.submit(self._spawn).result()
                except WorkerError as exc:
                    raise IsolationError(f"{self.isolation} mode stopped working: {exc}") from exc
            try:
                reply = self._running[slot][0].run(job)
            except (WorkerError, OSError, ValueError) as exc:
                worker, leases = self._running.pop(slot)
                reason = worker.failure_text()
                _stop(worker, leases)
                return SandboxResult("exception", f"the sandbox worker failed ({exc}; {reason})",
                                     time.monotonic() - started, None, "", "", 0, 0)
            return classify(reply, timeout_s)
        finally:
            self._slots.put(slot)

    def run_problem(self, problem: object, code: str, timeout_s: float | None = None) -> SandboxResult:
        """Run `code` as the solution of a HumanEval problem (its prompt is the judge's trusted context)."""
        return self.run(*problem.sandbox_job(code), timeout_s=timeout_s)

    def run_many(self, jobs: Sequence[tuple[str, str, str]]) -> list[SandboxResult]:
        """Run many (program, test, entry_point) jobs in parallel on all slots; results in input order."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))

    def close(self) -> None:
        """Stop every worker (also done when the Sandbox is garbage-collected or the process exits)."""
        self._finalizer()

    def __enter__(self) -> Sandbox:
        """Use as a context manager that stops the workers at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the workers."""
        self.close()


def _stop(worker: _Worker, leases: list[tuple[int, int]]) -> None:
    """Kill a worker, then every process left under its user ids, and release the ids."""
    worker.kill()
    for uid, fd in leases:
        for _ in range(50):
            pids = _pids_of_user(uid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        os.close(fd)


def _shutdown(running: dict, spawner: ThreadPoolExecutor) -> None:
    """Stop all workers of a Sandbox and its spawner thread."""
    for slot in list(running):
        _stop(*running.pop(slot))
    spawner.shutdown(wait=False)


def _pids_of_user(uid: int) -> list[int]:
    """Process ids whose real uid is `uid` (this host's PID namespace)."""
    return [proc.pid for proc in psutil.process_iter(["uids"]) if proc.info["uids"] and proc.info["uids"].real == uid]


def _user_process_count(uid: int) -> int:
    """How many processes `uid` owns (real uid)."""
    return len(_pids_of_user(uid))


def classify(reply: dict, timeout_s: float) -> SandboxResult:
    """Turn a worker's report of one run into a SandboxResult; only the judge's verdict can say passed."""
    verdict = reply.get("verdict") or {}
    kind = verdict.get("kind")
    status_raw = reply.get("candidate_status")
    code = os.waitstatus_to_exitcode(status_raw) if status_raw is not None else None
    if reply.get("timed_out"):
        status, error = "timeout", f"wall-clock limit of {timeout_s:g} s exceeded"
    elif kind in ("passed", "assertion", "exception", "syntax"):
        status, error = kind, verdict.get("error")
    elif code is not None and code < 0 and -code == signal.SIGXCPU:
        status, error = "timeout", "CPU time limit exceeded (SIGXCPU)"
    elif kind == "gone":
        last = reply.get("stderr", "").strip().splitlines()[-1:] or [""]
        status = "exception"
        error = f"the program exited before its tests finished (exit status {code}) {last[0]}".strip()
    else:
        status, error = "exception", "the judge ended without a verdict"
    return SandboxResult(
        status=status,
        error=error,
        duration_s=reply.get("duration_s", 0.0),
        returncode=code,
        stdout=reply.get("stdout", ""),
        stderr=reply.get("stderr", ""),
        stdout_bytes=reply.get("stdout_bytes", 0),
        stderr_bytes=reply.get("stderr_bytes", 0),
    )


PROBE_PROGRAM = "import os\ndef probe():\n    return os.getpid() < 100\n"
PROBE_TEST = "def check(candidate):\n    assert candidate() is True, 'not in a fresh PID namespace'\n"
_PROBE_LOCK = threading.Lock()


def probe_mode(mode: str, python: str, hidden_paths: tuple[str, ...], uid_base: int = 62000) -> str:
    """"works" when `mode` runs a probe job in a fresh PID namespace on this host, else the reason it fails."""
    tool = "bwrap" if mode == "bubblewrap" else "unshare"
    if shutil.which(tool) is None:
        return f"{tool} not found on PATH ({os.environ.get('PATH', '')})"
    with _PROBE_LOCK:
        try:
            sandbox = Sandbox(timeout_s=20.0, isolation="rlimits-only", require_isolation=False, workers=1,
                              python=python, hidden_paths=hidden_paths, uid_base=uid_base)
            sandbox.isolation = mode
            with sandbox:
                result = sandbox.run(PROBE_PROGRAM, PROBE_TEST, "probe")
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            return f"{type(exc).__name__}: {exc}"
    return "works" if result.passed else f"{result.status}: {result.error}"


@functools.cache
def probe_isolation(python: str, hidden_paths: tuple[str, ...], uid_base: int = 62000) -> dict[str, str]:
    """Probe (cached per process) every namespace mode, strongest first: mode -> "works" or why not."""
    results: dict[str, str] = {}
    for mode in ISOLATION_MODES[:-1]:
        results[mode] = probe_mode(mode, python, hidden_paths, uid_base)
        if results[mode] == "works":
            break
    return results


def detect_isolation(python: str | None = None) -> str:
    """The mode `isolation="auto"` picks on this host (rlimits-only when no namespace mode works)."""
    probe = probe_isolation(os.path.realpath(python or sys.executable), tuple(default_hidden_paths()))
    return next((m for m in ISOLATION_MODES[:-1] if probe.get(m) == "works"), "rlimits-only")
