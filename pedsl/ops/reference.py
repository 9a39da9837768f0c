"""A deliberately naive float64 interpreter of SEMANTICS section 1 (the test oracle).

For one head, query ``i`` and key ``j <= i`` (causal)::

    s(i, j) = tau(i) * <q_i, T(j->i) k_j> * scale + b(i, j)      (scale = 1/sqrt(D) by default)
    a(i, j) = softmax_j s(i, j)
    o_i     = sum_j a(i, j) U(j->i) v_j

Everything is explicit loops over ``(i, j)`` (vectorised over batch and head
only), in float64, and shares no code with the fast kernels (``rotary.py``,
``accumulate.py``, ``bias.py``): the channel pairing and rotation sign are
re-derived here from SEMANTICS 2a/2b. It is autograd-friendly, so tests compare
gradients too. Use only at small sizes (L <= ~32).

Shapes: q, k, v ``(B, H, L, D)``; transports ``(B|1, H|1, L, L, D, D)`` indexed
``[b, h, i, j]`` = the matrix ``T(j->i)`` (entries with ``j > i`` are unused),
or a callable ``(b, h, i, j) -> (D, D)``; bias ``(B|1, H|1, L, L)``;
tau ``(B|1, H|1, L)``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

F64 = torch.float64


def _pairs(channels: Sequence[int] | slice | None, layout: str, dim: int) -> list[tuple[int, int]]:
    """(first, second) channel pairs of a group, re-derived independently of rotary.py."""
    if channels is None:
        chans = list(range(dim))
    elif isinstance(channels, slice):
        chans = list(range(dim))[channels]
    else:
        chans = [int(c) for c in channels]
    m = len(chans)
    assert m % 2 == 0, "a rotated group needs an even number of channels"
    if layout == "halves":
        return [(chans[p], chans[p + m // 2]) for p in range(m // 2)]
    if layout == "interleaved":
        return [(chans[2 * p], chans[2 * p + 1]) for p in range(m // 2)]
    raise ValueError(f"unknown layout {layout!r}")


def _rot_matrices(angles: Tensor, pairs, dim: int) -> Tensor:
    """``(..., P) -> (..., D, D)``: pair p rotated by ``R(angles[p]) = [[c, -s], [s, c]]``, identity elsewhere."""
    c, s = torch.cos(angles), torch.sin(angles)
    m = torch.eye(dim, dtype=F64).expand(*angles.shape[:-1], dim, dim).clone()
    for p, (a, b) in enumerate(pairs):  # written entry by entry, straight from the definition
        m[..., a, a] = c[..., p]
        m[..., a, b] = -s[..., p]
        m[..., b, a] = s[..., p]
        m[..., b, b] = c[..., p]
    return m


def _expand_bh(t: Tensor, lead: int) -> Tensor:
    """Give a per-position tensor explicit (B, H) leading dims: (L, ...) -> (1, 1, L, ...)."""
    while t.dim() < lead:
        t = t.unsqueeze(0)
    return t


def rotation_transport(phases: Tensor, layout: str, channels=None, dim: int | None = None) -> Tensor:
    """``T(j->i)`` of SEMANTICS 2a: pair k rotated by ``phases[j,k] - phases[i,k]``.

    ``phases``: ``(L, P)`` or ``(B, H, L, P)`` (already ``w_k * phi(t)``).
    Returns ``(B|1, H|1, L, L, D, D)``. Then ``<q_i, T k_j> = <R(phi_i) q_i, R(phi_j) k_j>``
    since ``R(a)^T R(b) = R(b - a)``.
    """
    ph = _expand_bh(phases.to(F64), 4)
    Bp, Hp, L, P = ph.shape
    dim = dim if dim is not None else 2 * P
    pairs = _pairs(channels, layout, dim)
    assert len(pairs) == P
    diff = ph[:, :, None, :, :] - ph[:, :, :, None, :]  # [b, h, i, j, k] = phases[j,k] - phases[i,k]
    return _rot_matrices(diff, pairs, dim)


def so2_step_matrices(step_angles: Tensor, layout: str, channels=None, dim: int | None = None) -> Tensor:
    """Step matrices ``M_t`` (SEMANTICS 2b): pair k rotated by ``-a(t, k)``. ``(B, H, L, P) -> (B, H, L, D, D)``."""
    a = _expand_bh(step_angles.to(F64), 4)
    Bp, Hp, L, P = a.shape
    dim = dim if dim is not None else 2 * P
    pairs = _pairs(channels, layout, dim)
    return _rot_matrices(-a, pairs, dim)


def accumulated_transport(step_mats: Tensor) -> Tensor:
    """``P(j->i) = M_i M_(i-1) ... M_(j+1)`` by explicit products (identity for j = i).

    ``step_mats (B, H, L, D, D) -> (B, H, L, L, D, D)`` (zeros where ``j > i``).
    """
    Bp, Hp, L, D, _ = step_mats.shape
    eye = torch.eye(D, dtype=step_mats.dtype).expand(Bp, Hp, D, D)
    zero = torch.zeros(Bp, Hp, D, D, dtype=step_mats.dtype)
    rows = []
    for i in range(L):
        row = []
        for j in range(L):
            if j > i:
                row.append(zero)
                continue
            p = eye
            for t in range(j + 1, i + 1):  # P = M_i ... M_{j+1}: left-multiply later steps
                p = step_mats[:, :, t] @ p
            row.append(p)
        rows.append(torch.stack(row, dim=2))
    return torch.stack(rows, dim=2)


def _transport_at(tr, b, h, i, j, dim):
    if tr is None:
        return None
    if callable(tr) and not isinstance(tr, Tensor):
        return tr(b, h, i, j).to(F64)
    return tr[min(b, tr.shape[0] - 1), min(h, tr.shape[1] - 1), i, j].to(F64)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, *, transport=None, value_transport=None,
                        bias: Tensor | None = None, tau: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Naive causal attention of SEMANTICS 1 in float64; returns ``(B, H, L, D)`` float64."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    B, H, L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out_b = []
    for b in range(B):
        out_h = []
        for h in range(H):
            out_i = []
            for i in range(L):
                scores, vals = [], []
                for j in range(i + 1):
                    T = _transport_at(transport, b, h, i, j, D)
                    kj = k[b, h, j] if T is None else T @ k[b, h, j]
                    s = torch.dot(q[b, h, i], kj) * scale
                    if tau is not None:
                        s = s * tau[min(b, tau.shape[0] - 1), min(h, tau.shape[1] - 1), i].to(F64)
                    if bias is not None:
                        s = s + bias[min(b, bias.shape[0] - 1), min(h, bias.shape[1] - 1), i, j].to(F64)
                    U = _transport_at(value_transport, b, h, i, j, D)
                    scores.append(s)
                    vals.append(v[b, h, j] if U is None else U @ v[b, h, j])
                a = torch.softmax(torch.stack(scores), dim=0)
                out_i.append((a[:, None] * torch.stack(vals)).sum(0))
            out_h.append(torch.stack(out_i))
        out_b.append(torch.stack(out_h))
    return torch.stack(out_b)
