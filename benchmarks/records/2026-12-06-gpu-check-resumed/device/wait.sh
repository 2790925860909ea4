#!/bin/bash
# wait.sh LIMIT_S: waits until the orchestrator has finished both studies or LIMIT_S seconds have passed since
# the command started ($SECONDS of the caller is not seen: pass the command's start as CMD_START), then packs both
# stores (xz, parts of at most 15 MiB) and the logs into $OUT.
set -u
LIMIT=$1 START=${CMD_START:-$(date +%s)}
while [ ! -f /tmp/stability.done ] && [ $(( $(date +%s) - START )) -lt "$LIMIT" ]; do sleep 5; done
echo "wait.sh: packing at $(date -u +%H:%M:%S) ($(( $(date +%s) - START )) s into the command); check.done=$([ -f /tmp/check.done ] && echo yes || echo no) stability.done=$([ -f /tmp/stability.done ] && echo yes || echo no)"
for s in check stability; do
  [ -d /tmp/gpustore/$s ] || continue
  tar cf - -C /tmp/gpustore/$s . | xz -T0 -6 | split -b 15M -d -a 1 - "$OUT/$s.tar.xz.part"
done
cat /tmp/orchestrate.log /tmp/check.log /tmp/stability.log 2>/dev/null > "$OUT/logs.txt"
tar czf "$OUT/logs.tgz" -C /tmp --ignore-failed-read orchestrate.log check.log stability.log 2>/dev/null
ls -la "$OUT"; cat /tmp/orchestrate.log
