"""The conformance package's modules import one another in one direction: no two modules import each
other, at module level or inside a function (a cycle hides which module is the lower layer)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "conformance"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package.split(".") if package else []
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            candidate = f"{target}.{alias.name}" if target else alias.name
            module = candidate if candidate in modules else target
            if module in modules and module != name:
                found.add(module)
    return found


def test_no_two_modules_import_each_other() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 30 and graph["properties.batch"], graph  # the walk sees the package
    both_ways = sorted(
        {tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph[b]}
    )
    assert both_ways == [], f"modules importing each other: {both_ways}"


def test_the_verdict_process_imports_neither_torch_nor_energon() -> None:
    """pytest's own process gives the verdicts; the supervised processes run the targets and import torch and
    Energon (1.5 CPU seconds the verdict process would spend again, on a 2-core machine, during every run)."""
    import subprocess
    import sys

    modules = [
        "primus_energon.conformance.plugin",
        "primus_energon.conformance.suite.test_conformance",
        "primus_energon.conformance.supervision",
        "primus_energon.conformance.report",
        "primus_energon.conformance.transforms",
    ]
    code = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in modules)
        + "from primus_energon.conformance.transforms import parse_transforms\n"
        + "parse_transforms(['caption: dropout rate=0.1 to=\"\"', 'latents: cast dtype=bfloat16'])\n"
        + "print(sorted(m for m in ('torch', 'megatron.energon', 'numpy', 'hypothesis') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
