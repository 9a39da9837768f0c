"""No function in pedsl/ is longer than a screen: 80 lines from ``def`` to its last line (docstring
included; a click command's option decorators are its signature, not its body). No module is longer than
600 lines, so that each holds one thing its name says: split a long one along its seams."""

from __future__ import annotations

import ast

from compiler_helpers import ROOT

MAX_LINES = 80
MAX_MODULE_LINES = 600


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


def long_modules(root=ROOT / "pedsl") -> dict[str, int]:
    """The Python modules under ``root`` over :data:`MAX_MODULE_LINES` lines, with their line counts."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            out[path.relative_to(root).as_posix()] = n
    return out


def test_no_module_over_600_lines():
    over = long_modules()
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them along their seams): {over}"


def test_a_long_module_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES, encoding="utf-8")
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    assert long_modules(tmp_path) == {"pkg/long.py": MAX_MODULE_LINES + 1}
