"""A deliberately naive float64 interpreter of docs/semantics.md §1 (the test oracle).

For one head, query ``i`` and key ``j <= i`` (causal)::

    s(i, j) = tau(i) * <q_i, T(j->i) k_j> * scale + b(i, j)      (scale = 1/sqrt(D) by default)
    a(i, j) = softmax_j s(i, j)
    o_i     = sum_j a(i, j) U(j->i) v_j

Everything is explicit loops over ``(i, j)`` (vectorised over batch and head
only), in float64, and shares no code with the fast kernels (``rotary.py``,
``accumulate.py``, ``bias.py``): the channel pairing and rotation sign are
re-derived here from docs/semantics.md §2a/2b. It is autograd-friendly, so tests compare
gradients too. Use only at small sizes (L <= ~32).

Shapes: q, k, v ``(B, H, L, D)``; transports ``(B|1, H|1, L, L, D, D)`` indexed
``[b, h, i, j]`` = the matrix ``T(j->i)`` (entries with ``j > i`` are unused),
or a callable ``(b, h, i, j) -> (D, D)``; bias ``(B|1, H|1, L, L)``;
tau ``(B|1, H|1, L)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

F64 = torch.float64


def _pairs(channels: Sequence[int] | slice | None, layout: str, dim: int | None) -> list[tuple[int, int]]:
    """(first, second) channel pairs of a group, re-derived independently of :func:`pedsl.formulas.channel_pairs`
    (which every other module uses): the reference must not share the code it checks."""
    if channels is None:
        channels = slice(None)
    if isinstance(channels, slice):
        assert dim is not None, "the head's channels, or a slice of them: give the head dimension"
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
    """``T(j->i)`` of docs/semantics.md §2a: pair k rotated by ``phases[j,k] - phases[i,k]``.

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


def xpos_decay(positions: Tensor, gamma: float, zeta: float, layout: str, channels=None, dim: int | None = None) -> Tensor:
    """xPos's factor on ``T(j->i)`` (docs/semantics.md §2c): the diagonal matrix that multiplies both channels
    of pair k by ``zeta_k ** ((p_i - p_j) / gamma)``, ``zeta_k = (2k / m + zeta) / (1 + zeta)`` for a group of
    m channels (Sun et al. 2022, eq. 10), identity elsewhere. ``positions``: ``(B, L)``; returns
    ``(B, 1, L, L, D, D)``, written entry by entry."""
    pos = positions.to(F64)
    B, L = pos.shape
    pairs = _pairs(channels, layout, dim)
    dim = dim if dim is not None else 2 * len(pairs)
    m = 2 * len(pairs)
    out = torch.eye(dim, dtype=F64).expand(B, 1, L, L, dim, dim).clone()
    delta = (pos[:, :, None] - pos[:, None, :]) / gamma  # [b, i, j] = (p_i - p_j) / gamma
    for p, (a, b) in enumerate(pairs):
        f = ((2 * p / m + zeta) / (1 + zeta)) ** delta
        out[:, 0, :, :, a, a] = f
        out[:, 0, :, :, b, b] = f
    return out


def so2_step_matrices(step_angles: Tensor, layout: str, channels=None, dim: int | None = None) -> Tensor:
    """Step matrices ``M_t`` (docs/semantics.md §2b): pair k rotated by ``-a(t, k)``. ``(B, H, L, P) -> (B, H, L, D, D)``."""
    a = _expand_bh(step_angles.to(F64), 4)
    Bp, Hp, L, P = a.shape
    dim = dim if dim is not None else 2 * P
    pairs = _pairs(channels, layout, dim)
    return _rot_matrices(-a, pairs, dim)


def accumulated_transport(step_mats: Tensor) -> Tensor:
    """``P(j->i) = M_i M_(i-1) ... M_(j+1)`` by explicit products (identity for j = i).

    ``step_mats (B, H, L, D, D) -> (B, H, L, L, D, D)`` (zeros where ``j > i``).
    Built row by row with the recursion ``P(j->i) = M_i P(j->i-1)``.
    """
    Bp, Hp, L, D, _ = step_mats.shape
    eye = torch.eye(D, dtype=step_mats.dtype).expand(Bp, Hp, D, D)
    zero = torch.zeros(Bp, Hp, D, D, dtype=step_mats.dtype)
    M = step_mats.unbind(2)
    rows: list[Tensor] = []
    prev: list[Tensor] = []
    for i in range(L):
        cur = [M[i] @ p for p in prev] + [eye]  # P(j->i) for j < i, then P(i->i) = I
        rows.append(torch.stack(cur + [zero] * (L - 1 - i), dim=2))
        prev = cur
    return torch.stack(rows, dim=2)


def _as_tensor(tr, B: int, H: int, L: int, D: int) -> Tensor | None:
    """A transport given as a callable (b, h, i, j) -> (D, D) turned into (B, H, L, L, D, D)."""
    if tr is None or isinstance(tr, Tensor):
        return tr
    zero = torch.zeros(D, D, dtype=F64)
    return torch.stack([torch.stack([torch.stack([torch.stack(
        [tr(b, h, i, j).to(F64) if j <= i else zero for j in range(L)]) for i in range(L)])
        for h in range(H)]) for b in range(B)])


def reference_attention(q: Tensor, k: Tensor, v: Tensor, *, transport=None, value_transport=None,
                        bias: Tensor | None = None, tau: Tensor | None = None, scale: float | None = None,
                        allowed: Tensor | None = None, q_offset: int = 0, sink=None, normalize: str = "softmax",
                        attend_current: bool = True, cope: Tensor | None = None,
                        softcap: float | None = None, sigmoid_bias: float = 0.0, causal: bool = True) -> Tensor:
    """Naive causal attention of docs/semantics.md §1 in float64; returns ``(B, H, Lq, D)`` float64.

    Explicit loops over ``(i, j)``; each step is vectorised over batch and head. ``allowed``
    ``(B, H, L, L)`` bool restricts the keys of each query further (a query with none gives
    zeros); q's row ``r`` is the query of token ``q_offset + r`` (k and v hold every token).
    ``normalize = "stick_breaking"`` replaces the softmax by :func:`stick_breaking_loop`; ``"sigmoid"`` by
    ``sigmoid(s_j + sigmoid_bias)`` per allowed key; ``"softmax1"`` by :func:`softmax1_loop`.
    ``sink``: (logit ``(B|1, H, Lq)``, value ``(H, D)`` or None for zero): one more key every query
    sees, whose score is that logit as it stands (no scale, temperature, bias or cap).
    ``cope``: CoPE's learned embedding, ``(max_pos, D)`` shared by the heads or ``(H, max_pos, D)``: every
    score gains :func:`cope_loop`'s term, read by the query as given.
    ``softcap``: each score (after scale, temperature and bias, before CoPE's term) becomes
    ``softcap * tanh(s / softcap)``.
    ``causal=False``: query i scores every key j (``allowed`` decides), not only ``j <= i`` (a non-causal mask;
    stick-breaking and CoPE are defined for j <= i only).
    """
    assert causal or (normalize == "softmax" and cope is None), "stick-breaking and CoPE read keys j <= i only"
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    B, H, L, D = k.shape
    Lq = q.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    T = _as_tensor(transport, B, H, L, D)
    U = _as_tensor(value_transport, B, H, L, D)
    T_rows = [r.unbind(2) for r in T.to(F64).unbind(2)] if T is not None else None  # T_rows[i][j]: (B|1, H|1, D, D)
    U_rows = [r.unbind(2) for r in U.to(F64).unbind(2)] if U is not None else None
    qs, ks, vs = q.unbind(2), k.unbind(2), v.unbind(2)  # each (B, H, D)
    tau_s = tau.to(F64).unbind(-1) if tau is not None else None  # each (B|1, H|1)
    bias_rows = [r.unbind(-1) for r in bias.to(F64).unbind(-2)] if bias is not None else None
    outs = []
    for i in range(q_offset, q_offset + Lq):
        scores, vals = [], []
        qi = qs[i - q_offset]
        for j in range(i + 1 if causal else L):
            kj = ks[j] if T_rows is None else (T_rows[i][j] @ ks[j].unsqueeze(-1)).squeeze(-1)
            s = (qi * kj).sum(-1) * scale  # (B, H)
            if tau_s is not None:
                s = s * tau_s[i]
            if bias_rows is not None:
                s = s + bias_rows[i][j]
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            scores.append(s.expand(B, H))
            vals.append(vs[j] if U_rows is None else (U_rows[i][j] @ vs[j].unsqueeze(-1)).squeeze(-1))
        s = torch.stack(scores, dim=-1)  # (B, H, i+1)
        if cope is not None:
            keys = torch.ones_like(s, dtype=torch.bool) if allowed is None else allowed[:, :, i, : i + 1].expand(B, H, i + 1)
            if normalize == "stick_breaking" and not attend_current:
                keys = keys.clone()
                keys[..., i] = False
            s = s + cope_loop(s, keys, qi.expand(B, H, D), cope)
        if normalize == "stick_breaking":
            ok = torch.ones_like(s, dtype=torch.bool) if allowed is None else allowed[:, :, i, : i + 1].expand(B, H, i + 1)
            a = stick_breaking_loop(s, ok, attend_current)
            outs.append((a.unsqueeze(-1) * torch.stack(vals, dim=-2)).sum(-2))
            continue
        n = s.shape[-1]  # the keys scored: 0..i, or all of them
        ok = allowed[:, :, i, :n] if allowed is not None else torch.ones_like(s, dtype=torch.bool)
        if normalize in ("sigmoid", "softmax1"):
            ok = ok.expand(B, H, n)
            a = (torch.where(ok, torch.sigmoid(s + sigmoid_bias), torch.zeros_like(s)) if normalize == "sigmoid"
                 else softmax1_loop(s, ok))
            outs.append((a.unsqueeze(-1) * torch.stack(vals, dim=-2)).sum(-2))
            continue
        if sink is not None:
            ok = torch.cat([ok.expand(B, H, n), ok.new_ones(B, H, 1)], dim=-1)
            s = torch.cat([s, sink[0][..., i - q_offset].to(F64).expand(B, H).unsqueeze(-1)], dim=-1)
            sv = torch.zeros(H, D, dtype=F64, device=q.device) if sink[1] is None else sink[1].to(F64)
            vals.append(sv.expand(B, H, D))
        any_ok = ok.any(-1, keepdim=True)
        s = s.masked_fill(~ok, float("-inf")).masked_fill(~any_ok, 0.0)
        a = torch.softmax(s, dim=-1) * any_ok
        outs.append((a.unsqueeze(-1) * torch.stack(vals, dim=-2)).sum(-2))  # (B, H, D)
    return torch.stack(outs, dim=2)


def cope_loop(s: Tensor, ok: Tensor, qi: Tensor, emb: Tensor) -> Tensor:
    """CoPE's term (Golovneva et al. 2024) of one query ``i`` over its keys ``0..i``, written as the formula in
    float64: ``p_j = sum_{t = j..i, ok_t} sigmoid(s_t)``, clamped to ``max_pos - 1``, and ``qi . e[p_j]`` read
    between the rows ``floor(p_j)`` and ``floor(p_j) + 1`` with weights ``1 - frac(p_j)`` and ``frac(p_j)``.
    ``s``, ``ok``: ``(B, H, i + 1)``; ``qi``: ``(B, H, D)``; ``emb``: ``(max_pos, D)`` or ``(H, max_pos, D)``."""
    n, P = s.shape[-1], emb.shape[-2]
    e = emb.to(F64) if emb.dim() == 3 else emb.to(F64).expand(s.shape[1], P, emb.shape[-1])  # (H, P, D)
    qe = torch.einsum("bhd,hpd->bhp", qi.to(F64), e)  # q_i . e[p] for every integer position p
    out = []
    for j in range(n):
        p = torch.zeros_like(s[..., 0], dtype=F64)
        for t in range(j, n):
            p = p + torch.where(ok[..., t], torch.sigmoid(s[..., t].to(F64)), torch.zeros_like(p))
        p = torch.clamp(p, max=P - 1)
        low = torch.floor(p)
        frac = p - low
        lo = low.long()
        hi = torch.clamp(lo + 1, max=P - 1)
        term = (1 - frac) * qe.gather(-1, lo[..., None])[..., 0] + frac * qe.gather(-1, hi[..., None])[..., 0]
        out.append(term)
    return torch.stack(out, dim=-1)


def softmax1_loop(s: Tensor, ok: Tensor) -> Tensor:
    """Softmax plus one of one query over its keys, written as the formula in float64: ``a_j = exp(s_j) /
    (1 + sum_t exp(s_t))`` over the allowed keys t (a query with none: zeros), numerator and denominator
    both divided by ``exp(m)``, ``m = max(0, max_t s_t)``, so that no exponential overflows. ``s``, ``ok``:
    ``(B, H, n)``."""
    s = s.to(F64)
    m = torch.zeros_like(s[..., 0])
    for t in range(s.shape[-1]):
        m = torch.where(ok[..., t], torch.maximum(m, s[..., t]), m)
    den = torch.exp(-m)
    for t in range(s.shape[-1]):
        den = den + torch.where(ok[..., t], torch.exp(s[..., t] - m), torch.zeros_like(m))
    return torch.stack([torch.where(ok[..., j], torch.exp(s[..., j] - m) / den, torch.zeros_like(m))
                        for j in range(s.shape[-1])], dim=-1)


def stick_breaking_loop(s: Tensor, ok: Tensor, attend_current: bool) -> Tensor:
    """Stick-breaking weights of one query ``i`` over its keys ``0..i`` (the last is its own), written as the
    formula (Tan et al. 2024), in float64 with no logarithm: ``a_j = sigmoid(s_j) * prod_{t} (1 - sigmoid(s_t))``
    over the allowed keys t with ``j < t <= i`` (``j < t < i`` and ``a_i = 0`` without ``attend_current``).
    ``s``, ``ok``: ``(B, H, i + 1)``."""
    n = s.shape[-1]
    beta = torch.sigmoid(s.to(F64))
    keep = ok.clone()
    if not attend_current:
        keep[..., n - 1] = False
    out = []
    for j in range(n):
        w = beta[..., j]
        for t in range(j + 1, n):
            w = w * torch.where(keep[..., t], 1 - beta[..., t], torch.ones_like(w))
        out.append(torch.where(keep[..., j], w, torch.zeros_like(w)))
    return torch.stack(out, dim=-1)
