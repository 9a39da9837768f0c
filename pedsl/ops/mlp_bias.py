"""Causal attention with FIRE's bias, ``b(h, i, j) = f_h(u[i - j] * w[i])``, ``f`` a learned one-hidden-layer
ReLU MLP of one scalar (``f_h(x) = b2_h + sum_k W2[h, k] relu(W1_k x + b1_k)``), without an (H, L, L) tensor
and without the MLP's activations kept for the backward.

FIRE (Li et al. 2023) is ``u(d) = psi(d)``, ``w(i) = 1 / psi(max(i, L_thr))``: the caller computes ``u`` over the
distances and ``w`` over the queries (O(L), differentiable: c and the threshold live there) and this kernel
returns their gradients with those of q, k, v and the MLP.

A one-hidden-layer ReLU MLP of a scalar is piecewise linear: over the range of ``x`` the call can reach
(``[min u w, max u w]``) a hidden unit whose kink lies outside it is either always on (a linear term:
folded into one column ``a_h x + c_h``) or always off (nothing), both exact; only the units whose kink
falls inside ("in range", at most ``hidden``, about a quarter of them at torch's initialisation) are
evaluated per (query, key) point. The per-point features ``[1, x, relu(W1_k x + b1_k) for k in range]`` are
shared by the heads, so the bias of a tile is one small matrix product ``(H, F) @ (F, points)``.

Forward: per block of ``block`` queries over the keys it can see (reversed, as in
:mod:`pedsl.ops.distance_bias`: ``u``'s rows are strided views), the bias is formed and the CPU flash kernel
runs with it as its float mask. Backward: per tile of ``block`` queries by ``score_tile`` keys the bias (by
tiles of ``key_tile`` keys) and the probabilities are recomputed (:class:`pedsl.ops.distance_bias.TileGrads`, its folded channel), and the
parameters' gradients come from per-tile moments: ``dS @ features^T`` (W2, b2, the always-on units'
W1, b1), ``Y = W2_in^T dS`` masked by the in-range units' activity (their W1, b1), and
``dx = sum_h f_h'(x) dS`` per point, summed along the rows (``w``) and along the distances (``u``, a skewed
column sum). Memory: O(H block keys) for the forward's mask of a block, O(B H block score_tile) in the
backward, and one tile's features, O((2 + K) block key_tile).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.errors import ShapeError
from pedsl.ops.bias import _FLASH, _blocks
from pedsl.ops.distance_bias import (TileGrads, add_at_distances, check_causal_inputs, column_sums,
                                    distance_bias_supported, skewed_buffer)

BLOCK = 256  # queries per block
KEY_TILE = 256  # keys per tile of the bias: the range of x over a tile decides which units are evaluated per point
SCORE_TILE = 256  # keys per tile of the backward's recomputed scores (1024 measured slower at L = 2048)


class Mlp:
    """The MLP's weights in the compute dtype, split per tile by where each unit's kink falls relative to the
    tile's range of x (:meth:`split`)."""

    def __init__(self, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, dtype):
        self.w1, self.b1 = w1.detach().to(dtype), b1.detach().to(dtype)
        self.w2, self.b2 = w2.detach().to(dtype), b2.detach().to(dtype)
        self.kinks = list(zip(w1.detach().double().tolist(), b1.detach().double().tolist()))
        self._splits: dict[tuple, Split] = {}  # by the units' states: most tiles share a few

    def split(self, lo: float, hi: float) -> "Split":
        """Over x in [lo, hi]: the units always on (a linear term), always off (nothing), or in range."""
        states = tuple(0 if a > 0 and b > 0 else 1 if a < 0 and b < 0 else 2
                       for a, b in ((w * lo + c, w * hi + c) for w, c in self.kinks))
        sp = self._splits.get(states)
        if sp is None:
            sp = self._splits[states] = self._split(states)
        return sp

    def _split(self, states: tuple) -> "Split":
        on_f = torch.tensor([s == 0 for s in states], dtype=self.w1.dtype)
        inr = torch.tensor([k for k, s in enumerate(states) if s == 2], dtype=torch.long)
        const, slope = self.b2 + self.w2 @ (self.b1 * on_f), self.w2 @ (self.w1 * on_f)
        return Split(on_f, inr, slope, torch.stack([self.b1[inr], self.w1[inr]], 1), self.w1[inr],
                     torch.cat([const[:, None], slope[:, None], self.w2[:, inr]], 1), self.w2[:, inr])


class Split(NamedTuple):
    on: Tensor  # (K,) 1.0 for the units always on over the tile
    inr: Tensor  # indices of the units whose kink may fall inside (K',)
    slope: Tensor  # (H,) the slope in x of the units always on
    first: Tensor  # (K', 2) the in-range units' (b1, W1)
    w1: Tensor  # (K',)
    weights: Tensor  # (H, 2 + K') of the features [1, x, relu(W1_k x + b1_k) ...]: b2 and the units on, then W2's
    w2: Tensor  # (H, K') the in-range units' columns of W2

    def features(self, f: Tensor) -> None:
        """``f (2 + K', P)`` with f[1] = x: 1, x, and the in-range units' activations."""
        f[0].fill_(1.0)
        if f.shape[0] > 2:
            torch.mm(self.first, f[:2], out=f[2:]).clamp_(min=0)


def mlp_bias_supported(q: Tensor) -> bool:
    return distance_bias_supported(q)


def mlp_bias_attention(q: Tensor, k: Tensor, v: Tensor, u: Tensor, w: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                       b2: Tensor, *, scale: float | None = None, block: int | None = None,
                       key_tile: int | None = None, score_tile: int | None = None) -> Tensor:
    """Causal ``softmax_j<=i(scale <q_i, k_j> + f_h(u[i - j] w[i])) v_j`` of q, k, v ``(B, H, L, D)`` (one sequence;
    query i is row i): ``u (>= L,)`` over distances, ``w (L,)`` over the queries, the MLP ``f_h(x) = b2[h] +
    W2[h] relu(W1 x + b1)`` given by ``w1, b1 (K,)``, ``w2 (H, K)``, ``b2 (H,)``; all differentiable.
    CPU, float32 / float64 (:func:`mlp_bias_supported`). ``block``: queries per block (:data:`BLOCK`);
    ``key_tile``: keys per tile of the bias (:data:`KEY_TILE`); ``score_tile``: keys per tile of the backward's
    scores (:data:`SCORE_TILE`)."""
    B, H, L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    check_causal_inputs("mlp_bias_attention", q, k, v)
    K = w1.numel()
    if (u.dim() != 1 or u.shape[0] < L or w.shape != (L,) or b1.shape != (K,) or w2.shape != (H, K)
            or b2.shape != (H,)):
        raise ShapeError(f"mlp_bias_attention: expected u (>= {L},), w ({L},), w1 and b1 ({K},), w2 ({H}, {K}), "
                         f"b2 ({H},); got {tuple(u.shape)}, {tuple(w.shape)}, {tuple(b1.shape)}, {tuple(w2.shape)}, "
                         f"{tuple(b2.shape)}", hint="one MLP input per distance times one per query")
    if L == 0:
        return torch.zeros_like(q)
    block = min(BLOCK if block is None else int(block), L)
    key_tile = max(1, KEY_TILE if key_tile is None else int(key_tile))
    score_tile = max(1, SCORE_TILE if score_tile is None else int(score_tile))
    return _MlpBias.apply(q, k, v, u, w, w1.reshape(K), b1, w2, b2, scale, block, key_tile, score_tile)


class _Tables:
    """The call's padded per-distance tables in the compute dtype: ``u`` after ``block`` zeros and the causal
    mask (``-inf`` x block, then zeros), so that a tile's rows over reversed keys are views (strides 1, 1)."""

    def __init__(self, u: Tensor, w: Tensor, mlp: Mlp, L: int, block: int, dtype):
        self.block, self.mlp = block, mlp
        self.u = torch.cat([u.new_zeros(block).to(dtype), u[:L].detach().to(dtype)]).contiguous()
        self.mask = torch.cat([torch.full((block,), float("-inf"), dtype=dtype), torch.zeros(L, dtype=dtype)])
        self.w = w.detach().to(dtype)
        self.ul, self.wl = u[:L].detach().double().tolist(), w.detach().double().tolist()

    def rows(self, t: Tensor, c0: int, c1: int, a: int, e: int) -> Tensor:
        """Queries c0 .. c1-1 over the reversed keys a .. e-1 of the first c1: (c1 - c0, e - a), a view."""
        return t.as_strided((c1 - c0, e - a), (1, 1), self.block + c0 - c1 + 1 + a)

    def split(self, c0: int, c1: int, a: int, e: int) -> Split:
        """The MLP's split over the tile's range of x = u[d] w[i] (bounds from the extremes of both)."""
        us = self.ul[max(0, c0 - c1 + 1 + a): e]
        ws = self.wl[c0:c1]
        u0, u1, w0, w1 = min(us), max(us), min(ws), max(ws)
        corners = (u0 * w0, u0 * w1, u1 * w0, u1 * w1)
        return self.mlp.split(min(corners), max(corners))

    def bias(self, sp: Split, f: Tensor, c0, c1, a, e) -> Tensor:
        """The tile's bias (H, n, m) from its features ``f (2 + K', n * m)`` (:meth:`Split.features`)."""
        n, m = c1 - c0, e - a
        out = torch.mm(sp.weights, f).view(-1, n, m)
        if a < n:  # the tile holds keys after some of its queries
            out += self.rows(self.mask, c0, c1, a, e)
        return out

    def span(self, c0: int, c1: int, a0: int, e0: int, key_tile: int) -> tuple[Tensor, list]:
        """The bias (H, n, e0 - a0) of the queries c0 .. c1-1 over the reversed keys a0 .. e0-1, formed per tile of
        ``key_tile`` keys, and each tile's (a, e, split, features)."""
        parts = []
        bias = self.w.new_empty(self.mlp.w2.shape[0], c1 - c0, e0 - a0)
        for a in range(a0, e0, key_tile):
            e = min(e0, a + key_tile)
            sp, f = self.features(c0, c1, a, e)
            bias[:, :, a - a0: e - a0] = self.bias(sp, f, c0, c1, a, e)
            parts.append((a, e, sp, f))
        return bias, parts

    def features(self, c0: int, c1: int, a: int, e: int) -> tuple[Split, Tensor]:
        """The tile's split and features (2 + K', n * m)."""
        sp = self.split(c0, c1, a, e)
        n, m = c1 - c0, e - a
        f = self.w.new_empty(2 + sp.inr.numel(), n * m)
        torch.mul(self.rows(self.u, c0, c1, a, e), self.w[c0:c1, None], out=f[1].view(n, m))
        sp.features(f)
        return sp, f


class _MlpBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, u, w, w1, b1, w2, b2, scale, block, key_tile, score_tile):
        B, H, L, _ = q.shape
        tabs = _Tables(u, w, Mlp(w1, b1, w2, b2, q.dtype), L, block, q.dtype)
        kr, vr = k.flip(-2), v.flip(-2)
        outs, lses = [], []
        for c0, c1 in _blocks(L, block):
            bias = tabs.span(c0, c1, 0, c1, key_tile)[0]
            o, lse = _FLASH(q[:, :, c0:c1], kr[:, :, L - c1:], vr[:, :, L - c1:], 0.0, False,
                            attn_mask=bias.unsqueeze(0).expand(B, *bias.shape), scale=scale)[:2]
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, kr, vr, u, w, w1, b1, w2, b2, out, lse)
        ctx.scale, ctx.block, ctx.key_tile, ctx.score_tile = scale, block, key_tile, score_tile
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, kr, vr, u, w, w1, b1, w2, b2, out, lse = ctx.saved_tensors
        B, H, L, D = q.shape
        mlp = Mlp(w1, b1, w2, b2, q.dtype)
        tabs = _Tables(u, w, mlp, L, ctx.block, q.dtype)
        acc = _Moments(mlp, L)
        grads = TileGrads(q, kr, vr, dout.contiguous(), out, lse, ctx.scale)
        for c0, c1 in _blocks(L, ctx.block):
            for a0 in range(0, c1, ctx.score_tile):
                e0 = min(c1, a0 + ctx.score_tile)
                bias, parts = tabs.span(c0, c1, a0, e0, ctx.key_tile)
                ds = grads.tile(bias, c0, c1, a0, e0)
                ds = ds.sum(0) if B > 1 else ds[0]
                for a, e, sp, f in parts:
                    acc.add(tabs, sp, ds[:, :, a - a0: e - a0], f, c0, c1, a, e)
        dq, dk, dv = grads.result()
        du, dw, dw1, db1, dw2, db2 = acc.result()
        du_full = torch.zeros_like(u)
        du_full[:L] = du.to(u.dtype)
        return (dq, dk.flip(-2), dv.flip(-2), du_full, dw.to(w.dtype), dw1.to(w1.dtype), db1.to(b1.dtype),
                dw2.to(w2.dtype), db2.to(b2.dtype), None, None, None, None)


class _Moments:
    """The backward's per-tile sums, from which every parameter's gradient follows (module docstring):
    per head the sums of dS (``g1``) and dS x (``gx``) spread over the units on in each tile, the in-range
    units' sums of dS relu(...), and of ``Y_k [on] (1, x)`` with ``Y_k = sum_h W2[h, k] dS``."""

    def __init__(self, mlp: Mlp, L: int):
        self.mlp = mlp
        H, K = mlp.w2.shape
        z = lambda *s: mlp.w2.new_zeros(*s)  # noqa: E731
        self.g1, self.on1, self.onx, self.inr = z(H), z(H, K), z(H, K), z(H, K)
        self.y1, self.yx, self.du, self.dw = z(K), z(K), z(L), z(L)

    def add(self, tabs: _Tables, sp: Split, ds: Tensor, f: Tensor, c0, c1, a, e) -> None:
        H, n, m = ds.shape
        ds2 = ds.reshape(H, n * m)
        g = ds2 @ f.t()  # (H, 2 + K'): sum dS, sum dS x, sum dS relu(...)
        self.g1 += g[:, 0]
        self.on1.addr_(g[:, 0], sp.on)
        self.onx.addr_(g[:, 1], sp.on)
        y = torch.cat([sp.slope[None], sp.w2.t()]) @ ds2  # (1 + K', P)
        dx = y[0]
        if sp.inr.numel():
            self.inr.index_add_(1, sp.inr, g[:, 2:])
            ym = y[1:].mul_(f[2:] > 0)
            self.y1.index_add_(0, sp.inr, ym.sum(-1))
            self.yx.index_add_(0, sp.inr, ym @ f[1])
            dx = torch.addmv(dx, ym.t(), sp.w1)
        dx = dx.view(n, m)
        self.dw[c0:c1] += (dx * tabs.rows(tabs.u, c0, c1, a, e)).sum(-1)
        flat, view = skewed_buffer((), n, m, dx.dtype, dx.device)
        torch.mul(dx, tabs.w[c0:c1, None], out=view)
        add_at_distances(self.du, column_sums(flat, n, m), c0 - c1 + 1 + a)

    def result(self):
        """Gradients of u, w (in the compute dtype) and of W1, b1 (K,), W2 (H, K), b2 (H,)."""
        m = self.mlp
        dw2 = self.onx * m.w1 + self.on1 * m.b1 + self.inr
        dw1 = (m.w2 * self.onx).sum(0) + self.yx
        db1 = (m.w2 * self.on1).sum(0) + self.y1
        return self.du, self.dw, dw1, db1, dw2, self.g1
