"""The lowering plan (pedsl.compiler.plan): what the passes record, what `pedsl graph` prints, that
the module and the sampler name their parameters after it, and that the reference backend does not
lean on the module's bias and temperature helpers (so the differential tests would see a bug there)."""

from __future__ import annotations

import json

import pytest
import torch

from compiler_helpers import D_MODEL, inputs, run_cli
from compiler_helpers import SCHEMES
from pedsl.compiler import compile_plan, compile_scheme
from pedsl.compiler import plan as P
from pedsl.compiler.module import SchemeAttention
from pedsl.lang.api import load


def _plan(name: str, **kw) -> P.Plan:
    return compile_plan(load(SCHEMES / f"{name}.pe"), **kw)


def test_the_plan_records_what_the_passes_decided():
    rope = _plan("rope")
    (t,) = rope.transports
    assert (t.kind, t.table, t.kernel, t.targets, rope.backend) == (P.ROPE, P.STATIC, "rotary", "qk", "sdpa")
    assert [s.name for s in rope.params] == ["phase[all]"] and not rope.biases and rope.temperature is None
    assert _plan("dynamic_ntk").transports[0].table == P.RUNTIME_LENGTH
    assert _plan("rope_accumulated").transports[0].kind == P.ROPE  # constant steps are RoPE
    acc = _plan("acc_learned_qkv").transports[0]
    assert (acc.kind, acc.table, acc.kernel, acc.targets) == (P.SO2, P.PER_TOKEN, "cumulative angles", "qkv")
    (b,) = _plan("alibi").biases
    assert (b.kind, b.carried, b.coordinate) == (P.LINEAR_BIAS, P.KEY_CHANNEL, True)
    assert _plan("alibi", backend="masked").biases[0].carried == P.MATERIALISED
    fox = _plan("fox")
    assert (fox.biases[0].kind, fox.biases[0].carried, fox.half_via_general) == (P.GATE_BIAS, P.KEY_CHANNEL, True)
    pf = _plan("path_fox")
    assert pf.backend == "blockwise" and not pf.half_via_general
    assert [(t.kind, t.kernel) for t in pf.transports] == [(P.HOUSEHOLDER, "blockwise")]
    assert pf.biases[0].carried == P.STEP_LOG_TERM
    assert [s.name for s in pf.params] == ["w[all]", "beta[all]", "bias[0]"]
    tau = _plan("rope_id").temperature
    assert (tau.table, tau.carried, tau.site.name) == (P.POSITION_TABLE, "q scale", "temperature")
    table = compile_plan(load("scheme t { bias = -log(1 + distance) }"))
    assert table.biases[0].kind == P.TABLE_BIAS and table.backend == "sdpa" and not table.biases[0].coordinate
    assert table.biases[0].carried == P.QUERY_BLOCKS  # the general path's blocks: no (H, L, L) tensor


@pytest.mark.parametrize("name", ["rope", "alibi", "path_fox"])
def test_pedsl_graph_prints_the_plan(name):
    code, out, err = run_cli("graph", SCHEMES / f"{name}.pe")
    assert code == 0, err
    plan = _plan(name)
    assert out.startswith(f"plan for {name}: backend {plan.backend} - {plan.backend_why}")
    assert "parameter sites: " + ", ".join(s.name for s in plan.params) in out
    for t in plan.transports:
        assert f"transport {t.group!r} ({len(t.channels)} channels, {t.targets}): {t.kind}, table {t.table}, " \
               f"kernel {t.kernel}" in out
    for b in plan.biases:
        counting = f" (counting {b.counts})" if b.kind == P.LINEAR_BIAS else ""
        assert f"bias {b.index}: {b.kind}{counting}, carried as {b.carried}" in out
    assert "dataflow graph of" in out
    code, out, err = run_cli("graph", SCHEMES / f"{name}.pe", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan"] == P.plan_to_json(plan) and doc["backend"] == plan.backend
    assert doc["plan"]["params"] == [s.name for s in plan.params]
    assert not any("note" in n or "kernel" in n for n in doc["nodes"])  # decisions live in the plan


@pytest.mark.parametrize("name", ["path_fox", "acc_learned_qkv", "fox"])
def test_learned_parameters_are_named_after_the_plan_sites(name):
    mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=16, d_model=D_MODEL)
    sites = {s.name for s in mod.plan.params}
    keys = list(mod.learned.sites.keys())
    assert keys and all(k.split("__")[0] in sites for k in keys)
    assert mod.plan is mod.graph.graph["plan"] and mod.backend == mod.plan.backend


def _max_gap(name, backend, **patch):
    kw = dict(num_heads=2, head_dim=16, d_model=D_MODEL)
    fast = compile_scheme(SCHEMES / f"{name}.pe", backend=backend, **kw).double()
    ref = compile_scheme(SCHEMES / f"{name}.pe", backend="reference", **kw).double()
    ref.load_state_dict(fast.state_dict())
    q, k, v, x, tok = inputs(fast, L=9, seed=2, grad=False)
    with torch.no_grad():
        return (fast(q, k, v, x=x, tokens=tok) - ref(q, k, v, x=x, tokens=tok)).abs().max().item()


@pytest.mark.parametrize("name", ["alibi", "fox"])
def test_a_wrong_bias_helper_is_caught_by_the_reference(name, monkeypatch):
    assert _max_gap(name, "masked") < 1e-10
    right = SchemeAttention.bias_table
    monkeypatch.setattr(SchemeAttention, "bias_table", lambda self, *a, **kw: 2 * right(self, *a, **kw))
    assert _max_gap(name, "masked") > 1e-3  # the reference computes its bias from the IR, not the helper


def test_a_wrong_temperature_helper_is_caught_by_the_reference(monkeypatch):
    assert _max_gap("rope_id", "sdpa") < 1e-10
    right = SchemeAttention.query_scale
    monkeypatch.setattr(SchemeAttention, "query_scale", lambda self, *a, **kw: 3 * right(self, *a, **kw))
    assert _max_gap("rope_id", "sdpa") > 1e-3


def test_the_reference_multiplies_out_what_the_passes_rewrote(monkeypatch):
    """The reference reads the scheme as written: a constant gate is summed and constant steps multiplied,
    so a wrong rewrite in the passes shows (here: the ALiBi slope of a constant gate doubled)."""
    from pedsl.compiler import passes
    from pedsl.lang import ast

    text = "scheme g { bias = accumulate(-slopes(heads)) }"
    kw = dict(num_heads=2, head_dim=16)

    def gap():
        fast = compile_scheme(text, backend="sdpa", **kw).double()
        ref = compile_scheme(text, backend="reference", **kw).double()
        q, k, v, _, _ = inputs(fast, L=9, seed=2, grad=False)
        return (fast(q, k, v) - ref(q, k, v)).abs().max().item()

    assert gap() < 1e-10
    right = passes.constant_gate_is_alibi

    def doubled(g, opt):
        g = right(g, opt)
        d = g.nodes["bias[0]"]
        two = ast.Binary(op="*", left=ast.Num(value=2.0), right=d["slope"])
        d.update(slope=two, expr=ast.Binary(op="*", left=two, right=ast.Name(id="distance")))
        return g

    monkeypatch.setattr(passes, "PASSES", tuple(doubled if p is right else p for p in passes.PASSES))
    assert gap() > 1e-3


def test_a_constant_gate_counts_tokens_not_positions(tmp_path):
    """accumulate(-m) sums a log gate per token (docs/semantics.md §8.1); on contiguous positions it is
    ALiBi (the fused kernels use the key channel), with gaps, padding or a cache it still counts tokens:
    the general path, the generated module and the reference (which reads the scheme as written) agree."""
    import importlib.util

    from pedsl.compiler.codegen import generate

    text = "scheme g { bias = accumulate(-slopes(heads)) }"
    (b,) = compile_plan(load(text)).biases
    assert (b.kind, b.counts, b.log_gate is not None) == (P.LINEAR_BIAS, P.TOKENS, True)
    assert compile_plan(load(SCHEMES / "alibi.pe")).biases[0].counts == P.POSITIONS
    kw = dict(num_heads=2, head_dim=8)
    fast = compile_scheme(text, **kw).double()
    ref = compile_scheme(text, backend="reference", **kw).double()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.tensor([[0, 1, 4, 5, 9, 10], [0, 2, 3, 7, 8, 9]])
    pad = torch.tensor([[True] * 6, [False, True, True, True, True, True]])
    want = ref(q, k, v, positions=pos, attn_mask=pad)
    torch.testing.assert_close(fast(q, k, v, positions=pos, attn_mask=pad), want, rtol=1e-10, atol=1e-12)
    cache = fast.new_cache(2)
    parts = [fast(q[:, :, :4], k[:, :, :4], v[:, :, :4], positions=pos[:, :4], attn_mask=pad[:, :4], cache=cache)]
    parts += [fast(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], positions=pos[:, t:t + 1], cache=cache)
              for t in (4, 5)]
    torch.testing.assert_close(torch.cat(parts, 2), want, rtol=1e-10, atol=1e-12)
    file = tmp_path / "gate_as_alibi.py"
    file.write_text(generate(fast.scheme, fast.plan))
    spec = importlib.util.spec_from_file_location("gen_gate_as_alibi", file)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    torch.testing.assert_close(gen.Module().double()(q, k, v, positions=pos, attn_mask=pad), want,
                               rtol=1e-10, atol=1e-12)


def test_dot_strings_are_escaped():
    import re

    from pedsl.cli.compiler import _dot_string

    assert _dot_string('a\\b "c"\nd') == 'a\\\\b \\"c\\"\\nd'
    quoted = re.compile(r'"((?:[^"\\]|\\.)*)"')
    for name in ("rope", "path_fox"):
        code, out, err = run_cli("graph", SCHEMES / f"{name}.pe", "--format", "dot")
        assert code == 0, err
        assert out.startswith(f'digraph "{name}" {{') and out.rstrip().endswith("}")
        for line in out.splitlines():  # no stray quote: every '"' opens or closes a well-formed string
            assert '"' not in quoted.sub("", line), line
