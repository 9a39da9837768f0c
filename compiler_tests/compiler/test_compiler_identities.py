"""The identities the passes rely on (docs/semantics.md §5), checked numerically and on the graph."""

from __future__ import annotations

import math

import torch

from compiler_helpers import D_MODEL, inputs
from compiler_helpers import SCHEMES
from pedsl.compiler import compile_graph, compile_scheme
from pedsl.compiler.plan import KEY_CHANNEL, LINEAR_BIAS, POSITION_TABLE, ROPE
from pedsl.lang.api import load
from pedsl.ops import reference as ref
from pedsl.ops.path import path_attention


def test_accumulated_constant_rotation_is_rope():
    acc = compile_scheme(SCHEMES / "rope_accumulated.pe", num_heads=2).double()
    rope = compile_scheme(SCHEMES / "rope.pe", num_heads=2).double()
    (step,) = acc.plan.transports
    assert step.kind == ROPE and step.static_table and "RoPE" in step.why  # the pass rewrote the steps
    q, k, v, _, _ = inputs(rope, L=23)
    torch.testing.assert_close(acc(q, k, v), rope(q, k, v), rtol=1e-12, atol=1e-12)
    # and the rewritten graph still equals the un-rewritten meaning (the reference builds ordered products)
    slow = compile_scheme(SCHEMES / "rope_accumulated.pe", num_heads=2, backend="reference").double()
    torch.testing.assert_close(acc(q[:, :, :9], k[:, :, :9], v[:, :, :9]), slow(q[:, :, :9], k[:, :, :9], v[:, :, :9]))


def test_constant_gate_is_alibi():
    text = 'scheme g { bias = accumulate(-slopes(heads)) }'
    gate = compile_scheme(text, num_heads=4).double()
    alibi = compile_scheme(SCHEMES / "alibi.pe", num_heads=4).double()
    (b,) = gate.plan.biases
    assert b.kind == LINEAR_BIAS and b.carried == KEY_CHANNEL and b.slope is not None
    q, k, v, _, _ = inputs(alibi, L=17)
    torch.testing.assert_close(gate(q, k, v), alibi(q, k, v), rtol=1e-12, atol=1e-12)


def _absolute_householder(q, k, v, w, beta):
    """Orthogonal steps factor: <q_i, P(j->i) k_j> = <A_i^T q_i, A_j^T k_j> with A_t = M_t ... M_1."""
    B, H, L, D = q.shape
    eye = torch.eye(D, dtype=q.dtype)
    A = eye.expand(B, H, D, D)
    qs, ks = [], []
    for t in range(L):
        M = eye - beta[:, :, t, None, None] * w[:, :, t, :, None] * w[:, :, t, None, :]
        A = M @ A
        qs.append((A.transpose(-1, -2) @ q[:, :, t, :, None])[..., 0])
        ks.append((A.transpose(-1, -2) @ k[:, :, t, :, None])[..., 0])
    qa, ka = torch.stack(qs, 2), torch.stack(ks, 2)
    return torch.nn.functional.scaled_dot_product_attention(qa, ka, v, is_causal=True)


def test_orthogonal_householder_factors_into_absolute_transforms():
    g = torch.Generator().manual_seed(3)
    B, H, L, D = 2, 2, 21, 8
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, H, L, D, generator=g, dtype=torch.float64), dim=-1)
    beta = torch.full((B, H, L), 2.0, dtype=torch.float64)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, block_size=4), _absolute_householder(q, k, v, w, beta))
    # and the checker knows beta = 2 is orthogonal
    text = ('scheme r { qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2)) }')
    assert load(text).transports[0].orthogonal


def test_value_rotation_equals_its_definition():
    """o_i = sum_j a_ij P(j->i) v_j with explicit products, against the fast qkv path."""
    mod = compile_scheme(SCHEMES / "acc_random_qkv.pe", num_heads=2).double()
    q, k, v, _, tok = inputs(mod, L=9, grad=False)
    angles = mod.step_angles(mod.transforms[0], 9, None, tok, q.device, torch.float64)
    steps = ref.so2_step_matrices(angles.to(torch.float64), "halves", list(mod.transforms[0].channels), 32)
    P = ref.accumulated_transport(steps.expand(2, 2, 9, 32, 32))
    expected = ref.reference_attention(q, k, v, transport=P, value_transport=P)
    torch.testing.assert_close(mod(q, k, v, tokens=tok), expected, rtol=1e-10, atol=1e-10)


def test_temperature_is_a_scale_of_q():
    mod = compile_scheme(SCHEMES / "rope_id.pe", num_heads=2).double()
    assert mod.plan.temperature.carried == "q scale" and mod.plan.temperature.table == POSITION_TABLE
    L = 300  # past train_length 128: tau > 1 for late queries
    tau = mod.query_scale(L, None)[0, 0]
    i = torch.arange(L, dtype=torch.float64)
    torch.testing.assert_close(tau, torch.clamp(torch.log(i + 1) / math.log(128), min=1.0))


def test_passes_choose_backends_and_explain_themselves():
    cases = {"rope": "sdpa", "alibi": "sdpa", "fox": "sdpa", "acc_learned_qkv": "sdpa", "path": "blockwise",
             "path_fox": "blockwise"}
    for name, backend in cases.items():
        plan = compile_graph(load(SCHEMES / f"{name}.pe")).graph["plan"]
        assert plan.backend == backend, name
        for step in (*plan.transports, *plan.biases):
            assert step.why, (name, step)
    g = compile_graph(load('scheme t { bias = -log(1 + distance) }'), requires_grad=True)
    assert g.graph["backend"] == "sdpa"  # a non-separable bias, CPU training: SDPA per block of queries
    g = compile_graph(load('scheme t { bias = -log(1 + distance) }'), requires_grad=False)
    assert g.graph["backend"] == "flex"


def test_nonlinear_distance_bias_matches_reference():
    text = 'scheme t { bias = -0.5 * log(1 + distance) * slopes(heads) }'
    fast = compile_scheme(text, num_heads=3).double()
    slow = compile_scheme(text, num_heads=3, backend="reference").double()
    q, k, v, _, _ = inputs(fast, L=10)
    torch.testing.assert_close(fast(q, k, v), slow(q, k, v))


def test_long_context_phases_stay_accurate():
    """At L = 65,536 the float64 phase tables are exact to 1e-9 rad; float32 phases are off by ~1e-2."""
    mod = compile_scheme(SCHEMES / "rope.pe")
    L = 65536
    cos, sin = mod.rope_tables(mod.transforms[0], L, torch.device("cpu"), torch.float64)
    w = torch.tensor(load(SCHEMES / "rope.pe").params["base"], dtype=torch.float64) ** (
        -2 * torch.arange(16, dtype=torch.float64) / 32)
    t = torch.arange(L, dtype=torch.float64)
    exact = torch.remainder(t[:, None] * w[None, :], 2 * math.pi)
    got = torch.atan2(sin, cos).remainder(2 * math.pi)
    err = ((got - exact + math.pi) % (2 * math.pi) - math.pi).abs().max().item()
    assert err < 1e-9
    naive32 = (t.float()[:, None] * w.float()[None, :]).double().remainder(2 * math.pi)
    err32 = ((naive32 - exact + math.pi) % (2 * math.pi) - math.pi).abs().max().item()
    assert err32 > 1e-3  # the reason the tables are computed in float64


def test_long_products_of_reflections_stay_orthogonal():
    """65,536 reflections chained through UT/WY block products of 64 steps.

    Bounds: ||P^T P - I||_max < 1e-3 in float32 (rounding accumulates like a random walk over
    1,024 block products: ~2e-4 measured) and < 1e-10 in float64.
    """
    from pedsl.ops.path import ut_block_product

    g = torch.Generator().manual_seed(0)
    D, C, L = 8, 64, 65536
    w64 = torch.nn.functional.normalize(torch.randn(L // C, C, D, generator=g, dtype=torch.float64), dim=-1)
    for dtype, bound in ((torch.float32, 1e-3), (torch.float64, 1e-10)):
        w = w64.to(dtype)
        blocks = ut_block_product(w, torch.full((L // C, C), 2.0, dtype=dtype))  # (L / C, D, D)
        P = torch.eye(D, dtype=dtype)
        for b in blocks:
            P = b @ P
        err = (P.T @ P - torch.eye(D, dtype=dtype)).abs().max().item()
        assert err < bound, (dtype, err)


def test_learned_schemes_own_their_parameters():
    mod = compile_scheme(SCHEMES / "path_fox.pe", d_model=D_MODEL)
    names = [n for n, _ in mod.named_parameters()]
    assert any("linear" in n for n in names) and any("shortconv" in n for n in names)
    assert "path_fox" in repr(mod) and "blockwise" in repr(mod)
    # tables are not persistent: the state dict holds only learned tensors
    rope = compile_scheme(SCHEMES / "rope.pe")
    assert rope.state_dict() == {} or all("learned" in k for k in rope.state_dict())
