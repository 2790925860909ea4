"""Run untrusted, model-written Python in a separate, limited and (where the host allows) isolated process.

Every run starts a fresh interpreter (``python -I -S``) that reads the program from stdin, applies resource
limits to itself (CPU time, address space, processes, file size, open files, no core dumps) and executes the
program with the problem's tests, reporting the outcome on stdout behind a random per-run token. The launcher
process leads its own session and process group; on timeout the group is killed, and after every run whatever
is left is killed too.

Isolation modes, probed once per process and cached (the first that works wins):
- ``bubblewrap``: ``bwrap`` with a read-only bind of ``/``, a private ``/tmp`` as working directory, fresh
  ``/dev`` and ``/proc``, the project, working and home directories hidden behind empty tmpfs mounts, all
  namespaces unshared (user, PID, network, IPC, UTS, cgroup), ``--die-with-parent`` and a new session.
- ``unshare``: util-linux ``unshare --mount --pid --fork --net --mount-proc`` with private tmpfs mounts over
  ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the hidden directories; capabilities are dropped with ``setpriv``.
- ``rlimits-only``: resource limits, a temporary working directory and process-group/user cleanup only.
When the host runs as root, each concurrent run uses its own unprivileged user id (leased from ``uid_base`` on, by a
file lock, so concurrent sandboxes in other processes never share one), so
RLIMIT_NPROC is enforced (the kernel ignores it for root), file permissions protect the host and signals to
the host's processes are refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import queue
import secrets
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ISOLATION_MODES = ("bubblewrap", "unshare", "rlimits-only")
SANDBOX_ENV_MARKER = "DDSWEEP_SANDBOX_TOKEN"
_TAIL_BYTES = 4096

# The in-sandbox driver. It reads {"token", "program", "limits"} from stdin, limits itself, runs the program
# under a module name other than __main__ and reports one tagged JSON line on fd 1.
DRIVER = r"""
import json, os, resource, sys
_cfg = json.loads(sys.stdin.read())
sys.stdin.close()
for _name, _value in _cfg["limits"].items():
    resource.setrlimit(getattr(resource, _name), (_value, _value))
def _report(kind, error=None, _tag=_cfg.pop("token")):
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os.write(1, ("\n" + _tag + " " + json.dumps({"kind": kind, "error": error}) + "\n").encode())
    os._exit(0)
_program = _cfg.pop("program")
del _cfg
try:
    _code = compile(_program, "candidate.py", "exec")
except (SyntaxError, ValueError) as _exc:
    _report("syntax", type(_exc).__name__ + ": " + str(_exc))
del _program
try:
    exec(_code, {"__name__": "__candidate__", "__builtins__": __builtins__})
except AssertionError as _exc:
    _report("assertion", ("AssertionError: " + str(_exc)).strip().rstrip(":"))
except BaseException as _exc:
    _report("exception", (type(_exc).__name__ + ": " + str(_exc))[:500])
_report("passed")
"""


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
        """True when the program ran to the end without an exception."""
        return self.status == "passed"


@dataclass
class _Capture:
    """Capped capture of one output stream: the first `cap` bytes, the last few KiB and the total size."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        """Account for `chunk`, keeping only the head and a short tail."""
        self.total += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]


def project_root() -> Path | None:
    """The source checkout this package runs from (the directory holding pyproject.toml), if any."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return None


def default_hidden_paths() -> list[str]:
    """Directories hidden from sandboxed code: the project, the working directory and home directories."""
    candidates = [project_root(), Path.cwd(), Path.home(), Path("/root"), Path("/home")]
    seen: list[str] = []
    for path in candidates:
        if path is None:
            continue
        resolved = str(Path(path).resolve())
        if resolved != "/" and Path(resolved).is_dir() and resolved not in seen:
            seen.append(resolved)
    return seen


def _world_executable(path: str) -> bool:
    """True when an unprivileged user can reach and execute `path` (every ancestor directory is o+x)."""
    real = Path(os.path.realpath(path))
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)


def default_python(drop_privileges: bool) -> str:
    """The interpreter for sandboxed code: this one, or a system python3 an unprivileged user can run."""
    own = os.path.realpath(sys.executable)
    if not drop_privileges:
        return own
    for candidate in (own, "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or ""):
        if candidate and _world_executable(candidate):
            return os.path.realpath(candidate)
    raise RuntimeError("no Python interpreter is executable by an unprivileged user; pass python=")


def _user_process_count(uid: int) -> int:
    """How many processes `uid` owns (real uid), from /proc."""
    return len(_pids_matching(lambda pid: _real_uid(pid) == uid))


def _real_uid(pid: str) -> int | None:
    """The real uid of process `pid`, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _has_marker(pid: str, token: str) -> bool:
    """True when process `pid` was started with the sandbox marker variable set to `token`."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{SANDBOX_ENV_MARKER}={token}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


def _pids_matching(predicate: Callable[[str], bool]) -> list[int]:
    """Process ids from /proc (other than this process) for which `predicate(pid)` holds."""
    own = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != own and predicate(name)]


def _kill_matching(predicate: Callable[[str], bool], rounds: int = 50) -> None:
    """SIGKILL every process matching `predicate` until none is left (forks racing the scan included)."""
    for _ in range(rounds):
        pids = _pids_matching(predicate)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


class Sandbox:
    """Runs programs in isolated, resource-limited subprocesses, several at once (one slot per run)."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        limits: SandboxLimits | None = None,
        isolation: str | None = None,
        workers: int | None = None,
        hidden_paths: Sequence[str] | None = None,
        python: str | None = None,
        uid_base: int = 62000,
    ) -> None:
        """Configure the sandbox; `isolation` None probes for the strongest mode this host supports."""
        self.timeout_s = timeout_s
        self.limits = limits or SandboxLimits()
        self.workers = workers or os.cpu_count() or 1
        self.drop_privileges = os.geteuid() == 0
        self.python = python or default_python(self.drop_privileges)
        self.hidden_paths = list(default_hidden_paths() if hidden_paths is None else hidden_paths)
        self.uid_base = uid_base
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._nproc_base = 0 if self.drop_privileges else _user_process_count(os.getuid())
        if isolation is None:
            isolation = detect_isolation(self.python, uid_base)
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        self.isolation = isolation

    @property
    def guarantees(self) -> list[str]:
        """Sentences stating what this mode does and does not guarantee, for the summary."""
        limits = self.limits
        common = [
            f"Each program runs in a fresh interpreter with a wall-clock limit of {self.timeout_s:g} s, after "
            f"which its whole process group is killed; CPU time is limited to {self._cpu_limit()} s "
            f"(RLIMIT_CPU), address space to {limits.memory_bytes >> 20} MiB (RLIMIT_AS), single files to "
            f"{limits.fsize_bytes >> 20} MiB (RLIMIT_FSIZE), open files to {limits.nofile}, core dumps to 0.",
            "The environment is scrubbed (only PATH, HOME, LANG and TMPDIR are set); stdout and stderr are "
            f"captured and capped at {limits.output_bytes >> 10} KiB each.",
        ]
        if self.drop_privileges:
            common.append(
                f"Each concurrent run has its own unprivileged user id (leased from {self.uid_base} on, unique "
                "across processes on this host): RLIMIT_NPROC "
                f"({limits.nproc}) is enforced, root-owned files cannot be written and host processes cannot "
                "be signalled."
            )
        else:
            common.append(
                "Programs run as the invoking user: RLIMIT_NPROC is that user's process count plus "
                f"{limits.nproc}, and what that user can write or signal is not protected by permissions."
            )
        if self.isolation == "bubblewrap":
            return common + [
                "bubblewrap: the root file system is mounted read-only and /tmp is a private tmpfs used as the "
                "working directory; the project, working and home directories are hidden.",
                "bubblewrap: new user, PID, network, IPC, UTS and cgroup namespaces: no network (not even the "
                "host's loopback), no view of host processes, and every process of the run dies with it.",
                "Not guaranteed: total size written to the private /tmp (it is RAM-backed) is bounded only per "
                "file and by the time limit; the kernel itself is shared.",
            ]
        if self.isolation == "unshare":
            return common + [
                "unshare: new mount, PID and network namespaces: private tmpfs over /tmp, /var/tmp and "
                "/dev/shm (64 MiB each), the project, working and home directories hidden, no network, no view "
                "of host processes, and every process of the run dies with it; capabilities are dropped.",
                "Not guaranteed: the rest of the file system is protected by permissions only, not mounted "
                "read-only; the kernel itself is shared.",
            ]
        return common + [
            "rlimits-only: no namespaces. The network is reachable, files readable by the sandbox user "
            "(including world-readable project files) can be read, and host processes are visible.",
            "rlimits-only: leftovers are killed by process group and then by "
            + ("user id" if self.drop_privileges else f"the {SANDBOX_ENV_MARKER} environment marker")
            + "; a process that clears its environment and leaves the group can survive"
            + (" only if it changes user id, which it cannot." if self.drop_privileges else "."),
        ]

    def _cpu_limit(self) -> int:
        """CPU-seconds limit for one run."""
        return self.limits.cpu_s or int(math.ceil(self.timeout_s)) + 1

    def _rlimits(self) -> dict[str, int]:
        """The limits the driver applies to itself (names of `resource` constants to values)."""
        limits = self.limits
        return {
            "RLIMIT_CPU": self._cpu_limit(),
            "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_NPROC": limits.nproc + self._nproc_base,
            "RLIMIT_FSIZE": limits.fsize_bytes,
            "RLIMIT_NOFILE": limits.nofile,
            "RLIMIT_CORE": 0,
        }

    def _python_argv(self) -> list[str]:
        """The interpreter command inside the sandbox."""
        return [self.python, "-I", "-S", "-c", DRIVER]

    def _command(self, uid: int | None) -> list[str]:
        """The full launcher command for the current isolation mode."""
        return build_command(self.isolation, self._python_argv(), self.hidden_paths, uid)

    def run(self, program: str, timeout_s: float | None = None) -> SandboxResult:
        """Execute `program` once and classify the outcome; blocks while all slots are busy."""
        slot = self._slots.get()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            if not self.drop_privileges:
                return self._run_in_slot(program, None, timeout_s)
            with lease_uid(self.uid_base) as uid:
                return self._run_in_slot(program, uid, timeout_s)
        finally:
            self._slots.put(slot)

    def run_many(self, programs: Sequence[str]) -> list[SandboxResult]:
        """Execute many programs in parallel on all slots; results are in input order."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.run, programs))

    def _run_in_slot(self, program: str, uid: int | None, timeout_s: float) -> SandboxResult:
        """Launch, feed, watch and clean up one run as user `uid` (None: as the current user)."""
        token = secrets.token_hex(16)
        if uid is not None and self.isolation == "rlimits-only":
            _kill_matching(lambda pid: _real_uid(pid) == uid)  # leftovers of a run whose holder died
        workdir = None
        if self.isolation == "rlimits-only":
            workdir = tempfile.mkdtemp(prefix="ddsweep-sandbox-")
            if uid is not None:
                os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
        home = workdir or "/tmp"
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        if self.isolation == "rlimits-only" and uid is None:
            env[SANDBOX_ENV_MARKER] = token
        payload = json.dumps({"token": token, "program": program, "limits": self._rlimits()}).encode()
        user_kwargs: dict = {}
        if uid is not None and self.isolation != "unshare":
            user_kwargs = {"user": uid, "group": uid, "extra_groups": []}
        started = time.monotonic()
        proc = subprocess.Popen(
            self._command(uid),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir or "/",
            env=env,
            start_new_session=True,
            close_fds=True,
            **user_kwargs,
        )
        try:
            out, err, timed_out = self._communicate(proc, payload, started + timeout_s)
        finally:
            self._cleanup(proc, uid, token)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        duration = time.monotonic() - started
        return classify(proc.returncode, out, err, token, timed_out, duration, timeout_s)

    def _communicate(self, proc: subprocess.Popen, payload: bytes, deadline: float) -> tuple[_Capture, _Capture, bool]:
        """Write the payload, drain stdout/stderr with caps until exit or `deadline`; True if timed out."""
        out, err = _Capture(self.limits.output_bytes), _Capture(self.limits.output_bytes)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        with selectors.DefaultSelector() as selector:
            for fd in captures:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                if proc.poll() is not None:
                    deadline = min(deadline, time.monotonic() + 0.2)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return out, err, True
                for key, _ in selector.select(timeout=min(remaining, 0.5)):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        captures[key.fd].add(chunk)
                    else:
                        selector.unregister(key.fd)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return out, err, True
        return out, err, False

    def _cleanup(self, proc: subprocess.Popen, uid: int | None, token: str) -> None:
        """Kill the run's process group, reap the launcher, and kill leftovers that left the group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream is not None:
                stream.close()
        if self.isolation == "rlimits-only":
            if uid is not None:
                _kill_matching(lambda pid: _real_uid(pid) == uid)
            else:
                _kill_matching(lambda pid: _has_marker(pid, token))


UID_LEASE_DIR = Path(tempfile.gettempdir()) / "ddsweep-sandbox-uids"
UID_LEASE_RANGE = 4096


@contextlib.contextmanager
def lease_uid(base: int) -> Iterator[int]:
    """Hold a user id that no other sandbox run on this host uses meanwhile (an flock per uid), so that
    cleaning up by uid never kills another process's runs."""
    UID_LEASE_DIR.mkdir(mode=0o700, exist_ok=True)
    for uid in range(base, base + UID_LEASE_RANGE):
        fd = os.open(UID_LEASE_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_LEASE_RANGE} sandbox user ids from {base} are in use on this host")


def build_command(isolation: str, python_argv: list[str], hidden_paths: Sequence[str], uid: int | None) -> list[str]:
    """The launcher argv that runs `python_argv` under `isolation` (uid: drop to it in `unshare` mode)."""
    if isolation == "bubblewrap":
        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in ("/tmp", "/var/tmp", *hidden_paths):
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
        argv += _rebinds(python_argv[0], hidden_paths, "--ro-bind")
        argv += ["--unshare-all", "--die-with-parent", "--new-session", "--chdir", "/tmp", "--"]
        return argv + python_argv
    if isolation == "unshare":
        mounts = [
            f"mount -t tmpfs -o size=64m,mode=1777 ddsweep-tmp {shlex.quote(p)}"
            for p in ("/tmp", "/var/tmp", "/dev/shm")
            if os.path.isdir(p)
        ]
        mounts += [f"mount -t tmpfs -o size=1m,mode=755 ddsweep-hide {shlex.quote(p)}" for p in hidden_paths]
        mounts += [
            f"mkdir -p {shlex.quote(p)} && mount --bind -o ro {shlex.quote(src)} {shlex.quote(p)}"
            for src, p in _rebind_pairs(python_argv[0], hidden_paths)
        ]
        setpriv = ["setpriv"]
        if uid is not None:
            setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        setpriv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        script = " && ".join([*mounts, "cd /tmp", shlex.join(setpriv) + ' "$@"'])
        prefix = ["unshare"] if uid is not None else ["unshare", "--user", "--map-root-user"]
        prefix += ["--mount", "--pid", "--fork", "--net", "--mount-proc", "--kill-child", "--propagation", "private"]
        return [*prefix, "sh", "-c", script, "sandbox", *python_argv]
    return list(python_argv)


def _rebind_pairs(python: str, hidden_paths: Sequence[str]) -> list[tuple[str, str]]:
    """(source, target) bind mounts that bring the interpreter's prefix back when a hidden path covers it."""
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    covered = any(prefix == h or prefix.startswith(h.rstrip("/") + "/") for h in hidden_paths)
    return [(prefix, prefix)] if covered else []


def _rebinds(python: str, hidden_paths: Sequence[str], option: str) -> list[str]:
    """bwrap arguments for `_rebind_pairs`."""
    return [arg for src, dst in _rebind_pairs(python, hidden_paths) for arg in (option, src, dst)]


def classify(
    returncode: int | None,
    out: _Capture,
    err: _Capture,
    token: str,
    timed_out: bool,
    duration_s: float,
    timeout_s: float,
) -> SandboxResult:
    """Turn a finished run into a SandboxResult using the driver's tagged report line."""
    report = None
    for line in bytes(out.tail).decode("utf-8", "replace").splitlines():
        if line.startswith(token + " "):
            try:
                report = json.loads(line[len(token) + 1 :])
            except json.JSONDecodeError:
                report = None
    stdout = bytes(out.head).decode("utf-8", "replace").replace(token, "<token>")
    stderr = bytes(err.head).decode("utf-8", "replace")
    if report is not None:
        status, error = report["kind"], report["error"]
    elif timed_out:
        status, error = "timeout", f"wall-clock limit of {timeout_s:g} s exceeded"
    elif returncode is not None and returncode < 0 and -returncode == signal.SIGXCPU:
        status, error = "timeout", "CPU time limit exceeded (SIGXCPU)"
    else:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        status = "exception"
        error = f"the program exited before its tests finished (exit status {returncode}) {last}".strip()
    return SandboxResult(
        status=status,
        error=error,
        duration_s=duration_s,
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
    )


@functools.cache
def detect_isolation(python: str, uid_base: int = 62000) -> str:
    """Probe once (cached) for the strongest isolation mode that actually runs a program on this host."""
    probe = "import os\nassert os.getpid() < 100, 'not in a fresh PID namespace'\n"
    for mode in ISOLATION_MODES[:-1]:
        tool = "bwrap" if mode == "bubblewrap" else "unshare"
        if shutil.which(tool) is None:
            continue
        try:
            sandbox = Sandbox(timeout_s=20.0, isolation=mode, workers=1, python=python, uid_base=uid_base)
            result = sandbox.run(probe)
        except OSError:
            continue
        if result.passed:
            return mode
    return "rlimits-only"
