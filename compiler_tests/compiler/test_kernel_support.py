"""The kernels' declarations (pedsl/compiler/kernel_support.py): every plan field is a feature or is
listed as one every kernel takes, the plan records what the declarations allow, and no executor keeps a
list of its own."""

from __future__ import annotations

import dataclasses
import re

import pytest

from compiler_helpers import ROOT, library
from pedsl.compiler import compile_plan, kernel_support as K, plan as P
from pedsl.lang.api import load
from pedsl.lang.statements import CARRIED

CARRIED_NAMES = {c.name for c in CARRIED}  # features by their records (the next test)


class _Reads:
    """A record whose attribute reads are noted (per record class), recursively into tuples of records."""

    def __init__(self, obj, seen: dict):
        self._obj, self._seen = obj, seen

    def __getattr__(self, name):
        self._seen.setdefault(type(self._obj).__name__, set()).add(name)
        value = getattr(self._obj, name)
        if dataclasses.is_dataclass(value):
            return _Reads(value, self._seen)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            return tuple(_Reads(v, self._seen) for v in value)
        return value


def _plans():
    return [compile_plan(load(path, heads=2, head_dim=32 if path.stem == "longrope" else 16)) for path in library()]


def test_every_plan_field_is_a_feature_or_taken_by_every_kernel():
    """A new field of the plan (a new statement's) is read by plan_features or listed in NOT_FEATURES with
    the fields no executor branches on: otherwise a kernel could be chosen that ignores it."""
    seen: dict[str, set] = {}
    for plan in _plans():
        K.plan_features(_Reads(plan, seen))
    for cls in (P.Plan, P.TransportStep, P.BiasTerm, P.Temperature):
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - seen.get(cls.__name__, set()) - set(K.NOT_FEATURES[cls.__name__]) - CARRIED_NAMES
        assert not missing, f"{cls.__name__} fields neither features nor listed in NOT_FEATURES: {sorted(missing)}"


def test_every_carried_value_other_than_its_default_is_its_records_feature():
    """The statements' values (pedsl.lang.statements.CARRIED) are features by their records: a value other than
    the default names its feature in plan_features; one without a feature of its own says why."""
    for plan in _plans():
        features = K.plan_features(plan)
        for c in CARRIED:
            value = getattr(plan, c.name)
            if c.feature is not None and value != c.default:
                assert c.feature_of(value) in features, (plan.scheme, c.name)
    softcap = dataclasses.replace(_plans()[0], softcap=2.0, window=4)
    assert {K.SOFTCAP, K.WINDOW} <= K.plan_features(softcap)


def test_the_plan_records_exactly_the_declarations_that_cover_it():
    for plan in _plans():
        features = K.plan_features(plan)
        assert plan.kernels == tuple(d.name for d in K.KERNELS if features <= d.takes
                                     and (not d.needs or features & d.needs))


@pytest.mark.parametrize("extra, absent", [
    ("softcap = 2.0", {"fused", "fused-half", "decode", "causal-sdpa"}),
    ("sink = logit", {"fused", "decode", "causal-sdpa"}),
    ("window = 4", {"fused", "causal-sdpa"}),
])
def test_a_statement_no_declaration_takes_sends_the_plan_to_the_general_path(extra, absent):
    src = f'import "{ROOT / "schemes" / "rope.pe"}"\nscheme s extends rope {{\n{extra}\n}}'
    plan = compile_plan(load(src, heads=2, head_dim=16))
    assert not absent & set(plan.kernels)


def test_an_unknown_feature_is_taken_by_no_kernel():
    """Opt in: a feature no declaration lists (what a new statement adds) leaves no kernel."""
    plan = compile_plan(load(ROOT / "schemes" / "rope.pe", heads=2, head_dim=16))
    assert plan.kernels
    assert not [d for d in K.KERNELS if d.covers(K.plan_features(plan) | {"a statement added tomorrow"})]


EXECUTORS = (*(f"compiler/{name}" for name in ("module.py", "stream.py", "band_dispatch.py", "module_values.py")),
             "ops/band_kernel.py",
             *(f"compiler/general/{f.name}" for f in sorted((ROOT / "pedsl" / "compiler" / "general").glob("*.py"))),
             "hf/attention.py", "hf/attention_call.py", "hf/attention_state.py")
# the shapes the exclusion lists had: a kernel ruled out feature by feature at the call (Hugging Face's
# rotary path: by the scheme's soft cap)
EXCLUSIONS = (r"plan\.shaped", r"half_via_general\)", r"plan\.softcap is None", r"plan\.sink is None",
              r"sink is None and cap is None", r"shape is None and sink is None", r"not mod\._conv_history",
              r"\"softcap\", None\) is not None or", r"def one_fresh_sequence", r"def banded\(",
              r"cope_max_pos is not None\s*\n?\s*or", r"not explicit_scores\(scheme\)\)",
              r"\"(softcap|sink|window|chunk|temperature)\", None\) is None",
              r"sch\.(softcap|sink|window|chunk|temperature|contextual|biases) is None")


def test_no_executor_decides_a_kernel_by_a_list_of_features():
    """The executors ask kernel_support (a declaration and a call check per kernel); none rules a kernel
    out feature by feature."""
    for name in EXECUTORS:
        text = (ROOT / "pedsl" / name).read_text(encoding="utf-8")
        found = [p for p in EXCLUSIONS if re.search(p, text)]
        assert not found, (name, found)
