"""A few tests that really run torch.compile (slow the first time; the inductor cache helps after)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import float32_bound
from compiler_helpers import inputs
from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("name", ["rope_id", "alibi"])
def test_compiled_module_matches_eager(name):
    eager = compile_scheme(SCHEMES / f"{name}.pe")
    comp = compile_scheme(SCHEMES / f"{name}.pe", compile=True)
    for L in (64, 96):  # a second length: dynamic shapes, no recompile per length
        q, k, v, _, _ = inputs(eager, B=1, L=L, dtype=torch.float32, grad=False)
        want = eager(q, k, v)
        # two float32 runs of one chain (a rotation's 2 terms or a bias, the score's D channels, the softmax's
        # and weighted sum's L keys), each within float32_bound of the float64 value
        bound = 2 * float32_bound(2 * L + eager.head_dim + 2, want)
        torch.testing.assert_close(comp(q, k, v), want, rtol=0, atol=bound)


def test_learned_steps_compile_in_one_pass_forward_and_backward():
    """acc_learned_qk under torch.compile: equal to eager (output and gradients, two lengths), one
    graph, no graph break, and dynamo's analysis runs once (folded constants and specialised floats:
    a restart doubled the compile time) and yields a graph AOT autograd can cache."""
    from torch._dynamo.utils import counters

    from compiler_helpers import D_MODEL, forward_and_grads

    eager = compile_scheme(SCHEMES / "acc_learned_qk.pe", d_model=D_MODEL)
    comp = compile_scheme(SCHEMES / "acc_learned_qk.pe", d_model=D_MODEL, compile=True)
    comp.load_state_dict(eager.state_dict())
    counters.clear()
    for L in (48, 80):
        q, k, v, x, tok = inputs(eager, B=1, L=L, dtype=torch.float32)
        want = forward_and_grads(eager, q, k, v, x, tok)
        got = forward_and_grads(comp, q, k, v, x, tok)
        # two float32 runs of the accumulated chain (test_compiler_differential's: L positions composed, each
        # a rotation over the head's channels plus a few builtins, then the score and the softmax), the
        # backward running it once more in reverse: each tensor within twice its float32_bound, twice over
        n = 2 * (L * (eager.head_dim + 32) + 2 * L + eager.head_dim)
        for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
            torch.testing.assert_close(a, b, rtol=0, atol=2 * float32_bound(n, b))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert counters["aot_autograd"]["total"] == 1 and "autograd_cache_bypass" not in counters["aot_autograd"]


def test_compiled_flex_lowering_matches_the_reference():
    """The flex lowering (pedsl.compiler.flex_lowering) through the compiled FlexAttention kernel on CPU, forward
    only (torch has no CPU backward for it), against the float64 reference interpreter within float32_bound:
    one scheme, one call, because a compile takes a minute or two on two cores. The scheme stacks a distance
    table, a window, a soft cap and a sink logit over packed documents, so the compiled score_mod, mask_mod,
    block mask and sink column all run; test_flex_lowering.py checks every library scheme eagerly."""
    from compiler_helpers import float32_bound

    text = ('scheme t { bias = -log(1 + distance) * slopes(heads)\nwindow = 40\nsoftcap = 3.0\nsink = logit\n'
            'temperature = log_length(16) }')
    flex = compile_scheme(text, backend="flex", requires_grad=False, num_heads=2, head_dim=16)
    ref = compile_scheme(text, backend="reference", num_heads=2, head_dim=16)
    with torch.no_grad():
        flex.sink_logit.copy_(torch.tensor([0.5, -1.0]))
    ref.load_state_dict(flex.state_dict())
    L = 128
    q, k, v, _, _ = inputs(flex, B=1, L=L, dtype=torch.float64, grad=False)
    docs = (torch.arange(L) >= 80).long()[None]
    with torch.no_grad():
        want = ref.double()(q, k, v, document_ids=docs)
        got = flex(q.float(), k.float(), v.float(), document_ids=docs)
    assert (got.double() - want).abs().max().item() <= float32_bound(2 * L + 16, want)


def test_general_path_under_inductor_equals_eager():
    """A compiled RoPE module (inductor): one full causal sequence (the fused path, compiled), then
    the general path - positions, a left-padded attn_mask, a cache prefill and decoding steps with and
    without positions and mask - equal to eager. The general path runs eagerly under torch.compile
    (docs/semantics.md §8.7): one graph for the fused call, nothing compiled per decoding step."""
    from torch._dynamo.utils import counters

    kw = dict(num_heads=2, head_dim=16)
    eager = compile_scheme(SCHEMES / "rope_id.pe", **kw)
    comp = compile_scheme(SCHEMES / "rope_id.pe", compile=True, **kw)
    g = torch.Generator().manual_seed(0)
    B, P = 2, 12
    q, k, v = (torch.randn(B, 2, P, 16, generator=g) for _ in range(3))
    mask = torch.ones(B, P, dtype=torch.bool)
    mask[0, :3] = False  # row 0 left-padded
    pos = (mask.long().cumsum(1) - 1).clamp(min=0) + torch.tensor([[0], [5]])  # row 1 starts at 5

    def run(m, extra=0):
        outs = [m(q, k, v)]  # fused
        c = m.new_cache(B)
        outs.append(m(q, k, v, positions=pos, attn_mask=mask, cache=c))
        for s in range(3 + extra):
            step = torch.ones(B, P + s + 1, dtype=torch.bool)
            step[0, :3] = False
            outs.append(m(*(t[:, :, s % P:s % P + 1] * 2 for t in (q, k, v)), positions=pos[:, -1:] + s + 1,
                          attn_mask=step, cache=c))
        for s in range(2 + extra):  # the decoding fast path (no positions, no mask)
            outs.append(m(*(t[:, :, s % P:s % P + 1] * 3 for t in (q, k, v)), cache=c))
        return outs

    def close(a, b):
        # two float32 runs of RoPE's chain (the rotation's 2 terms, 16 channels, the softmax's and weighted
        # sum's keys: at most 32, the prefill's 12 plus every decoding step) at the inputs' largest scale
        torch.testing.assert_close(a, b, rtol=0, atol=2 * float32_bound(2 * 32 + 16 + 2, b))

    counters.clear()
    with torch.no_grad():
        got, want = run(comp), run(eager)
        for a, b in zip(got, want):
            close(a, b)
        # one graph per kind of call (fused; prefill; decoding with and without mask): more calls and
        # longer caches compile nothing more
        graphs = counters["stats"]["unique_graphs"]
        assert graphs <= 4 and set(counters["graph_break"]) <= {k for k in counters["graph_break"] if "disable" in k}
        for a, b in zip(run(comp, extra=4), run(eager, extra=4)):
            close(a, b)
    assert counters["stats"]["unique_graphs"] == graphs
