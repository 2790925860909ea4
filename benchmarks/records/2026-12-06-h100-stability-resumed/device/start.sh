#!/bin/bash
# start.sh STOP_AT: on the GPU machine, after the four wheel installs. Installs the DDTree build, the filesystem
# store's plugin and rsync, unpacks the stability study's store (the one that came back last, .gpu/st/*.part*,
# else the committed one) into /tmp/gpustore/stability, and starts the stability study in its own session with a
# time budget ending MARGIN s before STOP_AT (Unix time). A second call on the same machine starts nothing new.
set -u
STOP_AT=$1 MARGIN=${MARGIN:-60}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PIP_ROOT_USER_ACTION=ignore
if [ -f /tmp/orchestrator.started ]; then echo "start.sh: already started"; exit 0; fi
bash .gpu/bin/install.sh || echo "start.sh: install.sh rc=$?"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/extra2/*.whl ||
  { echo "start.sh: extra2 install failed"; exit 1; }
mkdir -p /tmp/rs && for f in .gpu/extra2/debs/*.deb; do dpkg -x "$f" /tmp/rs; done
export PATH=/tmp/rs/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/rs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rsync --version | head -1 || { echo "start.sh: rsync does not run"; exit 1; }
export PYTHONPATH=/tmp/site
python3 -c "import snakemake_storage_plugin_fs, sysrsync; print('fs storage plugin imports')" || exit 1
S=/tmp/gpustore/stability; mkdir -p $S
if ls .gpu/st/stability.tar.xz.part* >/dev/null 2>&1; then
  cat .gpu/st/stability.tar.xz.part* | xz -dc | tar xf - -C $S; echo "store: from .gpu/st"
else
  xz -dc benchmarks/records/2026-12-06-gpu-check-resumed/store-stability.tar.xz | tar xf - -C $S; echo "store: the committed one"
fi
echo "store stability: $(find $S -type f | wc -l) files"
touch /tmp/orchestrator.started
left=$(( STOP_AT - MARGIN - $(date +%s) ))
cat > /tmp/orch.sh <<EOS
export PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "stability: start \$(date -u +%H:%M:%S) budget $left"
bash benchmarks/gpu/check.sh --study benchmarks/gpu/stability.yaml --work /tmp/ddsweep-stab --store $S --time-budget $left > /tmp/stability.log 2>&1
echo "rc=\$?" >> /tmp/stability.log
echo "stability: end \$(date -u +%H:%M:%S) \$(tail -1 /tmp/stability.log)"
touch /tmp/stability.done
EOS
setsid bash /tmp/orch.sh < /dev/null > /tmp/orchestrate.log 2>&1 &
echo "start.sh: study started at $(date -u +%H:%M:%S) with budget $left s, stop at $(date -u -d @"$STOP_AT" +%H:%M:%S)"
