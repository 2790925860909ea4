"""What the presets send, resolved by the real SGLang 0.5.23 (CPU build of `.ci/sglang-real.sh`): each point's
command line, as ddsweep renders it, goes through SGLang's own parser and `ServerArgs.resolve_once`, the resolution
a server start makes, and every value the preset's verification expects must be the value SGLang resolves. A
preset whose flags SGLang overrides would otherwise fail its verification only after a full server start."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import demo_config
from realsglang import manifest

from ddsweep.config.records import point_record
from ddsweep.config.study import expand_points
from ddsweep.point.lifecycle import render_server

pytestmark = [pytest.mark.slow, pytest.mark.full("imports the real SGLang to resolve the presets' command lines")]

# Run with the server's Python: reads {name: argv} on stdin, prints {name: resolved arguments or the error}.
RESOLVE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = {}
for name, argv in json.load(sys.stdin).items():
    try:
        args = ServerArgs.from_cli_args(parser.parse_args(argv))
        args.resolve_once()
        out[name] = {"resolved": args.resolved_dict()}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out, default=str))
"""
# Presets whose algorithm the CPU build resolves (DFLASH and DDTREE it refuses on CPU, or lacks).
POINTS = [{"preset": "standalone", "budget": 2, "topk": 1, "block_size": 5},
          {"preset": "standalone", "budget": 4, "topk": 1, "block_size": 5},
          {"preset": "standalone", "budget": 8, "topk": 1, "block_size": 5},
          {"preset": "standalone", "budget": 8, "topk": 2, "block_size": 5},
          {"preset": "ngram", "block_size": 8, "window": None}]


def test_every_value_a_preset_verifies_is_what_the_real_sglang_resolves_from_its_command() -> None:
    env = manifest()
    config = demo_config(target={"model_path": env["model_dir"], "server_args": env["server_args"]},
                         drafter={"model_path": env["model_dir"]}, sweep={"points": POINTS})
    specs = {p.point_id: render_server(point_record(config, p), 30000)
             for p in expand_points(config) if p.preset in ("ar", "standalone", "ngram")}
    assert len(specs) == len(POINTS) + 1, sorted(specs)  # the points above and ar
    # the launcher's own words (python -m sglang.launch_server) are not server arguments
    argv = {pid: spec.command[spec.command.index("--model-path"):] for pid, spec in specs.items()}
    done = subprocess.run([env["python"], "-c", RESOLVE], input=json.dumps(argv), capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **env["env"]}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for pid, spec in specs.items():
        assert "error" not in answers[pid], (pid, argv[pid], answers[pid])
        resolved = answers[pid]["resolved"]
        differ = {key: (expected, resolved.get(key)) for key, expected in spec.expected_server_args.items()
                  if resolved.get(key) != expected}
        assert not differ, f"{pid}: the preset expects, SGLang resolves: {differ} (sent: {' '.join(argv[pid])})"
