"""How the sandbox worker is launched in each isolation mode: the bwrap / unshare command lines, the directories
they hide, and the interpreter directories bound back so the worker can start wherever Python is installed."""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


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


@functools.cache
def interpreter_roots(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs: its own prefix and (for a venv) the base installation's prefixes."""
    roots = [str(Path(os.path.realpath(python)).parent.parent)]
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        extra = [sys.prefix, sys.base_prefix, sys.base_exec_prefix]
    else:
        code = "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.base_exec_prefix)"
        extra = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, text=True,
                               check=True, timeout=30).stdout.split()
    for path in extra:
        real = os.path.realpath(path)
        if real not in roots:
            roots.append(real)
    return tuple(roots)


def _covered(path: str, covers: Sequence[str]) -> bool:
    """True when `path` is one of `covers` or lies below one."""
    return any(path == c or path.startswith(c.rstrip("/") + "/") for c in covers)


def build_command(isolation: str, python_argv: list[str], hidden_paths: Sequence[str], root: bool) -> list[str]:
    """The launcher argv that runs `python_argv` (the worker) under `isolation`; `root`: the host user is root."""
    scratch = [p for p in ("/tmp", "/var/tmp") if os.path.isdir(p)]
    covers = [*scratch, *hidden_paths]
    rebinds = [r for r in interpreter_roots(python_argv[0]) if _covered(r, [*covers, "/dev/shm"])]
    if isolation == "bubblewrap":
        bwrap = shutil.which("bwrap") or "bwrap"
        argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in scratch:
            argv += ["--perms", "1777", "--tmpfs", path]
        for path in hidden_paths:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
        for path in rebinds:
            argv += ["--ro-bind", path, path]
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not root:
            argv += ["--unshare-user"]
        argv += ["--as-pid-1", "--die-with-parent", "--chdir", "/tmp", "--setenv", "TMPDIR", "/tmp", "--"]
        return argv + python_argv
    if isolation == "unshare":
        stage = '"$stage"'
        steps = ["stage=$(mktemp -d /dev/shm/ddsweep-stage-XXXXXX)"]
        for index, path in enumerate(rebinds):
            steps.append(f"mkdir {stage}/{index} && mount --bind -o ro {shlex.quote(path)} {stage}/{index}")
        steps += [f"mount -t tmpfs -o size=64m,mode=1777 ddsweep-tmp {shlex.quote(p)}" for p in scratch]
        steps += [f"mount -t tmpfs -o size=1m,mode=755 ddsweep-hide {shlex.quote(p)}" for p in hidden_paths
                  if os.path.isdir(p) and not _covered(p, scratch)]
        for index, path in enumerate(rebinds):
            steps.append(f"mkdir -p {shlex.quote(path)} && mount --bind {stage}/{index} {shlex.quote(path)} && "
                         f"umount {stage}/{index}")
        steps += [f"{{ rmdir {stage}/* {stage} 2>/dev/null || true; }}",
                  "mount -t tmpfs -o size=64m,mode=1777 ddsweep-shm /dev/shm", "cd /tmp"]
        launch = "exec \"$@\"" if root else 'exec setpriv --inh-caps=-all --bounding-set=-all -- "$@"'
        script = " && ".join([*steps, launch])
        unshare = shutil.which("unshare") or "unshare"
        prefix = [unshare] if root else [unshare, "--user", "--map-root-user"]
        prefix += ["--mount", "--pid", "--fork", "--net", "--mount-proc", "--kill-child", "--propagation", "private"]
        return [*prefix, "sh", "-c", script, "sandbox", *python_argv]
    return list(python_argv)
