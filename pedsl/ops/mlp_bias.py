"""Causal attention with FIRE's bias, ``b(h, i, j) = f_h(u[i - j] * w[i])``, ``f`` a learned one-hidden-layer
ReLU MLP of one scalar (``f_h(x) = b2_h + sum_k W2[h, k] relu(W1_k x + b1_k)``), without an (H, L, L) tensor
and without the MLP's activations kept for the backward.

FIRE (Li et al. 2023) is ``u(d) = psi(d)``, ``w(i) = 1 / psi(max(i, L_thr))``: the caller computes ``u`` over the
distances and ``w`` over the queries (O(L), differentiable: c and the threshold live there) and this kernel
returns their gradients with those of q, k, v and the MLP.

A one-hidden-layer ReLU MLP of a scalar is piecewise linear. Per block of queries (:meth:`_Plan.block`) and
per distance d, ``x = u[d] w[i]`` lies between ``u[d] min w`` and ``u[d] max w`` over the block's rows; a unit
whose kink lies outside is on for every row (folded into per-distance tables ``const_h(d) + slope_h(d) x``)
or off (nothing), both exact. A unit whose kink falls inside at some distances is evaluated per (query, key)
pair over its *band* (the hull of those distances; overlapping bands merged) and left out of the tables
there. For FIRE a kink sits at one distance per query, so a band is as wide as the spread of that distance
over the block's rows (none below the threshold, where w is constant).

Tiles are taken in *skewed* coordinates: with the keys reversed (as in :mod:`pedsl.ops.distance_bias`), a
tile of ``n`` queries by ``m`` keys is stored as ``(n, m + n - 1)`` whose column ``c`` is one distance for every
row (row r's keys at columns r .. r + m - 1, zeros between), and the tile is a strided view of it. So:

- the bias of a tile is ``const[c] + w[r] * slope[c] u[c]``, one pass over the buffer (``addcmul``), plus the
  band units over the columns of their band; the flash kernel reads it as its float mask (the causal
  ``-inf`` are the columns of negative distance, where ``const`` is ``-inf``);
- in the backward, dS written through the view (:class:`pedsl.ops.distance_bias.TileGrads`) gives every
  gradient from two reductions of the buffer, both matrix products: its column sums plain and weighted by
  ``w`` (b2, W2, W1, b1 through the units on, and ``u``), and its rows against ``slope u`` (``w``); the
  band units add their per-pair terms over their columns.

Forward: per block of ``block`` queries and tile of ``score_tile`` keys, one call of the CPU flash kernel;
the tiles of a block are merged by their log-sum-exp (the mask of a tile stays in the cache, that of a block
at L = 8,192 would not). Backward: per tile the bias and the probabilities recomputed from the saved
log-sum-exp. Memory: O(B H block score_tile), nothing of size (H, L, L), no activations kept.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.errors import ShapeError
from pedsl.ops.flash import FLASH, query_blocks
from pedsl.ops.distance_bias import TileGrads, check_causal_inputs, distance_bias_supported, skewed_buffer

BLOCK = 256  # queries per block
SCORE_TILE = 1024  # keys per tile of the scores (forward and backward; at least ``block``): B H 256 1024 stay in cache


class Units(NamedTuple):
    """The units of one band, evaluated per pair."""
    idx: Tensor  # (K',) their indices
    w1: Tensor  # (K',)
    b1: Tensor  # (K', 1)
    w2: Tensor  # (H, K') their columns of W2

    def relu(self, x: Tensor) -> Tensor:
        """``relu(W1_k x + b1_k)`` (K', P) of ``x (P,)``."""
        return torch.addr(self.b1, self.w1, x).clamp_(min=0)


def mlp_bias_supported(q: Tensor) -> bool:
    return distance_bias_supported(q)


def mlp_bias_attention(q: Tensor, k: Tensor, v: Tensor, u: Tensor, w: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                       b2: Tensor, *, scale: float | None = None, block: int | None = None,
                       score_tile: int | None = None) -> Tensor:
    """Causal ``softmax_j<=i(scale <q_i, k_j> + f_h(u[i - j] w[i])) v_j`` of q, k, v ``(B, H, L, D)`` (one sequence;
    query i is row i): ``u (>= L,)`` over distances, ``w (L,)`` over the queries, the MLP ``f_h(x) = b2[h] +
    W2[h] relu(W1 x + b1)`` given by ``w1, b1 (K,)``, ``w2 (H, K)``, ``b2 (H,)``; all differentiable.
    CPU, float32 / float64 (:func:`mlp_bias_supported`). ``block``: queries per block (:data:`BLOCK`);
    ``score_tile``: keys per tile of the scores, at least ``block`` (:data:`SCORE_TILE`)."""
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
    score_tile = max(block, SCORE_TILE if score_tile is None else int(score_tile))
    return _MlpBias.apply(q, k, v, u, w, w1.reshape(K), b1, w2, b2, scale, block, score_tile)


class _Plan:
    """One call's ``u`` over the distances and ``w`` over the queries in the compute dtype (and in float64, to split
    the MLP) and the MLP's weights; :meth:`block` splits the MLP for one block of queries, :meth:`tile` forms
    the bias of a tile. Tables of a block only (O(H L)): nothing is kept across blocks."""

    def __init__(self, u: Tensor, w: Tensor, weights: tuple, L: int, dtype):
        self.w1, self.b1, self.w2, self.b2 = (t.detach().to(dtype) for t in weights)
        self.k64 = torch.stack([t.detach().double() for t in weights[:2]])  # (2, K): W1, b1
        self.H = self.w2.shape[0]
        self.u, self.w = u[:L].detach().to(dtype), w.detach().to(dtype)
        self.u64, self.w64 = u[:L].detach().double(), w.detach().double()
        self._units: dict[tuple, Units] = {}

    def block(self, c0: int, c1: int) -> "BlockSplit":
        """The split of the MLP for the queries c0 .. c1-1 at each distance 0 .. c1-1: over the block's rows
        ``x = u[d] w[i]`` lies between ``u[d] min w`` and ``u[d] max w``; a unit whose kink is outside is on or
        off there for every row (folded into the tables), one whose kink is inside is evaluated per pair over
        its band (the hull of those distances, bands that overlap merged), where it is left out of the tables."""
        n = c1 - c0
        wr = self.w64[c0:c1]
        ends = self.u64[:c1, None] * torch.stack([wr.min(), wr.max()])
        xlo, xhi = ends.amin(1), ends.amax(1)
        # the units on or off over the block's whole range of x need no per-distance test (most of them)
        whole = _states(self.k64, xlo.min(), xhi.max())
        on = (whole == 2)[:, None].expand(-1, c1).clone()
        ks = (whole == 1).nonzero().squeeze(1)
        bands = []
        if ks.numel():
            states = _states(self.k64[:, ks], xlo, xhi)  # (K', c1)
            on[ks] = states == 2
            mixed = states == 1
            hit = mixed.any(1)
            ks, mixed = ks[hit], mixed[hit]
            first, last = mixed.to(torch.uint8).argmax(1), c1 - 1 - mixed.flip(1).to(torch.uint8).argmax(1)
            for lo, hi, k in sorted(zip(first.tolist(), last.tolist(), ks.tolist())):
                if bands and lo <= bands[-1][1]:
                    bands[-1][1] = max(bands[-1][1], hi + 1)
                    bands[-1][2].append(k)
                else:
                    bands.append([lo, hi + 1, [k]])
            for lo, hi, units in bands:
                on[units, lo:hi] = False
        onf = on.to(self.w1.dtype)
        pad = lambda t, v: torch.cat([t.new_full((t.shape[0], n - 1), v), t], 1)  # noqa: E731
        slope = self.w2 @ (self.w1[:, None] * onf)
        return BlockSplit(pad(self.b2[:, None] + self.w2 @ (self.b1[:, None] * onf), float("-inf")), pad(slope, 0.0),
                          pad(slope * self.u[:c1], 0.0), pad(onf, 0.0),
                          [(lo, hi, self.units(tuple(units))) for lo, hi, units in bands])

    def units(self, ks: tuple) -> Units:
        if ks not in self._units:
            idx = torch.tensor(ks, dtype=torch.long)
            self._units[ks] = Units(idx, self.w1[idx], self.b1[idx, None], self.w2[:, idx])
        return self._units[ks]

    def tile(self, bs: "BlockSplit", c0: int, c1: int, a: int, e: int, out: Tensor) -> "Tile":
        """The bias of the queries c0 .. c1-1 over the reversed keys a .. e-1 of the first c1, written into
        ``out (H, n, m + n - 1)`` in skewed coordinates (column c: distance a + 1 - n + c; the block's tables
        ``bs`` from column a on)."""
        n, m = c1 - c0, e - a
        width, base = m + n - 1, a + 1 - n
        wr = self.w[c0:c1]
        torch.addcmul(bs.const[:, None, a: a + width], wr[:, None], bs.su[:, None, a: a + width], out=out)
        extra = []
        for lo, hi, units in bs.bands:
            lo, hi = max(lo, base), min(hi, e)
            if lo >= hi:
                continue
            x = torch.outer(wr, self.u[lo:hi]).view(-1)
            r = units.relu(x)
            out[:, :, lo - base: hi - base] += (units.w2 @ r).view(self.H, n, hi - lo)
            extra.append((lo, hi, units, x, r))
        bias = out.as_strided((self.H, n, m), (n * width, width + 1, 1), out.storage_offset())
        return Tile(bias, extra)


def _states(k64: Tensor, lo, hi) -> Tensor:
    """Per unit (rows of ``k64 = (W1, b1)``) and x range ``[lo, hi]`` (scalars or (c1,)): 2 on over the whole
    range, 0 off (both ends <= 0: the pre-activation is linear), 1 with its kink inside."""
    lo, hi = torch.as_tensor(lo, dtype=k64.dtype), torch.as_tensor(hi, dtype=k64.dtype)
    w1, b1 = k64[0].reshape(-1, *([1] * lo.dim())), k64[1].reshape(-1, *([1] * lo.dim()))
    return (w1 * lo + b1 > 0).to(torch.uint8) + (w1 * hi + b1 > 0).to(torch.uint8)


class BlockSplit(NamedTuple):
    """The MLP split over one block of n queries, per distance -(n - 1) .. c1 - 1 (column d + n - 1)."""
    const: Tensor  # (H, c1 + n - 1) b2 and the units on (-inf at negative distances: keys after the query)
    slope: Tensor  # (H, c1 + n - 1) the slope in x of the units on
    su: Tensor  # (H, c1 + n - 1) slope * u
    on: Tensor  # (K, c1 + n - 1) 1.0 where the unit is on for every row and outside the bands
    bands: list  # (first, last + 1 distance, Units): the units evaluated per pair


class Tile(NamedTuple):
    bias: Tensor  # (H, n, m): a view of the skewed buffer
    extra: list  # (first, last + 1 distance, Units, x (P,), relu (K', P)) of the bands in the tile


class _MlpBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, u, w, w1, b1, w2, b2, scale, block, score_tile):
        B, H, L, _ = q.shape
        plan = _Plan(u, w, (w1, b1, w2, b2), L, q.dtype)
        kr, vr = k.flip(-2), v.flip(-2)
        outs, lses, bufs = [], [], {}
        for c0, c1 in query_blocks(L, block):
            parts, bs = [], plan.block(c0, c1)
            for a in range(0, c1, score_tile):
                e = min(c1, a + score_tile)
                bias = plan.tile(bs, c0, c1, a, e, _buffer(bufs, (H, c1 - c0, e - a), q)).bias
                keys = slice(L - c1 + a, L - c1 + e)
                parts.append(FLASH(q[:, :, c0:c1], kr[:, :, keys], vr[:, :, keys], 0.0, False,
                                    attn_mask=bias.unsqueeze(0).expand(B, *bias.shape), scale=scale)[:2])
            o, lse = _merge(parts)
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, kr, vr, u, w, w1, b1, w2, b2, out, lse)
        ctx.scale, ctx.block, ctx.score_tile = scale, block, score_tile
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, kr, vr, u, w, w1, b1, w2, b2, out, lse = ctx.saved_tensors
        B, H, L, D = q.shape
        plan = _Plan(u, w, (w1, b1, w2, b2), L, q.dtype)
        acc = _Moments(plan, L)
        grads = TileGrads(q, kr, vr, dout.contiguous(), out, lse, ctx.scale)
        bufs, dsbufs = {}, {}
        for c0, c1 in query_blocks(L, ctx.block):
            bs = plan.block(c0, c1)
            for a in range(0, c1, ctx.score_tile):
                e = min(c1, a + ctx.score_tile)
                n, m = c1 - c0, e - a
                tile = plan.tile(bs, c0, c1, a, e, _buffer(bufs, (H, n, m), q))
                flat, ds = _ds_buffer(dsbufs, (B, H, n, m), q)
                grads.tile(tile.bias, c0, c1, a, e, ds=ds)
                acc.add(bs, tile, (flat.sum(0) if B > 1 else flat[0]).view(H, n, m + n - 1), c0, c1, a, e)
        dq, dk, dv = grads.result()
        du, dw, dw1, db1, dw2, db2 = acc.result()
        du_full = torch.zeros_like(u)
        du_full[:L] = du.to(u.dtype)
        return (dq, dk.flip(-2), dv.flip(-2), du_full, dw.to(w.dtype), dw1.to(w1.dtype), db1.to(b1.dtype),
                dw2.to(w2.dtype), db2.to(b2.dtype), None, None, None)


def _buffer(bufs: dict, shape: tuple, like: Tensor) -> Tensor:
    """A skewed ``(H, n, m + n - 1)`` buffer for a tile of n queries by m keys, one per shape and call."""
    H, n, m = shape
    if shape not in bufs:
        bufs[shape] = like.new_empty(H, n, m + n - 1)
    return bufs[shape]


def _ds_buffer(bufs: dict, shape: tuple, like: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`~pedsl.ops.distance_bias.skewed_buffer` for a tile of ``shape = (B, H, n, m)``, one per shape and
    call (zeroed once: dS is only ever written through the view): its ``(B, H, n (m + n - 1))`` rows and the
    ``(B, H, n, m)`` view."""
    if shape not in bufs:
        B, H, n, m = shape
        bufs[shape] = skewed_buffer((B, H), n, m, like.dtype, like.device)
    return bufs[shape]


def _merge(parts: list) -> tuple[Tensor, Tensor]:
    """One output and log-sum-exp from those of the tiles of keys (each a softmax over its keys)."""
    if len(parts) == 1:
        return parts[0]
    lses = torch.stack([p[1] for p in parts])
    lse = torch.logsumexp(lses, 0)
    wts = (lses - lse).exp_().unsqueeze(-1)
    out = parts[0][0] * wts[0]
    for t in range(1, len(parts)):
        out.addcmul_(parts[t][0], wts[t])
    return out, lse


class _Moments:
    """The backward's sums over the tiles, from which every parameter's gradient follows (module docstring):
    per head the sums of dS (``g1``) and dS x (``gx``) where each unit is folded in as on, the band units'
    sums of dS relu(...) and of ``Y_k [active] (1, x)`` with ``Y_k = sum_h W2[h, k] dS``; and ``u``'s and
    ``w``'s gradients from ``dx = sum_h f_h'(x) dS`` per pair."""

    def __init__(self, plan: _Plan, L: int):
        self.plan = plan
        H, K = plan.w2.shape
        z = lambda *s: plan.u.new_zeros(*s)  # noqa: E731
        self.g1, self.on1, self.onx, self.inr = z(H), z(H, K), z(H, K), z(H, K)
        self.y1, self.yx, self.du, self.dw = z(K), z(K), z(L), z(L)

    def add(self, bs: BlockSplit, tile: Tile, ds: Tensor, c0: int, c1: int, a: int, e: int) -> None:
        """``ds (H, n, m + n - 1)``: the tile's dS (summed over the batch) in skewed coordinates, column c at
        distance ``a + 1 - n + c`` (the tables' column a + c)."""
        plan, H, n, width = self.plan, ds.shape[0], ds.shape[1], ds.shape[2]
        base, cols = a + 1 - n, slice(a, a + width)
        wr = plan.w[c0:c1]
        sums = torch.matmul(torch.stack([torch.ones_like(wr), wr]), ds)  # (H, 2, width): dS and dS w per distance
        s1, sw = sums[:, 0], sums[:, 1]
        on, slope = bs.on[:, cols], bs.slope[:, cols]
        self.g1 += s1.sum(-1)
        self.on1 += s1 @ on.t()
        self.onx += (sw * _useg(plan.u, base, width)) @ on.t()
        cz = max(0, -base)
        self.du[base + cz: e] += (slope * sw).sum(0)[cz:]
        # as (H, 1, width) @ (H, width, n): the (H, n, width) @ (H, width, 1) form takes ~8x longer on CPU
        self.dw[c0:c1] += torch.bmm(bs.su[:, None, cols], ds.transpose(1, 2)).sum(0).squeeze(0)
        for lo, hi, units, x, r in tile.extra:
            ds2 = ds[:, :, lo - base: hi - base].reshape(H, -1)
            self.inr.index_add_(1, units.idx, ds2 @ r.t())
            ym = (units.w2.t() @ ds2).mul_(r > 0)
            self.y1.index_add_(0, units.idx, ym.sum(-1))
            self.yx.index_add_(0, units.idx, ym @ x)
            dx = (units.w1 @ ym).view(n, hi - lo)
            self.du[lo:hi] += wr @ dx
            self.dw[c0:c1] += dx @ plan.u[lo:hi]

    def result(self):
        """Gradients of u, w (in the compute dtype) and of W1, b1 (K,), W2 (H, K), b2 (H,)."""
        p = self.plan
        dw2 = self.onx * p.w1 + self.on1 * p.b1 + self.inr
        dw1 = (p.w2 * self.onx).sum(0) + self.yx
        db1 = (p.w2 * self.on1).sum(0) + self.y1
        return self.du, self.dw, dw1, db1, dw2, self.g1


def _useg(u: Tensor, base: int, width: int) -> Tensor:
    """``u`` at the distances base .. base + width - 1, zero at the negative ones."""
    cz = max(0, -base)
    return torch.cat([u.new_zeros(cz), u[base + cz: base + width]]) if cz else u[base: base + width]
