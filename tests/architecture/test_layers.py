"""The package's stages import only downward, and no real code path reaches the stand-in (`ddsweep.sim`)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ddsweep"

# What each top-level part of the package may import from ddsweep (besides itself). Keep in step with the
# docstrings of each package's __init__.py.
ALLOWED = {
    "storage": set(),
    "slurm": set(),
    "console": set(),
    "figures": set(),
    "formatting": set(),
    "store": {"storage"},
    "config": {"storage", "figures"},
    "budget": {"config"},
    "bench": {"storage", "config", "console", "figures", "coding"},
    "coding": {"storage", "config", "console"},
    "point": {"storage", "store", "budget", "config", "bench", "coding", "console", "slurm"},
    "analysis": {"storage", "config", "coding", "figures", "formatting"},
    "report": {"storage", "config", "analysis", "formatting"},
    "findings": {"storage", "config", "coding", "analysis", "figures", "formatting"},
    "plotting": {"storage", "analysis", "coding"},
    "commands": {"storage", "config", "analysis", "findings", "report", "plotting", "slurm"},
    "adaptive": {"storage", "config", "bench", "analysis", "findings", "report", "figures"},
    "sim": {"storage", "config", "bench", "coding"},
    "cli": set(),  # loads subcommand modules by name only (importlib), never by import statement
    "__main__": {"cli"},
    "__init__": set(),
}


def part_of(module: Path) -> str:
    """`config` for src/ddsweep/config/study.py, `storage` for src/ddsweep/storage.py."""
    relative = module.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def ddsweep_imports(module: Path) -> set[str]:
    """The top-level ddsweep parts a module imports, at any depth of the file (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "ddsweep"
                                     else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "ddsweep" and len(parts) > 1 and parts[1] != "__version__":
                found.add(parts[1])
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_only_lower_stages(module: Path) -> None:
    part = part_of(module)
    assert part in ALLOWED, f"{module}: new top-level part {part!r}; add it to ALLOWED with its rule"
    forbidden = ddsweep_imports(module) - ALLOWED[part] - {part}
    assert not forbidden, f"{module.relative_to(PACKAGE)} ({part}) imports {sorted(forbidden)}"


# The analysis modules the report may import from: the decision object's types (docs/results-schema.md).
DECISION_TYPES = {"ddsweep.analysis.outcome"}


def analysis_imports(module: Path) -> list[tuple[str, str | None]]:
    """Every (analysis module, name) a module imports, at any depth (name None for `import module`)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.startswith("ddsweep.analysis")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ddsweep":
                found += [(f"ddsweep.{a.name}", None) for a in node.names if a.name == "analysis"]
            elif node.module.startswith("ddsweep.analysis"):
                found += [(node.module, alias.name) for alias in node.names]
    return found


REPORT_MODULES = sorted((PACKAGE / "report").rglob("*.py"))


@pytest.mark.parametrize("module", REPORT_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_report_imports_only_the_decision_types_from_analysis(module: Path) -> None:
    for source, name in analysis_imports(module):
        assert source in DECISION_TYPES, f"{module.relative_to(PACKAGE)} imports {source} (not the decision types)"
        assert name is not None, f"{module.relative_to(PACKAGE)} imports the module {source}, not its types"
        assert inspect.isclass(getattr(importlib.import_module(source), name)), (
            f"{module.relative_to(PACKAGE)} imports {source}.{name}, which is not a type")


def test_the_decision_types_are_at_most_two_modules_of_types() -> None:
    assert 1 <= len(DECISION_TYPES) <= 2
    for source in DECISION_TYPES:
        module = importlib.import_module(source)
        functions = [n for n, v in vars(module).items()
                     if inspect.isfunction(v) and v.__module__ == source]
        assert not functions, f"{source} defines functions {functions}: the decision types module holds types only"


def test_the_report_checker_sees_a_function_imported_from_analysis(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("from ddsweep.analysis.outcome import Outcome\nfrom ddsweep.analysis.decisions import analyse\n"
                      "def f():\n    import ddsweep.analysis.results\n")
    assert analysis_imports(module) == [("ddsweep.analysis.outcome", "Outcome"),
                                        ("ddsweep.analysis.decisions", "analyse"), ("ddsweep.analysis.results", None)]


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from ddsweep.sim import tokenizer\n    import ddsweep.report.plots\n")
    assert ddsweep_imports(module) == {"sim", "report"}


def test_every_package_states_its_rule() -> None:
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc, f"{init}: the docstring must say what the package may import"
