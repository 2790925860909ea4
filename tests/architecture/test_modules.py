"""The package's modules stay small and untangled: no import circle between modules (lazy and type-checking
imports included), no import of another module's private names, no module over 600 lines; and what every job and
Snakemake invocation imports leaves the analysis libraries out."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ddsweep"
MAX_LINES = 600


def module_name(path: Path, package: Path) -> str:
    """`ddsweep.config.study` for src/ddsweep/config/study.py, `ddsweep.config` for its __init__.py."""
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, str | None]]:
    """Every (module, name) a file imports, at any depth (name None for `import module`)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (`from a import b` counts as importing a.b when b is one)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, imported in imports(path):
            if imported and f"{module}.{imported}" in modules:
                targets.add(f"{module}.{imported}")
            elif module in modules:
                targets.add(module)
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def private_imports(package: Path) -> list[str]:
    """`from other_module import _name` across the package's modules (dunder names such as __version__ are
    public)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    bad = []
    for name, path in modules.items():
        for module, imported in imports(path):
            if (module in modules and module != name and imported and imported.startswith("_")
                    and not imported.startswith("__")):
                bad.append(f"{path.relative_to(package)}: from {module} import {imported}")
    return bad


def test_no_import_circle_in_the_package() -> None:
    assert circles(import_graph(PACKAGE)) == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(PACKAGE) == []


@pytest.mark.parametrize("module", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_600_lines(module: Path) -> None:
    lines = len(module.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module.relative_to(PACKAGE)} has {lines} lines; split it by what it holds"


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A throwaway package `pkg` under ROOT with FILES (relative path -> source)."""
    package = root / "pkg"
    for relative, text in {"__init__.py": "", **files}.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    return package


def test_the_checker_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from pkg import c\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg.a import f\n",  # imports into the circle without being part of it
    })
    assert circles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_checker_finds_a_private_import_and_allows_dunders(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "a.py": "_x = 1\n__version__ = '1'\n",
        "b.py": "from pkg.a import _x\nfrom pkg.a import __version__\n",
    })
    assert private_imports(package) == ["b.py: from pkg.a import _x"]


MAX_MODULES = 20
README = PACKAGE.parents[1] / "README.md"


@pytest.mark.parametrize("package", sorted(p.parent for p in PACKAGE.glob("*/__init__.py")), ids=lambda p: p.name)
def test_no_package_holds_over_20_modules_and_the_readme_layout_names_it(package: Path) -> None:
    count = len(list(package.glob("*.py")))
    assert count <= MAX_MODULES, f"{package.name} holds {count} modules; split it into stages by what they hold"
    layout = README.read_text(encoding="utf-8").split("## Layout", 1)[1].split("```")[1]
    assert f"  {package.name}/ " in layout, f"README's Layout does not name {package.name}/"


WORKFLOW_MODULES = sorted(set(re.findall(r"^from (ddsweep[\w.]*) import", (PACKAGE.parents[1] / "workflow" / "rules" /
                                                                        "common.smk").read_text(), re.MULTILINE)))
HEAVY = {"pandas", "scipy", "matplotlib"}  # the analysis libraries: about a second of CPU to import


@pytest.mark.parametrize(("what", "modules"), [
    # every Snakemake invocation, and each of its Slurm jobs, loads the workflow
    ("the workflow's modules", WORKFLOW_MODULES),
    # `ddsweep plan`, `select` and `funnel`: the stage plan is arithmetic; the selections load SciPy when they run
    ("the adaptive study's commands", ["ddsweep.adaptive.cli"]),
    # a point job and its stand-in
    ("run-point and the stand-in", ["ddsweep.point.run", "ddsweep.sim.cli"]),
])
def test_what_every_job_imports_leaves_the_analysis_libraries_out(what: str, modules: list[str]) -> None:
    assert modules
    code = (f"import sys\nfor name in {modules!r}: __import__(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", f"{what} import {done.stdout.strip()}"
