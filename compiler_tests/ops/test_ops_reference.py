"""The naive oracle (pedsl.ops.reference) checked against hand-written special cases."""

import math

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import rnd
from pedsl.ops.reference import (
    accumulated_transport,
    reference_attention,
    rotation_transport,
    so2_step_matrices,
)

F64 = torch.float64


def R(t):
    """2x2 rotation [[cos, -sin], [sin, cos]] written out by hand."""
    c, s = math.cos(t), math.sin(t)
    return torch.tensor([[c, -s], [s, c]], dtype=F64)


@pytest.mark.parametrize("L", [1, 5, 17])
def test_identity_transport_is_causal_softmax_attention(L):
    q, k, v = rnd(2, 3, L, 8, seed=1), rnd(2, 3, L, 8, seed=2), rnd(2, 3, L, 8, seed=3)
    ref = reference_attention(q, k, v)
    torch.testing.assert_close(ref, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bias_and_tau_enter_the_logits():
    L, D = 5, 4
    q, k, v = rnd(1, 2, L, D, seed=1), rnd(1, 2, L, D, seed=2), rnd(1, 2, L, D, seed=3)
    bias, tau = rnd(1, 2, L, L, seed=4), rnd(1, 2, L, seed=5).abs()
    s = tau[..., None] * (q @ k.transpose(-1, -2)) / math.sqrt(D) + bias
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(reference_attention(q, k, v, bias=bias, tau=tau), torch.softmax(s, -1) @ v)


def test_rotation_transport_sign_matches_rope():
    # one pair (D = 2): <q_i, T(j->i) k_j> == <R(phi_i) q_i, R(phi_j) k_j>
    L = 4
    phases = rnd(L, 1, seed=7) * 3
    T = rotation_transport(phases, "halves")  # (1, 1, L, L, 2, 2)
    q, k = rnd(L, 2, seed=8), rnd(L, 2, seed=9)
    for i in range(L):
        for j in range(i + 1):
            lhs = q[i] @ (T[0, 0, i, j] @ k[j])
            rhs = (R(phases[i, 0].item()) @ q[i]) @ (R(phases[j, 0].item()) @ k[j])
            torch.testing.assert_close(lhs, rhs)


@pytest.mark.parametrize("layout,channels,pairs", [
    ("halves", None, [(0, 2), (1, 3)]),
    ("interleaved", None, [(0, 1), (2, 3)]),
    ("halves", [0, 1, 4, 5], [(0, 4), (1, 5)]),
    ("interleaved", slice(0, 4), [(0, 1), (2, 3)]),
])
def test_rotation_transport_pairing(layout, channels, pairs):
    D = 4 if channels is None else 8
    ph = torch.tensor([[0.0, 0.0], [0.3, 1.1]], dtype=F64)
    T = rotation_transport(ph, layout, channels, D)[0, 0, 1, 0]  # T(0->1): angle ph[0]-ph[1]
    want = torch.eye(D, dtype=F64)
    for p, (a, b) in enumerate(pairs):
        want[[a, a, b, b], [a, b, a, b]] = R(-ph[1, p].item()).flatten()
    torch.testing.assert_close(T, want)


def test_accumulated_transport_is_ordered_product():
    # non-commuting steps: P(j->i) = M_i ... M_{j+1}
    M = rnd(1, 1, 4, 3, 3, seed=11)
    P = accumulated_transport(M)
    torch.testing.assert_close(P[0, 0, 3, 0], M[0, 0, 3] @ M[0, 0, 2] @ M[0, 0, 1])
    torch.testing.assert_close(P[0, 0, 2, 2], torch.eye(3, dtype=F64))
    torch.testing.assert_close(P[0, 0, 0, 3], torch.zeros(3, 3, dtype=F64))


def test_so2_steps_accumulate_to_rotation_by_angle_difference():
    a = rnd(1, 1, 5, 2, seed=12)
    P = accumulated_transport(so2_step_matrices(a, "halves"))
    A = torch.cumsum(a, dim=-2)
    T = rotation_transport(A[0, 0], "halves")
    for i in range(5):
        for j in range(i + 1):
            torch.testing.assert_close(P[0, 0, i, j], T[0, 0, i, j])
    # a single step rotates by -a
    torch.testing.assert_close(so2_step_matrices(a, "halves")[0, 0, 0][[0, 2]][:, [0, 2]], R(-a[0, 0, 0, 0].item()))


def test_callable_transport_and_value_transport():
    L, D = 4, 2
    q, k, v = rnd(1, 1, L, D, seed=1), rnd(1, 1, L, D, seed=2), rnd(1, 1, L, D, seed=3)
    fn = lambda b, h, i, j: R(0.5 * (j - i))  # noqa: E731
    T = rotation_transport(0.5 * torch.arange(L, dtype=F64)[:, None], "halves")
    torch.testing.assert_close(reference_attention(q, k, v, transport=fn, value_transport=fn),
                               reference_attention(q, k, v, transport=T, value_transport=T))
