"""Fuzzing the limits: values, not syntax (test_lang_fuzz.py mutates the syntax).

Library schemes with their numbers replaced by hostile ones (0, negatives, 1e300, 2e9, 10**23)
and hostile statements inserted go through `check`, and when the checker accepts them, through
the compiler and one forward pass; random ``train.yaml`` /
``eval.yaml`` values go through config loading and validation; random bytes and values in a
checkpoint's ``state.json`` go through the loaders of ``eval`` and ``--resume``. Each case ends
in a diagnostic (PedslError) or success - never another exception, a hang or a process over the
memory cap (the CLI cases run in a subprocess with RLIMIT_AS and a timeout).

PEDSL_FUZZ_EXAMPLES raises the example counts for a longer hunt; PEDSL_FUZZ_RANDOM=1 draws new
examples each run (CI draws the same ones).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler_helpers import run_capped
from lang_helpers import TEXTS
from pedsl.errors import PedslError

N = int(os.environ.get("PEDSL_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=os.environ.get("PEDSL_FUZZ_RANDOM") is None)

# ------------------------------------------------------------------ scheme values

NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
HOSTILE = ["0", "-1", "1", "2", "-5", "0.5", "1e300", "1e-300", "1e308", "2000000000", "100000000000000000000000",
           "4096", "1025", "1024", "3", "65", "0.0", "7"]
STATEMENTS = [
    "bias = -slopes({n}) * distance", "temperature = log_length({n})", "temperature = {n}",
    "temperature = sqrt({n} - 2)", "param head_dim: int = {n}", "param heads: int = {n}",
    "qk: rotate(ntk({n}, {n}) * position)", "qk: rotate(dynamic_ntk(10000, {n}, original = {n}) * position)",
    "qk: rotate(yarn(10000, {n}, original = {n}) * position)", "qk: rotate(span({n}, cycles = {n}) * position)",
    "qk: rotate(logspace({n}, {n}) * position)", "qk: accumulate(rotation(linear(x, rank = {n})))",
    "qk: accumulate(rotation(frozen_random(token, seed = {n})))", "eval {{ lengths = [{n}, {n}] }}",
    "eval {{ windows = {n} }}", "train {{ n_layers = {n} }}", "train {{ context = {n} }}", "train {{ seed = {n} }}",
    "train {{ batch_size = {n} }}", "let z = {n} * {n} * {n}", "bias = accumulate(log_sigmoid({n} + 0 * position))",
    "channels {{ a = range(0, {n}); b = rest }}",
]


@st.composite
def value_mutant(draw) -> str:
    text = TEXTS[draw(st.sampled_from(sorted(TEXTS)))]
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            spots = list(NUMBER.finditer(text))
            if spots:
                m = spots[draw(st.integers(0, len(spots) - 1))]
                text = text[: m.start()] + draw(st.sampled_from(HOSTILE)) + text[m.end():]
                continue
        stmt = draw(st.sampled_from(STATEMENTS)).format(n=draw(st.sampled_from(HOSTILE)))
        end = text.rstrip().rfind("}")
        if end > 0:
            text = text[:end] + "  " + stmt + "\n" + text[end:]
    return text


def check_then_run(text: str) -> None:
    """check; if it accepts the scheme, compile it and run it: a diagnostic or success."""
    from pedsl.compiler import compile_scheme
    from pedsl.lang.api import check, load

    try:
        errors = [d for d in check(text) if d.severity == "error"]
    except PedslError:
        return
    if errors:
        return
    try:
        sch = load(text)
    except PedslError as err:  # pragma: no cover - check passed: load must pass too
        raise AssertionError(f"check passed but load failed: {err.render()}") from None
    if sch.heads * sch.head_dim > 4096:
        return  # within the caps but too big for a quick forward pass in a test
    try:  # a late diagnostic (a CompileError) is a diagnostic; anything else fails the test
        mod = compile_scheme(sch, d_model=16)
        B, L = 1, 5
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, sch.heads, L, sch.head_dim, generator=g) for _ in range(3))
        x = torch.randn(B, L, 16, generator=g) if mod.needs_x else None
        tokens = torch.randint(0, 256, (B, L), generator=g) if mod.needs_tokens else None
        with torch.no_grad():
            mod(q, k, v, x=x, tokens=tokens)
    except PedslError as err:
        assert err.render()


@SETTINGS
@given(value_mutant())
def test_hostile_values_end_in_a_diagnostic_or_a_finite_module(text):
    check_then_run(text)


HOSTILE_FILES = {
    "head_dim": "scheme hd { param head_dim: int = 2000000000 }\n",
    "slopes": "scheme s { bias = -slopes(1000000000) * distance }\n",
    "chain": "scheme s { let a = 1e300\n let b = a * a\n qk: rotate(geometric(10000) * position * b) }\n",
    "eval": "scheme s { qk: rotate(geometric(10000) * position)\n eval { lengths = [1048576]\n windows = 65536 } }\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_hostile_files_through_the_real_cli(tmp_path, name):
    f = tmp_path / f"{name}.pe"
    f.write_text(HOSTILE_FILES[name])
    code, out = run_capped(["-m", "pedsl", "check", str(f)], timeout=60, mem_gb=1.5)
    assert code == 1 and "error[E" in out and "Traceback" not in out, out


def test_hostile_compile_through_the_real_cli(tmp_path):
    f = tmp_path / "s.pe"
    f.write_text("scheme s { bias = -slopes(heads) * distance }\n")
    code, out = run_capped(["-m", "pedsl", "compile", str(f), "-o", str(tmp_path / "o"), "-P", "heads=2000000000"],
                           timeout=60, mem_gb=2.0)
    assert code == 1 and "E303" in out and "Traceback" not in out, out
    code, out = run_capped(["-m", "pedsl", "compile", str(f), "-o", str(tmp_path / "o"), "--heads", "0"],
                           timeout=60, mem_gb=2.0)
    assert code == 2 and "--heads" in out, out


# ------------------------------------------------------------------ train.yaml / eval.yaml values

def _keys() -> list[str]:
    from pedsl.config import EvalConfig, train_block_keys

    return sorted(train_block_keys()) + sorted(EvalConfig.model_fields)


SCALARS = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 2, 10**9, 10**23, -(10**23), 2**63, 4096, 65537]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), st.text(max_size=12),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)


@SETTINGS
@given(st.dictionaries(st.sampled_from(_keys()), VALUES, max_size=5), st.sampled_from(["train", "eval"]))
def test_random_config_values(tmp_path_factory, values, which):
    from pedsl.config import EvalConfig, TrainConfig, resolve_eval_config, resolve_train_config

    path = tmp_path_factory.mktemp("cfg") / f"{which}.yaml"
    try:
        path.write_text(yaml.safe_dump(values))
    except (yaml.YAMLError, UnicodeEncodeError):
        return
    cls = TrainConfig if which == "train" else EvalConfig
    for attempt in (lambda: cls.from_yaml(path),
                    lambda: resolve_train_config(block=values) if which == "train" else resolve_eval_config(block=values)):
        try:
            cfg = attempt()
        except PedslError as err:
            assert err.render()
            continue
        if which == "train":  # what was accepted is within the caps
            from pedsl import limits

            assert cfg.model.n_layers <= limits.MAX_LAYERS and cfg.context <= limits.MAX_LENGTH
            assert 0 <= cfg.seed <= limits.MAX_SEED and cfg.threads <= limits.MAX_THREADS


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_as_train_yaml(tmp_path_factory, data):
    from pedsl.config import TrainConfig

    path = tmp_path_factory.mktemp("cfg") / "train.yaml"
    path.write_bytes(data)
    try:
        TrainConfig.from_yaml(path)
    except PedslError as err:
        assert err.render()


def test_yaml_aliases_do_not_explode(tmp_path):

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    path = tmp_path / "train.yaml"
    path.write_text("params:\n" + "\n".join("  " + ln for ln in lines) + "\n")
    code, out = run_capped(["-c", "from pedsl.config import TrainConfig; import sys;"
                            f"TrainConfig.from_yaml({str(path)!r})"], timeout=60, mem_gb=1.5)
    assert code == 0 or "ConfigError" in out, out[-2000:]
# ------------------------------------------------------------------ state.json

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from compiler_helpers import run_cli

    out = tmp_path_factory.mktemp("fuzz") / "run"
    code, _, err = run_cli("train", "schemes/rope.pe", "--out", out, "--steps", "2", "--threads", "1",
                           "--context", "16", "--batch-size", "2", "--set", "n_layers=1", "--set", "d_model=16",
                           "--set", "n_heads=2", "--set", "head_dim=8", "--set", "data.max_bytes=20000",
                           "--set", "eval_batches=1", "-q")
    assert code == 0, err
    return out


def _state_path(run):
    return next((run / "checkpoints").iterdir()) / "state.json"


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_subnormal=False), st.text(max_size=10),
              st.sampled_from([-5, 0, 2**63, 10**23, -(10**30), 1e300])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)


@st.composite
def state_mutant(draw, original: dict) -> bytes:
    kind = draw(st.sampled_from(["bytes", "value", "drop", "truncate"]))
    text = json.dumps(original)
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "truncate":
        return text.encode()[: draw(st.integers(0, len(text)))]
    state = json.loads(text)
    keys = sorted(state)
    key = draw(st.sampled_from(keys))
    if kind == "drop":
        del state[key]
    else:
        if isinstance(state[key], dict) and state[key] and draw(st.booleans()):
            sub = draw(st.sampled_from(sorted(state[key])))
            state[key][sub] = draw(JSON_VALUES)
        else:
            state[key] = draw(JSON_VALUES)
    return json.dumps(state).encode()


def _load_mutant(run, data: bytes) -> None:
    from pedsl.train import checkpoint as ck
    from pedsl.train import load_run

    state = _state_path(run)
    state.write_bytes(data)
    for load in (lambda: ck.read_checkpoint(state.parent), lambda: load_run(run)):
        try:
            load()
        except PedslError as err:
            assert err.render()


def test_state_json_mutations(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    original = json.loads(_state_path(run).read_text())

    @settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture],
              derandomize=os.environ.get("PEDSL_FUZZ_RANDOM") is None)
    @given(state_mutant(original))
    def inner(data):
        _load_mutant(run, data)

    inner()


@pytest.mark.parametrize("value", [-5, 10**23, "2", 2.5, None, math.inf])
def test_state_json_step_through_resume(tiny_run, tmp_path, value):
    """`train --resume` on a hand-edited step: a diagnostic (or a run that resumes correctly), never exit 3."""
    from compiler_helpers import run_cli

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    state = json.loads(_state_path(run).read_text())
    state["step"] = value
    _state_path(run).write_text(json.dumps(state))
    code, out, err = run_cli("train", run / "config.yaml", "--out", run, "--resume", "--threads", "1", "-q")
    assert code in (0, 1), out + err
