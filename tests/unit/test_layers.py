"""Imports point down only: libraries <- services <- the application (docs/architecture.md,
"Layers"). Walks every module's imports (top-level and inside functions) and fails on an
upward one, and on a service reaching into another service."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layer(module: str) -> tuple[int, str]:
    """(rank, unit): libraries 0, services 1, application 2; unit names the service."""
    parts = module.split(".")
    if parts[:2] == ["mutualrl", "app"]:
        return 2, "app"
    if parts[:2] == ["mutualrl", "services"]:
        return 1, ".".join(parts[:3])
    return 0, "lib"


def _modules() -> list[tuple[str, Path]]:
    roots = {"libs/core": "mutualrl", "app": "mutualrl.app", "services": "mutualrl.services"}
    for d in sorted((ROOT / "libs").iterdir()):
        if d.is_dir() and d.name != "core":
            roots[f"libs/{d.name}"] = f"mutualrl.{d.name}"
    out = []
    for rel, pkg in roots.items():
        for f in sorted((ROOT / rel).rglob("*.py")):
            sub = f.relative_to(ROOT / rel).with_suffix("").parts
            sub = sub[:-1] if sub[-1] == "__init__" else sub
            out.append((".".join((pkg, *sub)), f))
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(n, m) for n, m in found if m.startswith("mutualrl")]


def test_every_package_is_walked():
    names = {m for m, _ in _modules()}
    for expected in ("mutualrl.app.cli", "mutualrl.services.mwra.planner", "mutualrl.weights.store", "mutualrl.runtime.policy_setup"):
        assert expected in names


def test_imports_point_down_only():
    upward = []
    for module, path in _modules():
        rank, unit = _layer(module)
        for line, target in _imports(path):
            t_rank, t_unit = _layer(target)
            if t_rank > rank or (rank == 1 and t_rank == 1 and t_unit != unit):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({module}) imports {target}")
    assert not upward, "upward or sideways imports:\n" + "\n".join(upward)


def _target_module(name: str, known: set[str]) -> str | None:
    """The module an import loads: ``mutualrl.see.exchange.stream_name`` → ``mutualrl.see.exchange``."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_no_import_circles():
    """No two modules import each other, directly or around a loop, not even inside a function
    (a function-level import that only hides a circle from the interpreter hides it from readers
    too)."""
    modules = dict(_modules())
    known = set(modules)
    graph = {m: {t for _, imp in _imports(path) if (t := _target_module(imp, known)) and t != m} for m, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
