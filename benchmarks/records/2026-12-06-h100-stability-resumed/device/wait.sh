#!/bin/bash
# wait.sh LIMIT_S: waits until the study has ended or LIMIT_S s have passed since CMD_START (the command's start),
# then packs the store (xz, parts of at most 15 MiB), the logs and the work dir's logs into $OUT.
set -u
LIMIT=$1 START=${CMD_START:-$(date +%s)}
while [ ! -f /tmp/stability.done ] && [ $(( $(date +%s) - START )) -lt "$LIMIT" ]; do sleep 5; done
echo "wait.sh: packing at $(date -u +%H:%M:%S) ($(( $(date +%s) - START )) s into the command); done=$([ -f /tmp/stability.done ] && echo yes || echo no)"
[ -d /tmp/gpustore/stability ] && tar cf - -C /tmp/gpustore/stability . | xz -T0 -6 | split -b 15M -d -a 1 - "$OUT/stability.tar.xz.part"
cp /tmp/orchestrate.log /tmp/stability.log "$OUT/" 2>/dev/null
tar czf "$OUT/work-logs.tgz" -C /tmp/ddsweep-stab --ignore-failed-read $(cd /tmp/ddsweep-stab 2>/dev/null && ls -d logs study/logs study/.snakemake/log 2>/dev/null) 2>/dev/null
ls -la "$OUT"; cat /tmp/orchestrate.log; tail -5 /tmp/stability.log
