"""The program that runs inside the sandbox (one per slot): never imported, its text is passed to ``python -c``.

Processes and channels (the verdict never passes through a process the candidate controls):
- worker W (PID 1 of the namespace when there is one, so candidates cannot signal it): reads jobs (4-byte
  length + JSON frames) from fd 0 and writes results to fd 1. Right after start-up, before reading any job,
  it forks two zygotes, so that the candidate zygote's memory never contained a test.
- candidate zygote Zc: per job it forks the candidate process C, which drops to the candidate user id (when
  started as root), limits itself, executes the model's program and then answers calls to the entry point
  over a socket: arguments in, return value or exception out, as plain data. C holds only that socket,
  its stdout/stderr capture pipes and /dev/null. After the job Zc (a child subreaper) kills C and every
  descendant and reports C's exit status.
- judge zygote Zj: per job it forks the judge J, which runs the problem's tests (trusted dataset code) with
  `candidate` a proxy that forwards calls to C and rebuilds return values from plain data only (so no object
  with a forged __eq__ comes back), then writes the verdict to a pipe that only W and J ever hold. J is not
  dumpable and (as root) runs under a second user id, so C can neither read nor trace it.
The only way to get "passed" is that the tests, run by J, complete against C's answers.

It runs as ``python -I -S`` (isolated mode, no site-packages), so it uses the standard library only and finds
processes by reading /proc itself: psutil cannot be imported there.
"""

import builtins
import contextlib
import ctypes
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

PRELOAD = [
    "array", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions", "functools",
    "hashlib", "heapq", "itertools", "math", "operator", "random", "re", "statistics", "string", "typing",
]
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_LIBC = ctypes.CDLL(None, use_errno=True)
_HEADER = struct.Struct(">I")


def prctl(option: int, value: int) -> None:
    """Call prctl(2) with one argument."""
    _LIBC.prctl(option, value, 0, 0, 0)


def read_exact(fd: int, size: int) -> bytes:
    """Read exactly `size` bytes from `fd`; raises EOFError when it closes first."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("channel closed")
        data += chunk
    return data


def send(fd: int, obj: object) -> None:
    """Write one length-prefixed JSON frame."""
    payload = json.dumps(obj).encode()
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view) :]


def recv(fd: int) -> object:
    """Read one length-prefixed JSON frame."""
    (size,) = _HEADER.unpack(read_exact(fd, _HEADER.size))
    return json.loads(read_exact(fd, size))


def send_with_fds(sock: socket.socket, obj: object, fds: list) -> None:
    """Send a frame over a control socket with file descriptors attached."""
    payload = json.dumps(obj).encode()
    socket.send_fds(sock, [_HEADER.pack(len(payload))], fds)
    sock.sendall(payload)


def recv_with_fds(sock: socket.socket) -> tuple:
    """Receive a frame and the file descriptors attached to it; raises EOFError at end of stream."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 8)
    if not head:
        raise EOFError("control socket closed")
    head += read_exact(sock.fileno(), _HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    return json.loads(read_exact(sock.fileno(), size)), fds


def encode(value: object, depth: int = 0) -> object:
    """Plain-data form of a value made of builtin types (raises TypeError for anything else). A subclass of a
    builtin container (Counter, OrderedDict, defaultdict, a namedtuple) crosses as that container, its items
    read out: the other side gets the builtin, so no method of the subclass reaches it."""
    if depth > 100:
        raise TypeError("value nested too deeply")
    if value is None or type(value) in (bool, int, float, str):
        return value
    kind = type(value)
    kind = next((base for base in (dict, list, tuple, set, frozenset) if isinstance(value, base)), kind)
    tags = {list: "l", tuple: "t", set: "s", frozenset: "f"}
    if kind in tags:
        return {tags[kind]: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError(f"cannot pass a {kind.__name__} between candidate and tests")


def decode(data: object) -> object:
    """Rebuild a value from its plain-data form, creating builtin objects only."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise TypeError("malformed value from the candidate")
    (tag, body), = data.items()
    builders = {"l": list, "t": tuple, "s": set, "f": frozenset}
    if tag in builders:
        return builders[tag](decode(v) for v in body)
    if tag == "d":
        return {decode(k): decode(v) for k, v in body}
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    raise TypeError("malformed value from the candidate")


def become(uid, limits: dict, keep: list) -> None:
    """In a fresh child: new session, die with the parent, only `keep` fds (renumbered 3, 4, ...), then drop
    to `uid` (when given), forbid privilege gains and apply the resource limits."""
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in keep]
    os.closerange(0, 100)
    for fd in range(100, max(high, default=99) + 1):
        if fd not in high:
            with contextlib.suppress(OSError):
                os.close(fd)
    os.closerange(max(high, default=99) + 1, 65536)
    null = os.open(os.devnull, os.O_RDWR)
    for std in (1, 2):
        os.dup2(null, std)
    for index, fd in enumerate(high):
        os.dup2(fd, 3 + index)
        os.close(fd)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    for name, value in limits.items():
        if name.startswith("RLIMIT_"):
                resource.setrlimit(getattr(resource, name), (value, value))


def candidate_main(job: dict, fds: list, config: dict) -> None:
    """C: run the model's program, then answer calls to the entry point over fd 3 (never returns)."""
    try:
        become(config["cand_uid"], config["limits"], fds)
        prctl(PR_SET_DUMPABLE, 1)  # a changed uid made it non-dumpable: give it its own /proc files back
        os.dup2(4, 1)
        os.dup2(5, 2)
        os.close(4)
        os.close(5)
        os.chdir(job["workdir"])
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the program's own stream)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        serve(job["program"], job["entry_point"])
    except BaseException as exc:
        os.write(2, f"sandbox candidate set-up failed: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(0)


def _flush() -> None:
    """Flush the candidate's output streams, ignoring whatever the program did to them."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def serve(program: str, entry_point: str) -> None:
    """Define the program, report set-up, then serve calls until the judge closes the socket."""
    def fail(kind: str, exc: BaseException) -> None:
        _flush()
        send(3, {"setup": kind, "error": (f"{type(exc).__name__}: {exc}".strip().rstrip(":"))[:500]})

    try:
        code = compile(program, "candidate.py", "exec")
    except (SyntaxError, ValueError) as exc:
        return fail("syntax", exc)
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except AssertionError as exc:
        return fail("assertion", exc)
    except BaseException as exc:
        return fail("exception", exc)
    function = namespace.get(entry_point)
    if not callable(function):
        return fail("exception", NameError(f"name {entry_point!r} is not defined"))
    _flush()
    send(3, {"setup": "ready"})
    while True:
        request = recv(3)
        try:
            reply = {"value": encode(function(*decode(request["args"]), **decode(request["kwargs"])))}
        except BaseException as exc:
            reply = {"raise": [type(exc).__name__, str(exc)[:500]]}
        _flush()
        send(3, reply)


class CandidateGone(BaseException):
    """The candidate process closed its end: it exited, crashed or was killed."""


def judge_main(job: dict, fds: list, config: dict) -> None:
    """J: run the tests against the proxy and write the verdict to fd 4 (never returns)."""
    try:
        become(config["judge_uid"], config["judge_limits"], fds)
        prctl(PR_SET_DUMPABLE, 0)
        verdict = judge(job)
        os.write(4, json.dumps(verdict).encode())
    finally:
        os._exit(0)


def judge(job: dict) -> dict:
    """The verdict: passed only when the tests run to completion against the candidate's answers."""
    def receive() -> dict:
        try:
            message = recv(3)
        except (EOFError, OSError, ValueError) as exc:
            raise CandidateGone() from exc
        if type(message) is not dict:
            raise CandidateGone()
        return message

    def candidate(*args, **kwargs):
        send(3, {"args": encode(list(args)), "kwargs": encode(kwargs)})
        reply = receive()
        if "value" in reply:
            return decode(reply["value"])
        name, message = str(reply["raise"][0]), str(reply["raise"][1])
        kind = getattr(builtins, name, None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        raise kind(message)

    try:
        setup = receive()
        if setup.get("setup") != "ready":
            kind = setup.get("setup")
            return {"kind": kind if kind in ("syntax", "assertion") else "exception", "error": str(setup.get("error"))}
        namespace = {"__name__": "__judge__"}
        exec(compile(job["test"], "tests.py", "exec"), namespace)
        namespace[job["entry_point"]] = candidate
        namespace["check"](candidate)
    except CandidateGone:
        return {"kind": "gone", "error": None}
    except AssertionError as exc:
        return {"kind": "assertion", "error": ("AssertionError: " + str(exc)).strip().rstrip(":")[:500]}
    except BaseException as exc:
        return {"kind": "exception", "error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"kind": "passed", "error": None}


def children_of(pid: int) -> list:
    """Process ids whose parent is `pid`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
                found.append(int(name))
    return found


def kill_descendants(first: int, seconds: float = 5.0):
    """Kill `first`, its process group and every process that reparents to this subreaper; returns the wait
    status of `first`. Without other children left the /proc scan is skipped (the common case)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(first, signal.SIGKILL)
    status = None
    with contextlib.suppress(ChildProcessError):
        status = os.waitpid(first, 0)[1]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return status
        for pid in children_of(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
    return status


def zygote(ctrl: socket.socket, config: dict, child_main) -> None:
    """Zc or Zj: fork one child per job, and after the job kill it with all its descendants (never returns)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    try:
        while True:
            job, fds = recv_with_fds(ctrl)
            workdir = None
            if child_main is candidate_main:
                workdir = tempfile.mkdtemp(prefix="run-")
                if config["cand_uid"] is not None:
                    os.chown(workdir, config["cand_uid"], config["cand_uid"])
                job["workdir"] = workdir
            pid = os.fork()
            if pid == 0:
                ctrl.close()
                child_main(job, fds, config)
            for fd in fds:
                os.close(fd)
            recv_with_fds(ctrl)
            status = kill_descendants(pid)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            send_with_fds(ctrl, {"status": status}, [])
    except (EOFError, OSError):
        pass
    finally:
        os._exit(0)


def start_zygote(config: dict, child_main) -> tuple:
    """Fork a zygote; returns (pid, control socket)."""
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        mine.close()
        zygote(theirs, config, child_main)
    theirs.close()
    return pid, mine


def run_job(job: dict, cand: socket.socket, judge_ctrl: socket.socket, limits: dict) -> dict:
    """W: hand one job to both zygotes, watch the verdict pipe and the output pipes until the verdict or the
    deadline, then have both children killed."""
    started = time.monotonic()
    deadline = started + job["timeout_s"]
    call_c, call_j = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    send_with_fds(cand, {"program": job["program"], "entry_point": job["entry_point"]},
                  [call_c.fileno(), out_w, err_w])
    send_with_fds(judge_ctrl, {"test": job["test"], "entry_point": job["entry_point"]}, [call_j.fileno(), verdict_w])
    call_c.close()
    call_j.close()
    for fd in (out_w, err_w, verdict_w):
        os.close(fd)
    cap = limits["output_bytes"]
    captured = {out_r: bytearray(), err_r: bytearray()}
    totals = {out_r: 0, err_r: 0}
    verdict = bytearray()
    open_fds = [out_r, err_r, verdict_r]
    timed_out = False
    while verdict_r in open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(open_fds, [], [], remaining)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
            elif fd == verdict_r:
                verdict += chunk
            else:
                totals[fd] += len(chunk)
                room = cap - len(captured[fd])
                if room > 0:
                    captured[fd] += chunk[:room]
    duration = time.monotonic() - started
    send_with_fds(cand, {"done": True}, [])
    send_with_fds(judge_ctrl, {"done": True}, [])
    cand_status = recv_with_fds(cand)[0]["status"]
    recv_with_fds(judge_ctrl)
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
        with contextlib.suppress((BlockingIOError, OSError)):
            while (chunk := os.read(fd, 65536)):
                totals[fd] += len(chunk)
                room = cap - len(captured[fd])
                if room > 0:
                    captured[fd] += chunk[:room]
    for fd in (out_r, err_r, verdict_r):
        os.close(fd)
    try:
        parsed = json.loads(verdict) if verdict else None
    except ValueError:
        parsed = None
    return {
        "verdict": parsed,
        "timed_out": timed_out,
        "candidate_status": cand_status,
        "duration_s": duration,
        "stdout": captured[out_r].decode("utf-8", "replace"),
        "stderr": captured[err_r].decode("utf-8", "replace"),
        "stdout_bytes": totals[out_r],
        "stderr_bytes": totals[err_r],
    }


def sweep(keep: set) -> None:
    """As PID 1 of the namespace, kill every process but `keep`; then reap whatever has exited."""
    if os.getpid() == 1:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.kill(int(name), signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main() -> None:
    """W: read the configuration, warm up, fork the zygotes, then serve jobs until stdin closes."""
    config = recv(0)
    for name in PRELOAD:
        __import__(name)
    if os.getpid() != 1:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    cand_pid, cand = start_zygote(config, candidate_main)
    judge_pid, judge_ctrl = start_zygote(config, judge_main)
    send(1, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            job = recv(0)
        except EOFError:
            break
        result = run_job(job, cand, judge_ctrl, config["limits"])
        sweep({1, os.getpid(), cand_pid, judge_pid})
        send(1, result)
    os._exit(0)


main()
