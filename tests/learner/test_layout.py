"""The learner package's shape (docs/architecture.md): no import circles (of any length, imports
inside functions included), no function or class longer than ~150 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 150


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


def test_no_function_or_class_in_learner_is_longer_than_150_lines():
    long = []
    for name, tree in learner_modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == [], long
