"""mypy's configuration (pyproject.toml): the CI step `mypy` type-checks the package; here, fast, that its
baseline of modules still ignored names real modules only and never the core, and that CI runs it."""

from __future__ import annotations

import tomllib

from compiler_helpers import ROOT

CORE = ("pedsl.lang.statements", "pedsl.compiler.plan", "pedsl.compiler.kernel_support", "pedsl.compiler.scores",
        "pedsl.compiler.passes", "pedsl.errors", "pedsl.diagnostic_codes")


def _mypy() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def _baseline() -> list[str]:
    return [m for o in _mypy()["overrides"] if o.get("ignore_errors") for m in o["module"]]


def test_the_baseline_names_existing_modules_and_not_the_core():
    for module in _baseline():
        path = ROOT.joinpath(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), f"stale entry {module}"
    assert not set(CORE) & set(_baseline())
    assert _baseline() == sorted(_baseline())


def test_ci_runs_mypy_over_the_package():
    assert _mypy()["files"] == ["pedsl"] and _mypy()["check_untyped_defs"]
    assert "\nmypy" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
