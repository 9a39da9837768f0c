"""No function in pedsl/ is longer than a screen: 80 lines from ``def`` to its last line (docstring
included; a click command's option decorators are its signature, not its body)."""

from __future__ import annotations

import ast

from compiler_helpers import ROOT

MAX_LINES = 80


def long_functions() -> dict[str, int]:
    out = {}
    for path in sorted((ROOT / "pedsl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    out[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = n
    return out


def test_no_function_over_a_screen():
    over = long_functions()
    assert not over, f"functions over {MAX_LINES} lines (split them along their steps): {over}"
