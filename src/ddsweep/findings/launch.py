"""The exact server launch of a point, ready to paste: the command line and environment its preset rendered
(recorded in the point's point.json, with the study's target arguments), without the port the job chose."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any


def launch_of(results_dir: Path, point_id: str) -> dict[str, Any] | None:
    """`{argv, env, shell, source, removed}` for the point's recorded launch, or None without a readable
    point.json. `removed` lists the arguments and variables that carried the job's own port."""
    path = Path(results_dir) / "points" / point_id / "point.json"
    try:
        point = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = point.get("command") if isinstance(point, dict) else None
    if not isinstance(command, list) or not command:
        return None
    env = point.get("env") if isinstance(point.get("env"), dict) else {}
    argv, removed = without_port([str(a) for a in command], point.get("port"))
    kept_env = {str(k): str(v) for k, v in env.items() if str(v) != str(point.get("port"))}
    removed += [f"{k}={v}" for k, v in env.items() if str(k) not in kept_env]
    return {"argv": argv, "env": kept_env, "shell": shell_line(argv, kept_env),
            "source": f"points/{point_id}/point.json", "removed": removed}


def without_port(argv: list[str], port: Any) -> tuple[list[str], list[str]]:
    """Drop the port option that carries the job's `port` (`--port N` or `--port=N`); the server then takes
    its default port."""
    if port is None:
        return list(argv), []
    value = str(port)
    out: list[str] = []
    removed: list[str] = []
    for arg in argv:
        if arg == value and out and out[-1].startswith("-") and "port" in out[-1]:
            removed += [out.pop(), arg]
        elif arg.startswith("-") and "port" in arg and arg.endswith(f"={value}"):
            removed.append(arg)
        else:
            out.append(arg)
    return out, removed


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """One shell line: `VAR=value ... program args`, each word quoted where the shell needs it."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join([*prefix, *(shlex.quote(a) for a in argv)])
