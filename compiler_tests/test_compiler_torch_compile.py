"""A few tests that really run torch.compile (slow the first time; the inductor cache helps after)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import inputs
from conftest import SCHEMES
from pedsl.compiler import compile_scheme

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("name", ["rope_id", "alibi"])
def test_compiled_module_matches_eager(name):
    eager = compile_scheme(SCHEMES / f"{name}.pe")
    comp = compile_scheme(SCHEMES / f"{name}.pe", compile=True)
    for L in (64, 96):  # a second length: dynamic shapes, no recompile per length
        q, k, v, _, _ = inputs(eager, B=1, L=L, dtype=torch.float32, grad=False)
        torch.testing.assert_close(comp(q, k, v), eager(q, k, v), rtol=1e-4, atol=1e-5)


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
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert counters["aot_autograd"]["total"] == 1 and "autograd_cache_bypass" not in counters["aot_autograd"]


def test_flex_backend_forward_matches_masked():
    text = 'scheme t { bias = -log(1 + distance) * slopes(heads) }'
    flex = compile_scheme(text, backend="flex", requires_grad=False)
    masked = compile_scheme(text, backend="masked")
    q, k, v, _, _ = inputs(masked, B=1, L=128, dtype=torch.float32, grad=False)
    torch.testing.assert_close(flex(q, k, v), masked(q, k, v), rtol=1e-4, atol=1e-5)
