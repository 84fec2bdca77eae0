"""The house shows the flow: the conformance package's folders are its processes and stages, and its modules
import one another in one direction.

* no circle of imports of any length (at module level or inside a function: a circle hides which module
  is the lower layer);
* ``core`` (claims, results, declarations, profiles, options) imports only ``core`` and the standard
  library; ``oracles`` (fields, comparisons, statistics) only ``core`` and ``oracles``; ``data`` neither
  ``engine``, ``processes``, ``properties`` nor the verdict side;
* a property module imports no other property module, only the shared helpers (``properties/_*.py``);
* no module name is used twice inside the package;
* the verdict side (pytest's process: ``verdict``, ``core`` and the supervisor) imports neither torch,
  numpy, Energon nor hypothesis.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "conformance"
PACKAGE = "primus_energon.conformance"
FOLDERS = ("core", "verdict", "processes", "engine", "oracles", "data", "properties")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The package's modules ``name`` imports, and the top-level packages it imports from outside."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            outside.update(alias.name.split(".")[0] for alias in node.names)
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if not node.level:
            module = node.module or ""
            if module.startswith(PACKAGE + "."):
                target = module.removeprefix(PACKAGE + ".")
                found.add(target if target in modules else target.rpartition(".")[0])
            else:
                outside.add(module.split(".")[0])
            continue
        base = package.split(".") if package else []
        if node.level - 1 > len(base):
            outside.add("primus_energon")  # the library beside the package (primus_energon._lazy)
            continue
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            candidate = f"{target}.{alias.name}" if target else alias.name
            module = candidate if candidate in modules else target
            if module in modules and module != name:
                found.add(module)
    return found, outside


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    graph, outside = {}, {}
    for name, path in modules.items():
        graph[name], outside[name] = _imports(name, path, modules)
    return graph, outside


def _folder(name: str) -> str:
    return name.split(".")[0] if "." in name else ""


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_walk_sees_the_package() -> None:
    graph, _ = _graph()
    assert len(graph) > 50 and graph["properties.batch"] and graph["api"], graph
    assert {_folder(name) for name in graph} >= set(FOLDERS)


def test_no_circle_of_imports_of_any_length() -> None:
    graph, _ = _graph()
    assert _circles(graph) == []
    # the test finds a circle of three, which a test of pairs would not
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_folder_imports_only_the_layers_below_it() -> None:
    graph, outside = _graph()
    allowed = {
        "core": {"core"},
        "oracles": {"core", "oracles"},
        "data": {"core", "oracles", "data"},
    }
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if _folder(name) in allowed and _folder(target) not in allowed[_folder(name)]
    )
    assert wrong == []
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = sorted(
        f"{name}: {sorted(outside[name] - stdlib)}"
        for name in graph
        if _folder(name) == "core" and outside[name] - stdlib
    )
    assert foreign == [], "core imports the standard library only"


def test_a_property_imports_no_other_property() -> None:
    graph, _ = _graph()
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("properties.")
        for target in targets
        if target.startswith("properties.") and not target.rpartition(".")[2].startswith("_")
    )
    assert wrong == []


def test_no_module_name_is_used_twice() -> None:
    names: dict[str, list[str]] = {}
    for name in _modules():
        leaf = name.rpartition(".")[2]
        if leaf and not leaf.startswith("__"):
            names.setdefault(leaf, []).append(name)
    twice = {leaf: where for leaf, where in names.items() if len(where) > 1 and leaf not in FOLDERS}
    assert twice == {}


def test_the_verdict_process_imports_neither_torch_nor_energon() -> None:
    """pytest's own process gives the verdicts; the supervised processes run the targets and import torch and
    Energon (1.5 CPU seconds the verdict process would spend again, on a 2-core machine, during every run)."""
    core = [f"{PACKAGE}.core.{p.stem}" for p in sorted((ROOT / "core").glob("*.py")) if p.stem != "__init__"]
    verdict = [
        f"{PACKAGE}.verdict.{p.stem}" for p in sorted((ROOT / "verdict").glob("*.py")) if p.stem != "__init__"
    ]
    modules = [
        *core,
        *verdict,
        f"{PACKAGE}.verdict.suite.test_conformance",
        f"{PACKAGE}.processes.supervisor",
    ]
    code = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in modules)
        + f"from {PACKAGE}.core.declarations import parse_transforms\n"
        + "parse_transforms(['caption: dropout rate=0.1 to=\"\"', 'latents: cast dtype=bfloat16'])\n"
        + "print(sorted(m for m in ('torch', 'megatron.energon', 'numpy', 'hypothesis') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
