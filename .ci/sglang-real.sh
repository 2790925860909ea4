#!/usr/bin/env bash
# Install a real SGLang 0.5.23 server that runs on a CPU-only machine into the virtualenv given as $1, with nothing
# downloaded but packages from the package registries, in about 2 GB:
#   - torch 2.13.0, the CPU build that lies on the CI machine's disk (pip's find-links, PIP_FIND_LINKS; elsewhere
#     PyPI's build of the same version) instead of SGLang's pin 2.14.1, whose PyPI wheel is the CUDA build (about 7 GB
#     with its NVIDIA libraries: more than the CI machine's disk had free); SGLang runs unchanged on it;
#   - PyPI's torchvision 0.28.0 (the release for torch 2.13) without dependencies, with its two unguarded operator
#     registrations guarded (.ci/real-sglang/guard_torchvision_ops.py: its operator library links CUDA torch and
#     does not load beside the CPU build; SGLang imports torchvision for vision configs only);
#   - SGLang itself without its dependencies (those pull GPU-only kernel wheels that do not import here), and the
#     pure-Python packages SGLang imports to serve, at the versions its wheel pins;
#   - the sgl_kernel stand-in (.ci/real-sglang/kernel): the one CPU kernel plain decoding calls, in pure PyTorch;
#     it goes first on PYTHONPATH of the server process only, never into site-packages;
#   - a tiny random Llama model with a locally trained tokenizer (.ci/real-sglang/make_tiny_model.py);
#   - the manifest VENV/ddsweep-real-sglang.json that tests read: model and kernel directories, versions, the
#     server's environment and flags.
# The same virtualenv also gives `ddsweep preflight` SGLang's argument parser and the strict stand-in
# (ddsweep.sim.contract) SGLang's request classes, GenerateReqInput included.
# Idempotent: it does nothing when the manifest is current and the server's modules import.
# Usage: .ci/sglang-real.sh VENV
set -euo pipefail

venv=${1:?usage: .ci/sglang-real.sh VENV (a Python virtualenv directory)}
here=$(cd "$(dirname "$0")" && pwd)
python="$(cd "$venv" && pwd)/bin/python"
sglang_version=0.5.23
torch_version=2.13.0
torchvision_version=0.28.0
kernel_dir="$here/real-sglang/kernel"
state_dir="$(cd "$venv" && pwd)/ddsweep-real-sglang"
model_dir="$state_dir/model"
manifest="$(cd "$venv" && pwd)/ddsweep-real-sglang.json"
# What SGLang 0.5.23 imports to serve a Llama model on CPU, found by starting the server; pins from its METADATA.
packages=(
    numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp
    huggingface-hub safetensors jsonschema pyyaml dill gguf einops interegular partial_json_parser prometheus-client python-multipart
    setproctitle uvloop fastapi "uvicorn>=0.51" "python-dateutil<3" "transformers==5.19.0" "tokenizers==0.23.2"
    "openai==2.8.0" "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" "xgrammar==0.2.7"
    "soundfile==0.13.1"
)

if [[ ! -x "$python" ]]; then
    echo "sglang-real: $python does not exist; pass the directory of a Python virtualenv" >&2
    exit 2
fi

probe() {
    [[ -f "$manifest" && -f "$model_dir/config.json" && -f "$model_dir/tokenizer.json" ]] || return 1
    "$python" - "$manifest" "$kernel_dir" "$sglang_version" "$torch_version" <<'PY' >/dev/null 2>&1
import json, sys
manifest, kernel, sglang_version, torch_version = sys.argv[1:]
doc = json.load(open(manifest))
assert doc["kernel_dir"] == kernel and doc["versions"]["sglang"] == sglang_version
sys.path.insert(0, kernel)
import os
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
import torch, torchvision  # noqa: F401
assert torch.__version__.split("+")[0] == torch_version
import sglang
assert sglang.__version__ == sglang_version
import sglang.launch_server, sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler  # noqa: F401
import sglang.srt.managers.detokenizer_manager, sglang.srt.model_executor.model_runner, sglang.srt.models.llama  # noqa: F401
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: F401
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, TokenizeRequest  # noqa: F401
PY
}

if probe; then
    echo "sglang-real: SGLang $sglang_version (CPU) and the tiny model are ready in $venv"
    exit 0
fi
start=$SECONDS
# The CPU build of torch where a find-links folder holds it (named as a file, so that any installer takes it).
torch_spec="torch==$torch_version"
for links in ${PIP_FIND_LINKS:-}; do
    for wheel in "$links"/torch-"$torch_version"+cpu-*.whl; do
        [[ -f "$wheel" ]] && torch_spec=$wheel
    done
done
# uv where the virtualenv has it (as .ci/run installs it): its parallel downloads take a fraction of pip's time.
# Bytecode: compiled at install only where Python does not write it itself (PYTHONDONTWRITEBYTECODE set), since
# every server start would otherwise compile what it imports again; elsewhere the import check at the end compiles
# what the server imports, once (torch, transformers and SGLang have some 9,000 modules, most never imported here).
uv="$(dirname "$python")/uv"
if [[ -x "$uv" ]]; then
    install=("$uv" pip install --quiet --python "$python" --no-cache)
    if [[ -n "${PYTHONDONTWRITEBYTECODE:-}" ]]; then
        install+=(--compile-bytecode)
    fi
else
    install=("$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
fi
"${install[@]}" "$torch_spec" "${packages[@]}"
# Without dependencies: torchvision's would replace the CPU torch.
"${install[@]}" --no-deps "torchvision==$torchvision_version" "sglang==$sglang_version"
"$python" "$here/real-sglang/guard_torchvision_ops.py"
echo "sglang-real: packages installed ($((SECONDS - start)) s)"
rm -rf "$model_dir"
"$python" "$here/real-sglang/make_tiny_model.py" "$model_dir" >/dev/null
"$python" - "$manifest" "$model_dir" "$kernel_dir" "$python" <<'PY'
import json, sys
from importlib.metadata import version
manifest, model, kernel, python = sys.argv[1:]
doc = {
    "model_dir": model,
    "kernel_dir": kernel,
    "python": python,
    "versions": {name: version(name) for name in ("sglang", "torch", "torchvision", "transformers", "tokenizers")},
    # The server process's environment: the CPU engine (without it the rotary embedding imports vLLM's kernels)
    # and the sgl_kernel stand-in first on its import path.
    "env": {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": kernel},
    "server_args": ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
                    "--disable-cuda-graph", "--max-total-tokens", "65536", "--skip-server-warmup", "--sleep-on-idle"],
    "model": json.load(open(f"{model}/ddsweep-tiny-model.json")),
}
json.dump(doc, open(manifest, "w"), indent=2)
PY
if ! probe; then
    echo "sglang-real: installed, but the server's modules still do not import:" >&2
    SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$kernel_dir" "$python" -c 'import sglang.launch_server, sglang.srt.managers.scheduler, sglang.srt.models.llama' >&2 || true
    exit 1
fi
echo "sglang-real: SGLang $sglang_version on CPU, the sgl_kernel stand-in and the tiny model ready in $venv; manifest $manifest ($((SECONDS - start)) s)"
