"""Server lifecycle: render the command from a preset, start it in its own process group on a free port,
wait until it is healthy, verify the applied knobs, and always stop the whole process tree."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from ddsweep.config.knobs import KNOBS, unverified_knobs
from ddsweep.config.presets import derived_values

# Every process started for a server carries this variable; stop() finds escaped descendants by it.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
# Added to the recorded server_info.json: which of SERVER_INFO_PATHS answered.
INFO_ENDPOINT_KEY = "ddsweep_endpoint"
OWNER_ENV = "DDSWEEP_SERVER_OWNER"
# The last line of a Python traceback (`ValueError: ...`, `torch.OutOfMemoryError: ...`) or an argument parser's
# refusal (`launch_server.py: error: unrecognized arguments: ...`).
ERROR_LINE = re.compile(r"^(?:(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception)|\S+: error): .+$", re.MULTILINE)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PORT_IN_USE = re.compile(r"address already in use|errno 98|port .* (is )?(already )?in use", re.IGNORECASE)


class ServerError(RuntimeError):
    """The server did not start, stopped answering, died, or ignored a knob; `kind` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class ServerSpec:
    """A fully rendered server: command line, environment and what to verify once it is up."""

    command: list[str]
    env: dict[str, str]
    host: str
    port: int
    expected_server_args: dict[str, Any] = field(default_factory=dict)
    log_patterns: list[str] = field(default_factory=list)
    launch_command: list[str] = field(default_factory=list)
    unverified_knobs: dict[str, Any] = field(default_factory=dict)
    # Each log pattern with its placeholders matching any value: finds the line a failed pattern expected.
    log_pattern_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Base URL of the server's HTTP API."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _tls(url: str) -> bool:
    """httpx's `verify` for `url`: only an https URL loads the certificate store (about 30 ms of CPU per client)."""
    return urlsplit(url).scheme == "https"


def find_free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a free TCP port on `host`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _fill(template: Any, values: Mapping[str, Any]) -> Any:
    """Substitute `{name}` placeholders; a template that is exactly one placeholder keeps the value's type."""
    if not isinstance(template, str):
        return template
    match = re.fullmatch(r"\{(\w+)\}", template)
    if match:
        return values[match.group(1)]
    return template.format(**{k: "" if v is None else v for k, v in values.items()})


def render_server(record: Mapping[str, Any], port: int) -> ServerSpec:
    """Render a point's server command, environment and expected settings from its preset and knobs."""
    point = record["point"]
    preset = record["preset"]
    engine = record["engine"]
    host = engine["host"]
    values: dict[str, Any] = {
        "model_path": record["target"]["model_path"],
        "served_model_name": record["target"]["served_model_name"],
        "drafter_path": record["drafter"]["model_path"],
        "host": host,
        "port": port,
        "python": sys.executable,
        **{k: point.get(k) for k in KNOBS},
        # a multi-node point's rank in its group (ddsweep.point.multinode); one node: rank 0 of 1
        "nnodes": 1, "node_rank": 0, "dist_init_addr": "", **record.get("group", {}),
    }
    values.update(derived_values(preset, point, f"preset of {record.get('point_id', 'point')}"))
    command = [str(_fill(part, values)) for part in engine["launcher"]]
    command += [str(_fill(part, values)) for part in preset["args"]]
    for knob, extra in preset.get("args_if_set", {}).items():
        if values.get(knob) is not None:
            command += [str(_fill(part, values)) for part in extra]
    command += [str(part) for part in record["target"].get("server_args", [])]
    env = {k: str(_fill(v, values)) for k, v in engine.get("env", {}).items()}
    env.update({k: str(_fill(v, values)) for k, v in preset.get("env", {}).items()})
    verify = preset.get("verify", {})
    expected = {k: _fill(v, values) for k, v in verify.get("server_args", {}).items()}
    patterns = [str(_fill(p, values)) for p in verify.get("log_patterns", [])]
    loose = [re.sub(r"\{[A-Za-z_]\w*\}", r"[^\\s,]*", str(p)) for p in verify.get("log_patterns", [])]
    launch = [str(_fill(p, values)) for p in verify.get("launch_command", [])]
    return ServerSpec(command=command, env=env, host=host, port=port, log_pattern_lines=loose,
                      expected_server_args=expected, log_patterns=patterns, launch_command=launch,
                      unverified_knobs={k: point.get(k) for k in unverified_knobs(preset)
                                                        if point.get(k) is not None})


def last_error_line(text: str) -> str | None:
    """The last `SomeError: message` or `prog: error: message` line of a log (what a Python server died of), or
    None."""
    found = ERROR_LINE.findall(text)
    return found[-1].strip() if found else None


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


class ManagedServer:
    """One server process and its descendants, owned by one job: started, watched and always stopped."""

    def __init__(self, spec: ServerSpec, log_path: Path, shutdown_timeout_s: float = 60.0) -> None:
        self.spec = spec
        self.log_path = log_path
        self.shutdown_timeout_s = shutdown_timeout_s
        self.owner_token = uuid.uuid4().hex
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.log_offset = 0

    def start(self) -> None:
        """Start the server in a new session (its own process group), appending its output to the log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, OWNER_ENV: self.owner_token, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            log.write(f"# ddsweep: starting {' '.join(self.spec.command)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(self.spec.command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            except OSError as exc:
                raise ServerError("startup_exit", f"could not start the server command "
                                  f"{self.spec.command[0]!r}: {exc}") from exc
        self.started_at = time.monotonic()

    def exited(self, within_s: float = 0.0) -> int | None:
        """The exit code if the server process has ended (waiting up to `within_s` for it to end), else None."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=within_s) if within_s > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            return None

    def wait_until_healthy(self, timeout_s: float, progress: Callable[[str], None] | None = None,
                           poll_s: float = 0.5, report_every_s: float = 15.0) -> float:
        """Poll /health until it answers 200; fail at once if the process exits. Returns the startup time."""
        deadline = self.started_at + timeout_s
        last_report = time.monotonic()
        foreign = False
        with httpx.Client(timeout=5.0, verify=_tls(self.spec.url)) as client:
            while True:
                code = self.exited()
                if code is not None:
                    text = self._this_start_log()
                    kind = "port_in_use" if PORT_IN_USE.search(text) else "startup_exit"
                    error = last_error_line(text)
                    raise ServerError(kind, f"the server exited with code {code} during startup "
                                      f"(port {self.spec.port}){': ' + error if error else ''}; last log lines:\n"
                                      f"{log_tail(self.log_path)}")
                try:
                    healthy = client.get(f"{self.spec.url}/health").status_code == 200
                except httpx.HTTPError:
                    healthy = False
                # A foreign server on the port (stale, or it took the port meanwhile) must not pass for ours.
                owned = listener_owned(self.spec.port, self.owner_token) if healthy else None
                if healthy and owned is not False:
                    return time.monotonic() - self.started_at
                foreign = foreign or owned is False
                now = time.monotonic()
                if now >= deadline:
                    hint = (f"; a process outside this server's tree answers /health on port {self.spec.port}"
                            if foreign else "")
                    raise ServerError("startup_timeout", f"the server did not become healthy within {timeout_s:g} s "
                                      f"at {self.spec.url}{hint}; last log lines:\n{log_tail(self.log_path)}")
                if progress and now - last_report >= report_every_s:
                    last_report = now
                    progress(f"waiting for {self.spec.url}/health: {now - self.started_at:.0f} s of "
                             f"{timeout_s:g} s, server process alive")
                time.sleep(poll_s)

    def _this_start_log(self) -> str:
        """What the server wrote to the log since this start (the log is shared by every port attempt)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def server_info(self) -> dict:
        """GET /server_info (SGLang 0.5.23); /get_server_info only when /server_info is 404 (older builds)."""
        answers = []
        with httpx.Client(timeout=30.0, verify=_tls(self.spec.url)) as client:
            for path in SERVER_INFO_PATHS:
                try:
                    response = client.get(f"{self.spec.url}{path}")
                except httpx.HTTPError as exc:
                    raise ServerError("server_crash", f"{self.spec.url}{path} did not answer: {exc}") from exc
                if response.status_code == 404:
                    answers.append(f"{path}: HTTP 404")
                    continue
                try:
                    info = response.json() if response.status_code == 200 else None
                except ValueError:
                    info = None
                if not isinstance(info, dict):
                    raise ServerError("verify", f"GET {self.spec.url}{path} answered HTTP {response.status_code} "
                                      f"without a JSON object: {response.text[:200]!r}")
                info.setdefault(INFO_ENDPOINT_KEY, path)
                return info
        raise ServerError("verify", f"{self.spec.url} answers neither /server_info nor /get_server_info "
                          f"({'; '.join(answers)})")

    def terminate(self) -> None:
        """SIGTERM the server's process group without waiting, as a signal to the whole job would (stop() follows)."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGTERM)

    def stop(self) -> list[int]:
        """SIGTERM the process group, wait, then SIGKILL it and every process carrying our owner token.

        Returns the pids that had to be killed with SIGKILL (for the record)."""
        killed: list[int] = []
        if self.process is None:
            return killed
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        for pid in owned_processes(self.owner_token):
            _signal_pid(pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=self.shutdown_timeout_s)
        except subprocess.TimeoutExpired:
            killed.append(self.process.pid)
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            survivors = owned_processes(self.owner_token)
            if not survivors:
                break
            for pid in survivors:
                _signal_pid(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        return sorted(set(killed))

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the server's process before exec: the kernel kills it when the job that started it dies, even by SIGKILL
    (a job killed outright cannot stop its server; SGLang's own subprocesses follow their parent the same way)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, ignoring one that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_pid(pid: int, sig: signal.Signals) -> None:
    """Signal one process, ignoring one that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def owned_processes(token: str) -> list[int]:
    """Live pids whose environment carries our owner token, including setsid'd daemons (other users'
    processes, whose environment cannot be read, are not ours)."""
    pids = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get(OWNER_ENV) == token:
                pids.append(proc.pid)
    return pids


def _listens_on(connection: Any, port: int) -> bool:
    """Whether a psutil connection is a TCP socket listening on `port`."""
    return connection.status == psutil.CONN_LISTEN and bool(connection.laddr) and connection.laddr.port == port


def listener_owned(port: int, token: str) -> bool | None:
    """Whether the socket listening on `port` belongs to a process carrying our owner token (None: nothing
    listens, or the system does not show whose socket it is)."""
    for pid in owned_processes(token):
        with contextlib.suppress(psutil.Error):
            if any(_listens_on(c, port) for c in psutil.Process(pid).net_connections(kind="tcp")):
                return True
    try:
        return False if any(_listens_on(c, port) for c in psutil.net_connections(kind="tcp")) else None
    except psutil.AccessDenied:  # macOS shows other processes' sockets to root only
        return None


def _same(expected: Any, actual: Any) -> bool:
    """Compare a configured value with a server_args value, tolerating int/str/float spellings."""
    if expected is None or actual is None:
        return expected is None and actual is None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return str(expected).lower() == str(actual).lower()
    try:
        return float(expected) == float(actual)
    except (TypeError, ValueError):
        return str(expected).upper() == str(actual).upper()


def verify_settings(spec: ServerSpec, server_info: Mapping[str, Any], log_text: str) -> dict:
    """Check the resolved arguments (top level of /server_info), launch_command and log patterns; the record
    names the knobs no check covers as `unverified`."""
    args = server_info
    checks = []
    for key, expected in spec.expected_server_args.items():
        if key not in args:
            ok = expected is None
            checks.append({"source": "server_args", "key": key, "expected": expected, "actual": None, "ok": ok,
                           "reason": None if ok else f"/server_info has no top-level key {key!r}; this build may "
                           "name it differently: fix the preset's verify.server_args"})
            continue
        ok = _same(expected, args[key])
        checks.append({"source": "server_args", "key": key, "expected": expected, "actual": args[key], "ok": ok,
                       "reason": None if ok else "the server applied a different value"})
    launch = server_info.get("launch_command")
    for needle in spec.launch_command:
        ok = isinstance(launch, str) and needle in launch
        checks.append({"source": "launch_command", "expected": needle, "actual": launch, "ok": ok,
                       "reason": None if ok else ("/server_info has no launch_command" if not isinstance(launch, str)
                                                  else "not in the server's launch_command")})
    for i, pattern in enumerate(spec.log_patterns):
        ok = re.search(pattern, log_text, re.MULTILINE) is not None
        logged = _lines_like(spec.log_pattern_lines[i], log_text) if not ok and i < len(spec.log_pattern_lines) else []
        checks.append({"source": "log", "pattern": pattern, "ok": ok, "logged": logged,
                       "reason": None if ok else (
                           f"verify.log_patterns[{i}] expects this point's settings, but the server logged "
                           f"{' | '.join(repr(line) for line in logged)}: the engine applied other settings "
                           "(another budget or block size, or another tree rule)" if logged else
                           f"verify.log_patterns[{i}]: pattern not found in the server log")})
    unverified = [{"knob": k, "value": v, "reason": "no verify check of the preset reads this knob"}
                  for k, v in spec.unverified_knobs.items()]
    return {"ok": all(c["ok"] for c in checks), "endpoint": server_info.get(INFO_ENDPOINT_KEY),
            "checks": checks, "unverified": unverified}


def _lines_like(loose: str, log_text: str) -> list[str]:
    """Up to three log lines matching a pattern whose placeholders match any value (what the server logged)."""
    try:
        found = [line.strip() for line in log_text.splitlines() if re.search(loose, line)]
    except re.error:
        return []
    return found[:3]


def describe_failed_checks(verification: Mapping[str, Any]) -> str:
    """One line per failed check, for the error message."""
    lines = []
    for check in verification["checks"]:
        if check["ok"]:
            continue
        if check["source"] == "server_args":
            lines.append(f"server_args.{check['key']}: expected {check['expected']!r}, "
                         f"server reports {check['actual']!r} ({check['reason']})")
        elif check["source"] == "launch_command":
            lines.append(f"launch_command should contain {check['expected']!r}: {check['reason']}")
        else:
            lines.append(f"log pattern {check['pattern']!r}: {check['reason']}")
    return "\n".join(lines)
