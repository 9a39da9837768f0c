"""The general forward is written once: every module `pedsl compile` writes carries the modules of the
package's pedsl/compiler/general/ (and the expression kernels, and PaTH's kernels for a PaTH scheme) byte for
byte, and its definitions are those."""

from __future__ import annotations

import ast

import pytest

from compiler_helpers import ROOT
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.compiler.embedded import (DISTANCE_EMBEDDED, EMBEDDED, NATIVE_EMBEDDED, PATH_EMBEDDED, embedded_modules,
                                     embedded_section)

SCHEMES = ROOT / "schemes"


def _definitions(text: str) -> dict[str, str]:
    """Each top-level function's and class's lines (sliced from the lines split once: a generated module carrying
    the C++ kernels' loader holds thousands of lines)."""
    lines = text.splitlines()
    return {n.name: "\n".join(lines[n.lineno - 1:n.end_lineno]) for n in ast.parse(text).body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("name", ["rope", "fox", "path_fox", "acc_learned_qkv", "t5_bias"])
def test_generated_module_carries_the_package_general_forward_verbatim(name):
    m = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=8, d_model=16)
    text = generate(m.scheme, m.plan, d_model=16)
    carried = embedded_modules(m.plan)
    assert (set(PATH_EMBEDDED) <= set(carried)) == name.startswith("path")  # PaTH's kernels where PaTH runs
    native = name in ("fox", "path_fox", "t5_bias")  # a C++ kernel in the plan: the C++ files and their loader
    assert (set(NATIVE_EMBEDDED) <= set(carried)) == native
    # the Toeplitz kernel where tables are; its support check where the C++ kernels are
    assert (set(DISTANCE_EMBEDDED) <= set(carried)) == (name == "t5_bias" or native)
    generated = _definitions(text)
    for module in carried:
        section = embedded_section(module)
        assert section.rstrip() in text, f"{module}.py is not copied verbatim"
        package = (ROOT / "pedsl" / f"{module.replace('.', '/')}.py").read_text(encoding="utf-8")
        # the compiler's modules define nothing above their banner; the kernels' checked public calls sit there
        for fn, src in _definitions(package if module.startswith("compiler.") else section).items():
            assert generated.get(fn) == src, f"{fn} of {module}.py differs in the generated module"


def test_the_section_is_the_whole_forward():
    """What is copied of the package's modules holds the forward's steps and the cache (each banner sits above
    them), and every module of the package is copied."""
    general = [m for m in EMBEDDED if m.startswith("compiler.general.")]
    files = sorted((ROOT / "pedsl" / "compiler" / "general").glob("*.py"))
    # protocols.py and mask_side.py hold annotations only (imported under TYPE_CHECKING): nothing of them runs
    annotations = ("__init__", "protocols", "mask_side")
    assert sorted(f"compiler.general.{f.stem}" for f in files if f.stem not in annotations) == sorted(general)
    names = set(_definitions("".join(embedded_section(m) for m in general)))
    assert {"layout", "Window", "transports", "biases", "attend_blocks", "path_attend", "update_cache",
            "AttentionCache", "general_forward", "TorchKernels"} <= names
