"""Accumulated SO(2) transports (docs/semantics.md §2b, 5.1, 5.2).

Each token ``t`` carries a step ``M_t`` that rotates pair ``k`` by ``-a(t, k)``;
the transport from key ``j`` to query ``i`` is ``P(j->i) = M_i ... M_(j+1)``.
SO(2) blocks commute, so ``P(j->i)`` rotates pair ``k`` by ``A(j,k) - A(i,k)``
with ``A(t, k) = sum_{s<=t} a(s, k)``, and (docs/semantics.md §5.1)::

    <q_i, P(j->i) k_j> = <R(A_i) q_i, R(A_j) k_j>

so q and k are pre-rotated once (O(L D)) and any fused causal kernel does the
rest. Constant steps ``a(t, k) = w_k`` give ``A(t) = w_k (t + 1)``: RoPE up to a
constant phase that cancels in the score.

Value rotation (``U = P``, docs/semantics.md §5.2): ``U(j->i) = R(-A_i) R(A_j)``, hence
``o_i = R(A_i)^T sum_j a_ij R(A_j) v_j``: rotate v by ``A_j`` before the kernel
and the output back by ``-A_i`` after it (checked against the naive definition
in compiler_tests/ops/test_ops_accumulate.py).

Numerics (docs/semantics.md §6): ``A`` is a float64 cumulative sum, reduced mod 2 pi,
and only the cos/sin tables are cast to the compute dtype. Gradients flow to
``step_angles`` (learned or data-dependent steps) and to q, k, v.

Shapes: q, k, v ``(B, H, L, D)``; step_angles ``(B|1, H|1, L, P)`` with ``P`` the
number of pairs of the rotated channel group (``D/2`` by default).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pedsl.ops.bias import separable_bias_attention
from pedsl.ops.rotary import Channels, rotate_many_by_angles

TWO_PI = 2.0 * math.pi


def cumulative_angles(step_angles: Tensor, *, reduce: bool = True, block: int = 256, plain_upto: int = 4096) -> Tensor:
    """``A(t) = sum_{s<=t} a(s)`` along the position axis (-2), float64 ``(..., L, P)``.

    Two-level float64 sum: running sums inside blocks of ``block`` positions plus a
    carry of the block totals taken mod 2 pi, so no partial sum grows with ``L``
    (a plain float64 cumsum of RoPE-like steps reaches |A| ~ L and accumulates
    ~5e-8 rad of error at L = 65,536; this keeps it below 1e-9 rad). Up to
    ``plain_upto`` positions a plain float64 cumsum is used (error < 2e-10 rad
    for RoPE-like steps at L = 4096). With ``reduce`` the result is taken mod 2 pi.
    Differentiable.
    """
    a = step_angles.to(torch.float64)
    L = a.shape[-2]
    if L <= max(block, plain_upto):
        out = torch.cumsum(a, dim=-2)
    else:
        nb = -(-L // block)
        pad = nb * block - L
        if pad:
            a = torch.cat([a, a.new_zeros(a.shape[:-2] + (pad, a.shape[-1]))], dim=-2)
        local = torch.cumsum(a.unflatten(-2, (nb, block)), dim=-2)  # (..., nb, block, P)
        totals = torch.remainder(local[..., -1, :], TWO_PI)  # (..., nb, P)
        carry = torch.cumsum(totals, dim=-2) - totals  # exclusive sum of earlier blocks
        out = (local + torch.remainder(carry, TWO_PI).unsqueeze(-2)).flatten(-3, -2)[..., :L, :]
    return torch.remainder(out, TWO_PI) if reduce else out


def so2_accumulated_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    step_angles: Tensor,
    *,
    value_rotation: bool = False,
    layout: str = "halves",
    channels: Channels = None,
    scale: float | None = None,
    key_bias: Tensor | None = None,
    q_scale: Tensor | None = None,
) -> Tensor:
    """Causal attention with the accumulated SO(2) transport of ``step_angles``.

    ``key_bias (B|1, H, L)``: optional separable bias key term ``g(j)`` (ALiBi,
    forget gate; see :func:`pedsl.ops.bias.separable_bias_attention`).
    ``q_scale (B|1, H|1, L)``: per-query temperature. Returns ``(B, H, L, D)``.
    """
    # float64 sum reduced mod 2 pi, then cast: |A| < 2 pi keeps ~1e-7 rad in float32
    A = cumulative_angles(step_angles).to(q.dtype)  # (B|1, H|1, L, P)
    if value_rotation:
        qr, kr, vr = rotate_many_by_angles([q, k, v], A, layout, channels)
    else:
        (qr, kr), vr = rotate_many_by_angles([q, k], A, layout, channels), v
    o = separable_bias_attention(qr, kr, vr, key_bias, scale=scale, q_scale=q_scale)
    if value_rotation:
        o = rotate_many_by_angles([o], -A, layout, channels)[0]  # R(A_i)^T = R(-A_i)
    return o
