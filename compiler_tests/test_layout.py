"""The test tree's rules: pytest's default import mode puts each test folder on sys.path under the
file's bare name, so two test files with one name would shadow each other, and a test that imports
another test module only works when that folder happened to be collected first."""

from __future__ import annotations

import re
from collections import Counter

from compiler_helpers import ROOT

TESTS = ROOT / "compiler_tests"


def test_test_file_names_are_unique_across_folders():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py" and "__pycache__" not in p.parts)
    assert not [n for n, k in names.items() if k > 1], f"test modules named twice: {[n for n, k in names.items() if k > 1]}"


def test_no_test_module_imports_another():
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in TESTS.rglob("test_*.py")
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if re.match(r"\s*(from|import) test_\w+", line)]
    assert not offenders, f"shared test code belongs in a *_helpers.py module at the top: {offenders}"


def test_no_package_markers_in_the_test_tree():
    """An __init__.py would switch a folder to package imports (module names like lang.test_x) and
    break the bare-name helpers."""
    assert not list(TESTS.rglob("__init__.py"))
