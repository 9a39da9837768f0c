"""Accumulated SO(2) transports vs the naive ordered-product definition (docs/semantics.md §2b, 5.1, 5.2)."""

import math

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import rnd
from pedsl.ops.accumulate import cumulative_angles, so2_accumulated_attention
from pedsl.ops.reference import accumulated_transport, reference_attention, so2_step_matrices
from pedsl.ops.rotary import apply_rotary_channels, geometric_freqs, rotary_cos_sin, rotate_by_angles

F64 = torch.float64
GROUPS = [
    ("halves", None, 8),
    ("interleaved", None, 8),
    ("halves", slice(0, 8), 16),
    ("halves", list(range(0, 4)) + list(range(8, 12)), 16),
    ("interleaved", [15, 2, 7, 9], 16),
]


def n_pairs(channels, D):
    if channels is None:
        return D // 2
    return len(range(D)[channels] if isinstance(channels, slice) else channels) // 2


def circ_err(x, y):
    return (torch.remainder(x - y + math.pi, 2 * math.pi) - math.pi).abs().max().item()


# every group at L = 17; the edge lengths 1 and 5 on a halves and an interleaved group
CASES = [(17, *g) for g in GROUPS] + [(L, *g) for L in (1, 5) for g in (GROUPS[3], GROUPS[4])]


@pytest.mark.parametrize("value_rotation", [False, True])
@pytest.mark.parametrize("L,layout,channels,D", CASES)
def test_matches_ordered_product_definition(L, layout, channels, D, value_rotation):
    B, H = 2, 3
    q, k, v = (rnd(B, H, L, D, seed=s).requires_grad_() for s in (1, 2, 3))
    steps = rnd(B, 1, L, n_pairs(channels, D), seed=4).requires_grad_()  # broadcast over heads
    out = so2_accumulated_attention(q, k, v, steps, value_rotation=value_rotation, layout=layout, channels=channels)
    P = accumulated_transport(so2_step_matrices(steps.expand(B, H, -1, -1), layout, channels, D))
    ref = reference_attention(q, k, v, transport=P, value_transport=P if value_rotation else None)
    torch.testing.assert_close(out, ref)
    w = rnd(B, H, L, D, seed=9)
    g_fast = torch.autograd.grad((out * w).sum(), (q, k, v, steps), allow_unused=True, materialize_grads=True)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v, steps), allow_unused=True, materialize_grads=True)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b)


def test_key_bias_and_temperature_match_reference():
    B, H, L, D = 2, 3, 9, 8
    q, k, v = (rnd(B, H, L, D, seed=s).requires_grad_() for s in (1, 2, 3))
    steps = rnd(1, H, L, D // 2, seed=4)
    g = rnd(B, H, L, seed=5).requires_grad_()
    tau = rnd(1, H, L, seed=6).abs().requires_grad_()
    out = so2_accumulated_attention(q, k, v, steps, value_rotation=True, key_bias=g, q_scale=tau)
    P = accumulated_transport(so2_step_matrices(steps.expand(B, H, -1, -1), "halves"))
    bias = g[:, :, None, :].expand(B, H, L, L)  # b(i, j) = g(j)
    ref = reference_attention(q, k, v, transport=P, value_transport=P, bias=bias, tau=tau)
    torch.testing.assert_close(out, ref)
    w = rnd(B, H, L, D, seed=9)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, g, tau)), torch.autograd.grad((ref * w).sum(), (q, g, tau))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("layout,channels,D", GROUPS)
def test_constant_steps_are_rope(layout, channels, D):
    B, H, L = 2, 3, 17
    q, k, v = (rnd(B, H, L, D, seed=s) for s in (1, 2, 3))
    P = n_pairs(channels, D)
    w = geometric_freqs(P, base=50.0)
    out = so2_accumulated_attention(q, k, v, w.expand(1, 1, L, P), layout=layout, channels=channels)
    cos, sin = rotary_cos_sin(w, torch.arange(L), F64)  # positions 0..L-1: the offset w_k cancels
    rope = F.scaled_dot_product_attention(apply_rotary_channels(q, cos, sin, channels, layout),
                                          apply_rotary_channels(k, cos, sin, channels, layout), v, is_causal=True)
    torch.testing.assert_close(out, rope)


def test_value_rotation_definition_by_hand():
    # o_i = sum_j a_ij U(j->i) v_j with U = P(j->i), written with explicit 2x2 blocks, one pair (D = 2)
    L = 6
    q, k, v = rnd(1, 1, L, 2, seed=1), rnd(1, 1, L, 2, seed=2), rnd(1, 1, L, 2, seed=3)
    a = rnd(1, 1, L, 1, seed=4)
    A = torch.cumsum(a[0, 0, :, 0], 0)
    out = so2_accumulated_attention(q, k, v, a, value_rotation=True)[0, 0]

    def R(t):
        return torch.stack([torch.stack([t.cos(), -t.sin()]), torch.stack([t.sin(), t.cos()])])

    for i in range(L):
        s = torch.stack([q[0, 0, i] @ R(A[j] - A[i]) @ k[0, 0, j] for j in range(i + 1)]) / math.sqrt(2)
        p = torch.softmax(s, 0)
        o = sum(p[j] * (R(A[j] - A[i]) @ v[0, 0, j]) for j in range(i + 1))
        torch.testing.assert_close(out[i], o)


def test_cumulative_angles_long_context_precision():
    L, P = 65536, 32
    w = geometric_freqs(P)
    A = cumulative_angles(w.expand(L, P))
    exact = torch.remainder(torch.arange(1, L + 1, dtype=F64)[:, None] * w, 2 * math.pi)
    assert circ_err(A, exact) < 1e-9  # measured ~2e-10
    naive32 = torch.cumsum(w.float().expand(L, P), 0).double()  # what a float32 cumsum gives
    assert circ_err(naive32, exact) > 1e-3  # measured ~2.4e-3 rad: why we sum in float64
    # random zero-mean steps, odd length (exercises padding), against a float64 plain cumsum
    a = rnd(2, 70001, 4, seed=5) * 0.3
    assert circ_err(cumulative_angles(a), torch.cumsum(a, -2)) < 1e-9
    assert cumulative_angles(a, reduce=False).shape == a.shape
    # rotated vectors keep their norm (float32 output)
    x = rnd(1, 1, L, 2 * P, seed=6, dtype=torch.float32)
    y = rotate_by_angles(x, A[None, None], "halves")
    rel = ((y.double().norm(dim=-1) - x.double().norm(dim=-1)).abs() / x.double().norm(dim=-1)).max()
    assert rel < 1e-6


def test_cumulative_angles_gradient():
    a = rnd(1, 1, 300, 2, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: cumulative_angles(t, block=64, plain_upto=0).sin(), (a,))
