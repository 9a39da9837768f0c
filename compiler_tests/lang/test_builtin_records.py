"""Every builtin is a record (pedsl/lang/builtin_defs) and lives in that record only.

Every record has the parts of its kind - signature, typing rule and doc always; then a static fold
(grids, slopes, channel groups, static temperatures), a run-time value over an array namespace with
its emitted code (elementwise math, log_length, normalize), a call site with its emitted code (the
sources with state: frozen tables, learned layers), or nothing more (transports, which
pedsl.lang.terms reads as the transports they name). The checker's table is built from the records,
the name sets consumers ask about are read off them, and no consumer of a builtin - the folder, the
shared run-time walk, its numpy and torch backends, codegen - names a builtin in a string literal.
"""

from __future__ import annotations

import ast

import pytest

from compiler_helpers import ROOT
from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.builtins import FUNCTIONS

CONSUMERS = ["pedsl/lang/fold.py", "pedsl/lang/channels.py", "pedsl/runtime/walk.py",
             "pedsl/runtime/torch_backend.py", "pedsl/runtime/numpy_backend.py", "pedsl/diffing/sample.py",
             "pedsl/compiler/codegen.py", "pedsl/compiler/kernels_template.py", "pedsl/compiler/passes.py",
             "pedsl/lang/builtins.py"]
# strings that spell a builtin's name but mean something else: codegen's reserved local names, and the
# lowered graph's operations (a rotate transform, a linear distance bias) that the kernels dispatch on
NOT_BUILTINS = {"pedsl/compiler/codegen.py": {"cos", "sin", "rotate", "learned"},  # learned: the module's attribute
                "pedsl/compiler/kernels_template.py": {"rotate", "linear"},
                # table: the kernel of a distance table; normalize: the normalize statement's carried value
                "pedsl/compiler/passes.py": {"rotate", "linear", "table", "normalize"}}


class FakeSite:
    """Stands in for codegen's SiteCode: records what a source's emit declares."""

    heads, pairs, chans = 4, 8, 16
    axes = frozenset({"head", "pair"})  # the axes of the call's value

    def __init__(self):
        self.lines, self.modules = [], 0

    def width(self, to):
        return {"pair": self.pairs, "channel": self.chans, "head": 1}[to]

    def init(self, line):
        self.lines.append(line)

    def learned(self, constructor):
        self.modules += 1
        self.init(f"self.m{self.modules} = {constructor}")
        return f"self.m{self.modules}"

    def buffer(self, key, constructor):
        self.init(f"self.b = {constructor}")
        return "b"

    def need_d_model(self):
        pass

    def history(self, tokens):
        assert tokens >= 0


def _kind(spec) -> str:
    if spec.axis_select is not None:
        return "select"
    if spec.site is not None:
        return "site"
    if spec.run is not None:
        return "run"
    if spec.fold is not None or spec.fold_env is not None:
        return "static"
    return "transport"


def test_the_table_is_the_records():
    assert FUNCTIONS == RECORDS


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_record_has_every_part(name):
    spec = RECORDS[name]
    assert FUNCTIONS[name] is spec
    assert spec.doc and spec.params and callable(spec.rule)
    kind = _kind(spec)
    params = {p for p, _ in spec.params}
    assert {p for p, _ in spec.static} <= params and set(spec.names) <= params
    assert not spec.learned or kind == "site"
    assert (spec.channels is not None) == (spec.category == "channels")
    if kind == "select":  # an axis selection: the walk and codegen build its value from per-pair constants
        assert spec.category == "axes" and spec.run is None and spec.emit is None and spec.fold is None
        assert sorted(spec.axis_select([2, 1], 3)) == [0, 0, 1]  # every pair one axis, as many as its size
        return
    if kind == "transport":  # no value: pedsl.lang.terms reads the transport it names
        assert spec.category == "transport" and spec.emit is None and not spec.static
        assert name in (ROOT / "pedsl/lang/terms.py").read_text()
        return
    assert spec.category != "transport"
    static = {p: "3" for p, _ in spec.static}
    if kind == "static":  # its arguments must be known at compile time, so it always folds
        if spec.reads_length:  # folded again at each run-time length; its code picks the length's value
            compile(spec.emit(lambda n: "C", 4, **static), name, "eval")
        else:
            assert spec.emit is None
        return
    assert not spec.reads_length and spec.emit is not None  # a run-time value runs in the module and its code
    values = [p for p, _ in spec.params if p not in static and p not in spec.names]
    if kind == "run":
        code = spec.emit(*spec.inputs, *values, **static)
    else:
        g = FakeSite()
        names = {"index": "token", "to": "pair", "input": "x", "per": "head"}
        code = spec.emit(g, *values, **{p: names[p] for p in spec.names}, **static)
        assert bool(g.modules) == spec.learned  # a learned site declares its sub-module
        for line in g.lines:
            compile(line, name, "exec")
    compile(code, name, "eval")  # the emitted code is a Python expression over its arguments' code


def test_no_consumer_names_a_builtin():
    for rel in CONSUMERS:
        tree = ast.parse((ROOT / rel).read_text())
        named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        named -= NOT_BUILTINS.get(rel, set())
        assert not named & set(RECORDS), f"{rel} names builtins {sorted(named & set(RECORDS))}"
