#!/usr/bin/env bash
# Install SGLang's command-line parser and request classes (not a GPU runtime) into the virtualenv given as $1,
# so that `ddsweep preflight` checks server flags against the real `python -m sglang.launch_server` parser and
# the strict stand-in (ddsweep.sim.contract) validates requests with SGLang's own classes on a machine without
# a GPU. It installs the CPU build of torch and SGLang without its dependencies, plus the packages that
# importing sglang.srt.server_args, sglang.srt.entrypoints.openai.protocol (TokenizeRequest,
# ChatCompletionRequest, CompletionRequest), sglang.srt.entrypoints.api_contract and sglang.srt.utils.common
# (build_server_info) need, at the versions SGLang pins; the full `sglang` install would pull a CUDA torch.
# sglang.srt.managers.io_struct (GenerateReqInput) also imports torchvision, which has no build for torch
# 2.13.0 CPU on PyPI: without it the stand-in checks /generate with SGLang's api_contract schema only.
# Idempotent: it does nothing when everything already imports. Usage: .ci/sglang-cpu.sh VENV
set -euo pipefail

venv=${1:?usage: .ci/sglang-cpu.sh VENV (a Python virtualenv directory)}
python="$venv/bin/python"
sglang_version=${SGLANG_VERSION:-0.5.23}
torch_version=${TORCH_VERSION:-2.13.0}

probe() {
    "$python" -c 'import argparse
from sglang.srt.server_args import ServerArgs
from sglang.srt.entrypoints.openai.protocol import TokenizeRequest, ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.utils.common import build_server_info
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
    packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp huggingface-hub \
    "transformers==5.19.0" "openai==2.8.0" fastapi "uvicorn>=0.51"
if ! probe; then
    echo "sglang-cpu: installed, but SGLang's parser or request classes still do not import:" >&2
    "$python" -c 'import sglang.srt.server_args, sglang.srt.entrypoints.openai.protocol, sglang.srt.utils.common' >&2 || true
    exit 1
fi
echo "sglang-cpu: SGLang $sglang_version argument parser and request classes ready in $venv ($((SECONDS - start)) s)"
