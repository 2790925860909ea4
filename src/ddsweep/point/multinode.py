"""Multi-node points: one server process per node of the Slurm job, started with one `srun` and stopped as one.

A point whose record has `group.nnodes > 1` (`resources.nodes` in the configuration) renders its preset once per
node rank, with `{nnodes}`, `{node_rank}` and `{dist_init_addr}` (the first node of the job and a free port),
and writes the commands to `ranks.json`. The managed server command is then `python -m ddsweep.point.multinode
launch ranks.json`, which replaces itself with `srun --ntasks=N --distribution=cyclic` (one task per node of
a job submitted with `--nodes=N --ntasks-per-node=1`; several tasks on one node where the allocation has fewer
nodes, as in the tests). Each task runs `python -m ddsweep.point.multinode rank ranks.json`, which replaces
itself with the command of its rank (`SLURM_PROCID`). run-point talks to rank 0 only, which runs on the first
node, where run-point runs too. Stopping the managed process (srun) makes srun signal every task; the owner
token in the environment that srun exports lets run-point find and kill any task process that survives."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from ddsweep.point.lifecycle import ServerSpec, find_free_port, render_server
from ddsweep.storage import write_json_atomic

# Slurm variables a nested srun may keep: the job's identity. Everything else (step geometry inherited from the
# job step run-point runs in) would conflict with the flags below, as the Slurm jobstep executor also finds.
KEEP_SLURM = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
              "SLURM_JOB_NODELIST", "SLURM_CONF")


def is_multinode(record: dict[str, Any]) -> bool:
    """Whether the point's server spans several nodes."""
    return int(record.get("group", {}).get("nnodes", 1)) > 1


def first_node() -> str:
    """The first host of the job's node list (where rank 0 and run-point run), or this host outside Slurm."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        try:
            names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                   timeout=30, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"cannot expand the job's node list {nodelist!r} with scontrol: {exc}") from exc
        if names:
            return names[0]
    return socket.gethostname()


def group_spec(record: dict[str, Any], port: int, out_dir: Path) -> ServerSpec:
    """Rank 0's server spec whose command starts every rank through srun; the rank commands go to ranks.json."""
    group = record["group"]
    nnodes = int(group["nnodes"])
    address = f"{first_node()}:{find_free_port('0.0.0.0')}"
    specs = [render_server({**record, "group": {"nnodes": nnodes, "node_rank": rank, "dist_init_addr": address}},
                           port) for rank in range(nnodes)]
    ranks = Path(out_dir).resolve() / "ranks.json"
    srun = ["srun", "--overlap", f"--ntasks={nnodes}", "--distribution=cyclic", "--kill-on-bad-exit=1",
            f"--cpus-per-task={int(group.get('cpus_per_task', 1))}"]
    if int(group.get("gpus_per_node", 0)):
        srun.append(f"--gres=gpu:{int(group['gpus_per_node'])}")
    write_json_atomic(ranks, {"nnodes": nnodes, "dist_init_addr": address, "srun": srun,
                              "commands": [spec.command for spec in specs]})
    return dataclasses.replace(specs[0], command=[sys.executable, "-m", "ddsweep.point.multinode", "launch",
                                                  str(ranks)])


def launch(ranks_file: str) -> None:
    """Replace this process with srun starting one task per rank, in an environment cleaned of step settings."""
    ranks = json.loads(Path(ranks_file).read_text())
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("SLURM_", "SRUN_", "SBATCH_")) and k not in KEEP_SLURM)}
    command = [*ranks["srun"], sys.executable, "-m", "ddsweep.point.multinode", "rank", ranks_file]
    print(f"# ddsweep: {ranks['nnodes']} ranks, dist-init-addr {ranks['dist_init_addr']}: {' '.join(command)}",
          flush=True)
    os.execvpe(command[0], command, env)


def rank(ranks_file: str) -> None:
    """Replace this task with the server command of its rank (SLURM_PROCID)."""
    ranks = json.loads(Path(ranks_file).read_text())
    command = ranks["commands"][int(os.environ["SLURM_PROCID"])]
    os.execvp(command[0], command)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("launch", "rank"):
        sys.exit("usage: python -m ddsweep.point.multinode launch|rank RANKS_JSON")
    (launch if sys.argv[1] == "launch" else rank)(sys.argv[2])
