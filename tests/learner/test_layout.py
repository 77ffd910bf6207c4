"""The learner package's shape (docs/architecture.md): no import circles (of any length, imports
inside functions included), no class longer than 150 lines, no function longer than 60."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def learner_modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in sorted((ROOT / "learner").rglob("*.py"))}


def imports_of(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Learner modules ``name`` imports anywhere (module level or inside a function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against the package
                package = name.split(".")[: -node.level] if not name.endswith("__init__") else name.split(".")
                base = ".".join([*package, node.module])
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in known and m != name}


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (a path that comes back to its start), or []."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str]:
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return []
        for dep in sorted(graph[name]):
            if cycle := visit(dep, [*path, name]):
                return cycle
        done.add(name)
        return []

    for name in sorted(graph):
        if cycle := visit(name, []):
            return cycle
    return []


def test_no_import_circles_in_learner():
    modules = learner_modules()
    graph = {name: imports_of(name, tree, set(modules)) for name, tree in modules.items()}
    assert "learner.driver.rules" in graph["learner.sim.engine"]  # the parser sees real imports
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check sees cycles
    assert import_cycle(graph) == []


def test_no_class_in_learner_is_longer_than_150_lines_and_no_function_than_60():
    long = []
    for name, tree in learner_modules().items():
        for node in ast.walk(tree):
            limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                     else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if limit is not None and node.end_lineno - node.lineno + 1 > limit:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == [], long
