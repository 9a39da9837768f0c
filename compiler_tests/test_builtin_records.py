"""A builtin converted to a record (pedsl/lang/builtin_defs) lives in that record only.

Every record has all its parts (signature, typing rule, static fold, run-time value over an array
namespace, emitted code), the checker's table is built from the records, and no consumer of a
builtin - the folder, the shared run-time walk, its numpy and torch backends, codegen - names a
converted builtin in a string literal: it reads the record instead.
"""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT
from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.builtins import FUNCTIONS

CONSUMERS = ["pedsl/lang/fold.py", "pedsl/lang/channels.py", "pedsl/runtime/walk.py",
             "pedsl/runtime/torch_backend.py", "pedsl/diffing/sample.py", "pedsl/compiler/codegen.py",
             "pedsl/compiler/kernels_template.py", "pedsl/lang/builtins.py"]
# strings that spell a builtin's name but mean something else: codegen's reserved local names
NOT_BUILTINS = {"pedsl/compiler/codegen.py": {"cos", "sin"}}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_record_has_every_part(name):
    spec = RECORDS[name]
    assert FUNCTIONS[name] is spec
    assert spec.doc and spec.params and callable(spec.rule)
    assert callable(spec.fold or spec.fold_env)  # every converted builtin folds where it can
    if spec.reads_length:  # static, folded again at each run-time length; its code picks the length's value
        assert spec.run is None and spec.fold_env is not None
        code = spec.emit(lambda n: "C", 4, **{p: "1.5" for p, _ in spec.static})
        compile(code, name, "eval")
        return
    assert (spec.run is None) == (spec.emit is None)  # a run-time value runs in the module and its code
    if spec.run is None:  # static: its arguments must be known at compile time, so it always folds
        return
    static = {p: "1.5" for p, _ in spec.static}
    code = spec.emit(*spec.inputs, *(p for p, _ in spec.params if p not in static), **static)
    compile(code, name, "eval")  # the emitted code is a Python expression over its arguments' code


def test_no_consumer_names_a_record_builtin():
    for rel in CONSUMERS:
        tree = ast.parse((ROOT / rel).read_text())
        named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        named -= NOT_BUILTINS.get(rel, set())
        assert not named & set(RECORDS), f"{rel} names record builtins {sorted(named & set(RECORDS))}"
