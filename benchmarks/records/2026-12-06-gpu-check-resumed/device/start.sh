#!/bin/bash
# start.sh STOP_AT CHECK_BUDGET: on the GPU machine, after the three wheel installs. Installs the DDTree build,
# the filesystem store's plugin and rsync, unpacks the carried stores into /tmp/gpustore, and starts (in its own
# session) the check study resumed from its store, then the stability study with its own store and a time budget
# that ends by STOP_AT (Unix time). Idempotent: a second call on the same machine starts nothing new.
set -u
STOP_AT=$1 CHECK_BUDGET=$2
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
mkdir -p /tmp/gpustore
for s in check stability; do
  mkdir -p /tmp/gpustore/$s
  if ls .gpu/store/$s.tar.xz.part* >/dev/null 2>&1; then cat .gpu/store/$s.tar.xz.part* | xz -dc | tar xf - -C /tmp/gpustore/$s; fi
  echo "store $s: $(find /tmp/gpustore/$s -type f | wc -l) files"
done
touch /tmp/orchestrator.started
setsid bash .gpu/drv/orchestrate.sh "$STOP_AT" "$CHECK_BUDGET" < /dev/null > /tmp/orchestrate.log 2>&1 &
echo "start.sh: orchestrator started at $(date -u +%H:%M:%S), stop at $(date -u -d @"$STOP_AT" +%H:%M:%S)"
