"""The controller package's shape: no class longer than 150 lines, no function longer than 60
(the limits tests/learner/test_layout.py holds the learner to). Migrations are generated, not
written: they are left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60


def too_long(source: str) -> list[str]:
    """Each class or function of a module's ``source`` past its limit, with its length."""
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                 else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            found.append(f"{node.name}: {node.end_lineno - node.lineno + 1} lines")
    return found


def test_no_class_in_controller_is_longer_than_150_lines_and_no_function_than_60():
    assert too_long("class Long:\n" + "    x = 1\n" * MAX_CLASS_LINES) == ["Long: 151 lines"]  # the check sees one
    assert too_long("def f():\n" + "    pass\n" * MAX_FUNCTION_LINES) == ["f: 61 lines"]
    modules = [p for p in sorted((ROOT / "controller").rglob("*.py")) if "migrations" not in p.parts]
    assert len(modules) > 50  # the walk sees the package
    long = [f"{p.relative_to(ROOT)}: {entry}" for p in modules for entry in too_long(p.read_text())]
    assert long == [], long
