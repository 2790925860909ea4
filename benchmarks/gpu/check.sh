#!/usr/bin/env bash
# Check a GPU set-up in minutes: SGLang installed (online with pip, offline from a folder of wheels, or already
# there), dummy-weight models written, then the whole workflow on ar, DFLASH, STANDALONE (self-draft), NGRAM and a
# small DDTree sweep (benchmarks/gpu/study.yaml) on one NVIDIA GPU. Prints where the summary is, and exits non-zero
# when the check failed: the workflow failed, no summary was written, nothing was measured (`ddsweep status
# --expect-measured 1` prints every point and the failures grouped by cause), or a server outlived the study.
#
#   bash benchmarks/gpu/check.sh [--install online|WHEEL_DIR|none] [--work DIR] [--study FILE] [--capture]
#                                [--time-budget S] [--store DIR|s3://BUCKET/PREFIX] [-- SNAKEMAKE ARGS]
#
# --install online    pip install sglang==0.5.17 and the workflow's packages from PyPI
# --install WHEEL_DIR the same from a folder of wheels (no network)
# --install none      (default) SGLang must already import with $PYTHON (PYTHONPATH is honoured)
# --install standin   no SGLang, GPU or models: a study (--study) whose launcher is the stand-in server (`ddsweep
#                     sim-server`), to check the check itself on any machine
# --work DIR          models, the study's directory and logs (default /tmp/ddsweep-gpu)
# --study FILE        the study merged over config/config.yaml (default benchmarks/gpu/study.yaml;
#                     benchmarks/gpu/stability.yaml: two launches of ar, NGRAM and DDTree side by side); given
#                     more than once, the files are merged in order (an overlay after the study it changes)
# --capture           before the study, capture the real server's answers for the stand-in's fixtures
#                     (benchmarks/gpu/capture.py; DIR/fixtures)
# --time-budget S     start no point whose estimate does not fit in the S seconds left (budget_s); the check ends
#                     with a summary of what is measured and prints the command that resumes it
# --store DIR|s3://…  the study store (store): each finished point is copied there as it ends, and a check run on
#                     a fresh machine (or --work) with the same store resumes the study, measuring only what is missing
# DDTree needs a build that has it (SGLang PR #29907 or the ddtree-v2 build); with released SGLang the DDTree
# points are refused by the preflight and recorded, and the rest of the study runs.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ORIGINAL_ARGS=("$@")
PY=${PYTHON:-python3}
INSTALL=none WORK=/tmp/ddsweep-gpu CAPTURE=0 STUDIES=() SETTINGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --install) INSTALL=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --study) STUDIES+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    --capture) CAPTURE=1; shift ;;
    --time-budget) SETTINGS+=("budget_s=$2"); shift 2 ;;
    --store) SETTINGS+=("store=$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "check.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
started=$(date +%s)
mkdir -p "$WORK"

PACKAGES=(sglang==0.5.17 "snakemake>=9,<10" nvidia-ml-py)
case "$INSTALL" in
  none|standin) ;;
  online) "$PY" -m pip install -q "${PACKAGES[@]}" && "$PY" -m pip install -q --no-deps -e "$REPO" ;;
  *) "$PY" -m pip install -q --no-index --find-links "$INSTALL" "${PACKAGES[@]}" &&
     "$PY" -m pip install -q --no-deps --no-build-isolation -e "$REPO" ;;
esac
if [ "$INSTALL" = standin ] && [ ${#STUDIES[@]} -eq 0 ]; then
  echo "check.sh: --install standin needs --study with a stand-in launcher (the default study needs SGLang)" >&2
  exit 2
fi
if [ "$INSTALL" != standin ] && ! "$PY" -c "import sglang.srt.server_args" 2>"$WORK/sglang-import.err"; then
  echo "check.sh: SGLang does not import with $PY: $(tail -n 1 "$WORK/sglang-import.err")" >&2
  echo "check.sh: install it (--install online, or --install WHEEL_DIR) or set PYTHON/PYTHONPATH" >&2
  exit 1
fi
# ddsweep on PATH for the workflow's jobs: the installed one, else this checkout through the same interpreter
if ! command -v ddsweep >/dev/null; then
  mkdir -p "$WORK/bin"
  printf '#!/bin/sh\nPYTHONPATH="%s/src${PYTHONPATH:+:$PYTHONPATH}" exec %s -m ddsweep "$@"\n' "$REPO" "$PY" \
    > "$WORK/bin/ddsweep"
  chmod +x "$WORK/bin/ddsweep"
  export PATH="$WORK/bin:$PATH" PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$INSTALL" != standin ]; then
  echo "check.sh: $("$PY" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" "$REPO/benchmarks/gpu/make_models.py" "$WORK/models" > "$WORK/models.json"
fi
RUN=$WORK/run
mkdir -p "$RUN/config"
cp "$REPO/config/config.yaml" "$RUN/config/config.yaml"
[ ${#STUDIES[@]} -gt 0 ] || STUDIES=("$REPO/benchmarks/gpu/study.yaml")
CONFIGS=()
for i in "${!STUDIES[@]}"; do
  sed "s|@MODELS@|$WORK/models|g" "${STUDIES[$i]}" > "$RUN/config/gpu-$i.yaml"
  CONFIGS+=("$RUN/config/gpu-$i.yaml")
done

if [ "$CAPTURE" = 1 ]; then
  (cd "$RUN" && "$PY" "$REPO/benchmarks/gpu/capture.py" --config config/config.yaml "${CONFIGS[@]}" \
     --out "$WORK/fixtures" --points dflash-bs8 ddtree-v2-bs8-b8-t1-woff standalone-bs5-b4-t1-woff ngram-bs8)
fi

study_start=$(date +%s)
set +e
"$PY" -m snakemake --snakefile "$REPO/Snakefile" --directory "$RUN" --cores all --keep-going \
  --configfile "${CONFIGS[@]}" ${SETTINGS[@]+--config "${SETTINGS[@]}"} "$@"
code=$?
set -e
now=$(date +%s)
echo "check.sh: workflow exit code $code; workflow $((now - study_start)) s, whole check $((now - started)) s"
failed=()
[ "$code" = 0 ] || failed+=("the workflow exited with code $code")
if [ -f "$RUN/reports/optimization_summary.md" ]; then
  echo "check.sh: summary in $RUN/reports/optimization_summary.md (tables in $RUN/results/tables/)"
else
  failed+=("no summary was written; the point logs are in $RUN/results/logs/points/")
fi
if PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import sys; from ddsweep.budget import not_started; sys.exit(0 if not_started(sys.argv[1]) else 1)' \
    "$RUN/results"; then
  echo "check.sh: points are left for lack of time; resume with the same command: bash $0 ${ORIGINAL_ARGS[*]}"
fi
if ! ddsweep status --config "$RUN/config/config.yaml" "${CONFIGS[@]}" --results "$RUN/results" --expect-measured 1
then
  failed+=("nothing was measured: the causes are above and in the summary's first lines")
fi
leftover=$([ "$INSTALL" = standin ] || pgrep -f "sglang.launch_server" || true)
[ -z "$leftover" ] || failed+=("server processes still running: $(echo $leftover)")
for reason in "${failed[@]}"; do
  echo "check.sh: FAILED: $reason" >&2
done
if [ ${#failed[@]} -gt 0 ]; then
  [ "$code" = 0 ] && exit 1 || exit "$code"
fi
echo "check.sh: passed"
