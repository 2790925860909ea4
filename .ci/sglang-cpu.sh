#!/usr/bin/env bash
# Install SGLang's command-line parser (not a GPU runtime) into the virtualenv given as $1, so that
# `ddsweep preflight` can check server flags against the real `python -m sglang.launch_server` parser on a
# machine without a GPU. It installs the CPU build of torch and SGLang without its dependencies, plus the
# few packages that importing sglang.srt.server_args needs; the full `sglang` install would pull a CUDA torch.
# Idempotent: it does nothing when the parser already builds. Usage: .ci/sglang-cpu.sh VENV
set -euo pipefail

venv=${1:?usage: .ci/sglang-cpu.sh VENV (a Python virtualenv directory)}
python="$venv/bin/python"
sglang_version=${SGLANG_VERSION:-0.5.23}
torch_version=${TORCH_VERSION:-2.13.0}

probe() {
    "$python" -c 'import argparse
from sglang.srt.server_args import ServerArgs
ServerArgs.add_cli_args(argparse.ArgumentParser())' >/dev/null 2>&1
}

if [[ ! -x "$python" ]]; then
    echo "sglang-cpu: $python does not exist; pass the directory of a Python virtualenv" >&2
    exit 2
fi
if probe; then
    echo "sglang-cpu: SGLang's argument parser is already importable in $venv"
    exit 0
fi
start=$SECONDS
"$python" -m pip install --quiet --disable-pip-version-check "torch==$torch_version"
"$python" -m pip install --quiet --disable-pip-version-check --no-deps "sglang==$sglang_version"
"$python" -m pip install --quiet --disable-pip-version-check numpy orjson psutil pybase64 requests triton \
    packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp huggingface-hub
if ! probe; then
    echo "sglang-cpu: installed, but sglang.srt.server_args still does not import:" >&2
    "$python" -c 'import sglang.srt.server_args' >&2 || true
    exit 1
fi
echo "sglang-cpu: SGLang $sglang_version argument parser ready in $venv ($((SECONDS - start)) s)"
