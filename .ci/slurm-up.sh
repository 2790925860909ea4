#!/usr/bin/env bash
# Install and start a single-node Slurm cluster on this machine for the Slurm-profile tests: Debian's
# slurm-wlm and munge, no accounting database (accounting_storage/none, so job status comes from squeue),
# and a node with 8 CPU slots and 8 GPUs as generic resources backed by dummy character devices, so that
# `--gpus=N` is scheduled and sets CUDA_VISIBLE_DEVICES like on a GPU node. Run as root. Idempotent: a
# running cluster with the same configuration is left alone; a changed configuration restarts the daemons
# with a clean state directory. Ends when the node is idle and accepts jobs.
set -euo pipefail

FAKE_GPUS=8
# CPU slots the node advertises (SlurmdParameters=config_overrides): more than the machine's cores, so that the
# one-CPU jobs of several Slurm tests run side by side instead of queueing behind each other.
CPU_SLOTS=8
FEATURE=fakegpu
GPU_DIR=/var/lib/fakegpu
CONF_DIR=/etc/slurm
STATE_DIR=/var/lib/slurm/slurmctld
SPOOL_DIR=/var/lib/slurm/slurmd
LOG_DIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid

log() { echo "slurm-up: $*"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "slurm-up: must run as root (it installs packages and starts the Slurm daemons)" >&2
    exit 2
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# munge: the authentication daemon every Slurm command talks through.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating the munge key"
    mungekey --create --keyfile /etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null
fi

# Dummy GPU devices: gres.conf needs a File= per GPU or slurmd reports none.
mkdir -p "$GPU_DIR"
for i in $(seq 0 $((FAKE_GPUS - 1))); do
    [[ -c "$GPU_DIR/gpu$i" ]] || { rm -f "$GPU_DIR/gpu$i"; mknod "$GPU_DIR/gpu$i" c 1 3; }
done

node=$(hostname -s)
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024) - 512}' /proc/meminfo)
cpus=$(( $(nproc) > CPU_SLOTS ? $(nproc) : CPU_SLOTS ))
mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR"

new_conf=$(mktemp)
new_gres=$(mktemp)
trap 'rm -f "$new_conf" "$new_gres"' EXIT
cat >"$new_conf" <<CONF
# Written by .ci/slurm-up.sh: a single-node test cluster.
ClusterName=ddsweep-ci
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmdParameters=config_overrides
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=300
KillWait=30
GresTypes=gpu
NodeName=$node CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$FAKE_GPUS State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$new_gres" <<CONF
# Written by .ci/slurm-up.sh: dummy character devices stand in for GPUs.
Name=gpu File=$GPU_DIR/gpu[0-$((FAKE_GPUS - 1))]
CONF

running() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
    if running "$1"; then
        local pid
        pid=$(cat "$1")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$1"
}

changed=0
cmp -s "$new_conf" "$CONF_DIR/slurm.conf" || changed=1
cmp -s "$new_gres" "$CONF_DIR/gres.conf" || changed=1
if [[ $changed -eq 1 ]] || ! running "$CTLD_PID" || ! running "$SLURMD_PID"; then
    log "(re)starting slurmctld and slurmd with a clean state (node $node, $cpus CPUs, $mem_mb MB, $FAKE_GPUS GPUs)"
    stop "$SLURMD_PID"
    stop "$CTLD_PID"
    install -m 0644 "$new_conf" "$CONF_DIR/slurm.conf"
    install -m 0644 "$new_gres" "$CONF_DIR/gres.conf"
    find "$STATE_DIR" -mindepth 1 -delete
    slurmctld -c
    for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
    slurmd
else
    log "slurmctld and slurmd already run with this configuration"
fi

state=""
for _ in $(seq 120); do
    state=$(sinfo -h -N -n "$node" -o '%T' 2>/dev/null || true)
    case "$state" in
        idle|mixed|allocated|completing) break ;;
        *drain*|down*|*invalid*) scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle|mixed|allocated|completing) ;;
    *)
        echo "slurm-up: node $node is not usable (state: ${state:-no answer}); last slurmd log lines:" >&2
        tail -n 20 "$LOG_DIR/slurmd.log" >&2 || true
        exit 1 ;;
esac
# A node feature for the tests of resources.constraint; set at run time (not in slurm.conf) so that adding it
# never restarts a cluster that is already running jobs.
if [[ $(sinfo -h -N -n "$node" -o '%f') != "$FEATURE" ]]; then
    scontrol update NodeName="$node" AvailableFeatures="$FEATURE" ActiveFeatures="$FEATURE"
fi
log "ready: $(sinfo -h -N -o '%N %T cpus=%c mem=%m gres=%G features=%f')"
