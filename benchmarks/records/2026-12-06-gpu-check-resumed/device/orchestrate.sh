#!/bin/bash
# orchestrate.sh STOP_AT CHECK_BUDGET: the check study resumed from /tmp/gpustore/check, then the stability study
# with /tmp/gpustore/stability and a time budget ending MARGIN seconds before STOP_AT.
set -u
STOP_AT=$1 CHECK_BUDGET=$2 MARGIN=${MARGIN:-90}
export PATH=/tmp/rs/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/rs/usr/lib/x86_64-linux-gnu PYTHONPATH=/tmp/site
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ ! -f /tmp/check.done ]; then
  echo "check: start $(date -u +%H:%M:%S) budget $CHECK_BUDGET"
  bash benchmarks/gpu/check.sh --store /tmp/gpustore/check --time-budget "$CHECK_BUDGET" > /tmp/check.log 2>&1
  echo "rc=$?" >> /tmp/check.log
  echo "check: end $(date -u +%H:%M:%S) $(tail -1 /tmp/check.log)"
  touch /tmp/check.done
fi
left=$(( STOP_AT - MARGIN - $(date +%s) ))
if [ "$left" -lt 150 ]; then echo "stability: not started, $left s left"; touch /tmp/stability.done; exit 0; fi
echo "stability: start $(date -u +%H:%M:%S) budget $left"
bash benchmarks/gpu/check.sh --study benchmarks/gpu/stability.yaml --work /tmp/ddsweep-stab \
  --store /tmp/gpustore/stability --time-budget "$left" > /tmp/stability.log 2>&1
echo "rc=$?" >> /tmp/stability.log
echo "stability: end $(date -u +%H:%M:%S) $(tail -1 /tmp/stability.log)"
touch /tmp/stability.done
