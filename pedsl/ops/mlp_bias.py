"""Causal attention with FIRE's bias, ``b(h, i, j) = f_h(u[i - j] * w[i])``, ``f`` a learned one-hidden-layer
ReLU MLP of one scalar (``f_h(x) = b2_h + sum_k W2[h, k] relu(W1_k x + b1_k)``), without an (H, L, L) tensor
and without the MLP's activations kept for the backward.

FIRE (Li et al. 2023) is ``u(d) = psi(d)``, ``w(i) = 1 / psi(max(i, L_thr))``: the caller computes ``u`` over the
distances and ``w`` over the queries (O(L), differentiable: c and the threshold live there) and this kernel
returns their gradients with those of q, k, v and the MLP.

A one-hidden-layer ReLU MLP of a scalar is piecewise linear. Per sub-block of ``SUB`` (or more) rows of a block of
queries (:meth:`_Plan.split`) and per distance d, ``x = u[d] w[i]`` lies between ``u[d] min w`` and ``u[d] max w`` over
the sub-block's rows; a unit whose kink lies outside is on for every row (folded into the sub-block's
per-distance tables ``const_h(d) + slope_h(d) x``) or off (nothing), both exact. A unit whose kink falls inside
at some distances is evaluated per (query, key) pair over its *band* (the hull of those distances, per
sub-block) and left out of the tables there. For FIRE a kink sits at one distance per query, so a band is as
wide as the spread of that distance over the sub-block's rows (none below the threshold, where w is constant),
and, u being non-decreasing and w positive, each unit's states over the distances are intervals found by
bisection (:func:`_sorted_states`; any other u and w are tested distance by distance). The split is made once
in the forward and kept for the backward where it is intervals (O(units x sub-blocks) per block).

Tiles are taken in *skewed* coordinates: with the keys reversed (as in :mod:`pedsl.ops.distance_bias`), a
tile of ``n`` queries by ``m`` keys is stored as ``(n, m + n - 1)`` whose column ``c`` is one distance for every
row (row r's keys at columns r .. r + m - 1, gaps between), and the tile is a strided view of it. So:

- the bias of a tile is ``const[s, c] + w[r] * slope[s, c] u[c]``, one pass over the buffer (``addcmul``), plus
  the band pairs scattered in; the flash kernel reads it as its float mask (the causal ``-inf`` are the
  columns of negative distance, where ``const`` is ``-inf``);
- in the backward the buffer holding the bias becomes the probabilities and then dS in place
  (:meth:`pedsl.ops.distance_bias.TileGrads.skewed_tile`: no copy, no second buffer), and every gradient comes
  from two reductions of it, both matrix products: its column sums per sub-block plain and weighted by ``w``
  (b2, W2, W1, b1 through the units on, and ``u``), and its rows against ``slope u`` (``w``); the band pairs
  add their per-pair terms.

Forward: per block of ``block`` queries and tile of ``score_tile`` keys, one call of the CPU flash kernel;
the tiles of a block are merged by their log-sum-exp (the mask of a tile stays in the cache, that of a block
at L = 8,192 would not). Backward: per tile the bias and the probabilities recomputed from the saved
log-sum-exp. Memory: O(B H block score_tile) per tile, nothing of size (H, L, L), no activations kept.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.errors import ShapeError
from pedsl.ops.distance_bias import TileGrads, check_causal_inputs, distance_bias_supported
from pedsl.ops.flash import FLASH, query_blocks

BLOCK = 256  # queries per block
SUB = 32  # rows per sub-block: the MLP is split per sub-block (its bands are as wide as w's spread over its rows)
SCORE_TILE = 1024  # keys per tile of the scores (forward and backward; at least ``block``): B H 256 1024 stay in cache


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


class Split(NamedTuple):
    """Which of the MLP's units are on at which distance over one block of queries, per sub-block of its rows
    (:meth:`_Plan.split`); what the backward keeps of the forward's split (the tables follow from it)."""
    sub: int  # rows per sub-block (S = n / sub of them)
    whole: Tensor  # (K,) uint8: 2 on, 0 off over the block's whole range of x, 1 kinked somewhere
    kinked: Tensor  # (K',) the units with whole == 1
    on: Tensor | None  # (K', S, c1) bool: those units on over every row of the sub-block, outside their band
    bands: list  # (sub-block, first, last + 1 distance, unit): the pairs evaluated one by one
    limits: tuple[Tensor, Tensor, Tensor] | None = None  # (up (K', 1), first, end (K', S)) in place of ``on`` where it is intervals

    def kept(self) -> "Split | None":
        """What the backward keeps: this split where it is intervals (O(K' S)), else nothing (it is made again)."""
        return self if self.on is None else None


class Pairs(NamedTuple):
    """The (row, distance) pairs of one block's bands, one after the other: a band is a sub-block's rows by its
    distances."""
    row: Tensor  # (P,) in the block
    col: Tensor  # (P,) the tables' column: distance + n - 1
    key: Tensor  # (P,) the (reversed) key: col - row
    dist: Tensor  # (P,)
    unit: Tensor  # (P,)
    x: Tensor  # (P,) the MLP's input u[d] w[i]
    act: Tensor  # (P,) relu(W1 x + b1) of the pair's unit
    bias: Tensor  # (H, P) W2[h, unit] act

    def tile(self, a: int, e: int, width: int) -> tuple[Tensor, Tensor]:
        """The pairs of the reversed keys a .. e-1 (``sel``) and their places in that tile's skewed ``(n, width)``
        rows flattened."""
        sel = ((self.key >= a) & (self.key < e)).nonzero().squeeze(1)
        return sel, self.row.index_select(0, sel) * width + self.col.index_select(0, sel) - a


class BlockSplit(NamedTuple):
    """The MLP split over one block of n queries: tables per sub-block of ``sub`` rows and distance -(n - 1) ..
    c1 - 1 (column d + n - 1), the units on everywhere and the kinked ones apart (for the moments)."""
    sub: int
    const: Tensor  # (H, S, c1 + n - 1) b2 and the units on (-inf at negative distances: keys after the query)
    su: Tensor  # (H, S, c1 + n - 1) the units' slope in x times u (0 at negative distances)
    slope: Tensor  # (H, S, c1) the units' slope in x, distances 0 .. c1 - 1
    on_all: Tensor  # (K,) 1.0 for the units on at every pair of the block
    kinked: Tensor  # (K',)
    on: Tensor | None  # (K', S, c1) 1.0 where a kinked unit is on for every row of the sub-block, out of its band
    bands: list  # (sub-block, first, last + 1 distance, unit)
    pairs: Pairs | None


class _Plan:
    """One call's ``u`` over the distances and ``w`` over the queries in the compute dtype (and in float64, to split
    the MLP) and the MLP's weights; :meth:`split` splits the MLP for one block of queries, :meth:`block` makes
    that block's tables, :meth:`fill` forms the bias of a tile. Tables of a block only (O(H L))."""

    def __init__(self, u: Tensor, w: Tensor, weights: tuple, L: int, dtype):
        self.w1, self.b1, self.w2, self.b2 = (t.detach().to(dtype) for t in weights)
        self.k64 = torch.stack([t.detach().double() for t in weights[:2]])  # (2, K): W1, b1
        self.H = self.w2.shape[0]
        self.u, self.w = u[:L].detach().to(dtype), w.detach().to(dtype)
        self.u64, self.w64 = u[:L].detach().double(), w.detach().double()
        self._tables: Tensor | None = None
        # FIRE's u = log(c d + 1) and w = 1 / log(c max(i, L_thr) + 1): x's range then moves one way with d and
        # each unit's states are intervals of distances (:func:`_sorted_states`)
        self.sorted = bool(L < 2 or (self.u64[1:] >= self.u64[:-1]).all()) and bool(
            (self.u64[:1] >= 0).all() and (self.w64 > 0).all())

    def split(self, c0: int, c1: int) -> Split:
        """The split of the MLP for the queries c0 .. c1-1 at each distance 0 .. c1-1, per sub-block of
        :func:`_sub_rows` rows: over a sub-block's rows ``x = u[d]
        w[i]`` lies between ``u[d] min w`` and ``u[d] max w``; a unit whose kink is outside is on or off there for
        every row (folded into the sub-block's tables), one whose kink is inside at some distances is evaluated
        per pair over its band (the hull of those distances), where it is left out of the tables. The narrower
        the sub-block, the narrower its bands (the spread of w over its rows)."""
        n = c1 - c0
        sub = _sub_rows(n, c1)
        wr = self.w64[c0:c1].view(n // sub, sub)
        if self.sorted:  # u >= 0, w > 0: the ends are u min w and u max w, rows non-decreasing in d
            xlo, xhi = wr.amin(1)[:, None] * self.u64[:c1], wr.amax(1)[:, None] * self.u64[:c1]
        else:
            ends = self.u64[:c1, None, None] * torch.stack([wr.amin(1), wr.amax(1)])  # (c1, 2, S)
            xlo, xhi = ends.amin(1).t().contiguous(), ends.amax(1).t().contiguous()  # (S, c1)
        # the units on or off over the block's whole range of x need no per-distance test (most of them)
        whole = _states(self.k64, xlo.min(), xhi.max())
        kinked = (whole == 1).nonzero().squeeze(1)
        if not kinked.numel():
            return Split(sub, whole, kinked, None, [])
        if self.sorted:
            on, (up, first, end) = None, _sorted_states(self.k64[:, kinked], xlo, xhi)
        else:
            on, first, end = _distance_states(self.k64[:, kinked], xlo, xhi)
        j, sb = (first < end).nonzero().unbind(1)
        bands = [tuple(b) for b in torch.stack([sb, first[j, sb], end[j, sb], kinked[j]], 1).tolist()]
        return Split(sub, whole, kinked, on, bands, None if on is not None else (up, first, end))

    def block(self, c0: int, c1: int, split: Split | None = None) -> BlockSplit:
        """The tables of the queries c0 .. c1-1 from their split (:meth:`split` when not given) and the band
        units' values per pair."""
        sp = self.split(c0, c1) if split is None else split
        n, H = c1 - c0, self.H
        S = n // sp.sub
        on_all = (sp.whole == 2).to(self.w1.dtype)
        # const, slope and slope u per sub-block and distance, padded, in one buffer kept across the blocks
        # (fresh multi-MiB tensors per block cost page faults)
        tab = self._buffer(3 * H * S * (c1 + n - 1)).view(3, H, S, c1 + n - 1)
        tab[0, ..., :n - 1], tab[1:, ..., :n - 1] = float("-inf"), 0.0
        body = tab[..., n - 1:]
        base = torch.stack([self.b2 + self.w2 @ (self.b1 * on_all), self.w2 @ (self.w1 * on_all)])[..., None, None]
        on = sp.on if sp.limits is None else _on_between(*sp.limits, c1)
        if on is None:
            body[:2] = base
        else:
            on, w2k = on.to(self.w1.dtype), self.w2[:, sp.kinked]
            kinked = torch.cat([w2k * self.b1[sp.kinked], w2k * self.w1[sp.kinked]]) @ on.reshape(len(sp.kinked), -1)
            torch.add(kinked.view(2, H, S, c1), base, out=body[:2])
        torch.mul(body[1], self.u[:c1], out=body[2])
        return BlockSplit(sp.sub, tab[0], tab[2], body[1], on_all, sp.kinked, on, sp.bands,
                          self._pairs(sp.bands, sp.sub, c0, c1) if sp.bands else None)

    def _buffer(self, numel: int) -> Tensor:
        if self._tables is None or self._tables.numel() < numel:
            self._tables = self.w1.new_empty(max(numel, 3 * numel // 2 if self._tables is not None else numel))
        return self._tables[:numel]

    def _pairs(self, bands: list, sub: int, c0: int, c1: int) -> Pairs:
        sb, first, end, unit = torch.tensor(bands).t()  # per band: sub-block, first and last + 1 distance, unit
        width = end - first
        count = width * sub
        rep = lambda t: torch.repeat_interleave(t, count)  # noqa: E731  (per band -> per pair)
        at = torch.arange(int(count.sum())) - rep(count.cumsum(0) - count)  # the pair's index in its band
        width = rep(width)
        row, dist, unit = rep(sb * sub) + at // width, rep(first) + at % width, rep(unit)
        x = self.w[c0:c1].index_select(0, row) * self.u.index_select(0, dist)
        act = torch.addcmul(self.b1.index_select(0, unit), self.w1.index_select(0, unit), x).clamp_(min=0)
        col = dist + (c1 - c0 - 1)
        return Pairs(row, col, col - row, dist, unit, x, act, self.w2.index_select(1, unit) * act)

    def fill(self, bs: BlockSplit, c0: int, c1: int, a: int, e: int, out: Tensor) -> Tensor:
        """The bias of the queries c0 .. c1-1 over the reversed keys a .. e-1 of the first c1, written into
        ``out (H, n, m + n - 1)`` in skewed coordinates (column c: distance a + 1 - n + c; the block's tables
        ``bs`` from column a on); the gaps between the rows get values of no use. Returns the (H, n, m) view."""
        n, m, H = c1 - c0, e - a, self.H
        width, S = m + n - 1, n // bs.sub
        cols = slice(a, a + width)
        torch.addcmul(bs.const[:, :, None, cols], self.w[c0:c1].view(S, bs.sub, 1), bs.su[:, :, None, cols],
                      out=out.view(H, S, bs.sub, width))
        if bs.pairs is not None:  # (scatter_add_ in one dimension: ~4x faster than index_add_ along the second)
            sel, at = bs.pairs.tile(a, e, width)
            at = at + torch.arange(0, H * n * width, n * width)[:, None]  # (H, P'): per head
            out.view(-1).scatter_add_(0, at.view(-1), bs.pairs.bias.index_select(1, sel).view(-1))
        return out.as_strided((H, n, m), (n * width, width + 1, 1), out.storage_offset())


def _sub_rows(n: int, c1: int) -> int:
    """Rows per sub-block of a block of n queries over c1 keys: :data:`SUB`, doubled while c1 exceeds 64 times it
    (the tables cost S c1 per head, the bands n P / S with P about the same at every c1: at L = 8,192 blocks
    over more keys take fewer sub-blocks); n where that does not divide n."""
    sub = SUB
    while 2 * sub <= n and c1 > 64 * sub:
        sub *= 2
    return sub if n % sub == 0 else n


def _distance_states(k64: Tensor, xlo: Tensor, xhi: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per unit (rows of ``k64 = (W1, b1)``), sub-block and distance, from the ranges ``[xlo, xhi] (S, c1)`` of x:
    ``on (K', S, c1)``, the unit on over the whole range and outside its band, and the band ``first .. end - 1``
    (K', S), the hull of the distances where its kink is inside (``first >= end``: none)."""
    states = _states(k64, xlo, xhi)  # (K', S, c1)
    mixed = states == 1
    d = torch.arange(xlo.shape[1])
    first, end = torch.where(mixed, d, xlo.shape[1]).amin(2), torch.where(mixed, d, -1).amax(2) + 1
    return (states == 2) & ~((d >= first[..., None]) & (d < end[..., None])), first, end


def _sorted_states(k64: Tensor, xlo: Tensor, xhi: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_distance_states` when the rows of xlo and xhi are non-decreasing in d: a unit is on where x is
    past its kink ``t = -b1 / W1`` (W1 > 0) or before it (W1 < 0), so over the distances it is off, kinked, on
    (or on, kinked, off): two bisections per unit and sub-block give the band, none is needed per distance.
    Returns ``up (K', 1)`` (W1 > 0) and the bands ``first, end (K', S)``; ``on`` is :func:`_on_between`."""
    t = (-k64[1] / k64[0]).expand(xlo.shape[0], -1).contiguous()  # (S, K'); kinked units have W1 != 0
    up = (k64[0] > 0)[:, None]  # (K', 1)
    lo_r, hi_r = (torch.searchsorted(x, t, right=True).t().contiguous() for x in (xlo, xhi))
    lo_l, hi_l = (torch.searchsorted(x, t).t().contiguous() for x in (xlo, xhi))
    # W1 > 0: on where xlo > t (d >= lo_r), off where xhi <= t (d < hi_r); W1 < 0: on where xhi < t (d < hi_l)
    return up, torch.where(up, hi_r, hi_l), torch.where(up, lo_r, lo_l)


def _on_between(up: Tensor, first: Tensor, end: Tensor, c1: int) -> Tensor:
    """``on (K', S, c1)`` of :func:`_sorted_states`' units: past the band where W1 > 0, before it where W1 < 0."""
    d = torch.arange(c1)
    return torch.where(up[..., None], d >= end[..., None], d < first[..., None])


def _states(k64: Tensor, lo, hi) -> Tensor:
    """Per unit (rows of ``k64 = (W1, b1)``) and x range ``[lo, hi]`` (scalars or (c1,)): 2 on over the whole
    range, 0 off (both ends <= 0: the pre-activation is linear), 1 with its kink inside."""
    lo, hi = torch.as_tensor(lo, dtype=k64.dtype), torch.as_tensor(hi, dtype=k64.dtype)
    w1, b1 = k64[0].reshape(-1, *([1] * lo.dim())), k64[1].reshape(-1, *([1] * lo.dim()))
    return (w1 * lo + b1 > 0).to(torch.uint8) + (w1 * hi + b1 > 0).to(torch.uint8)


class _MlpBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, u, w, w1, b1, w2, b2, scale, block, score_tile):
        assert FLASH is not None  # the flash path is taken only where torch has the kernel
        B, H, L, _ = q.shape
        plan = _Plan(u, w, (w1, b1, w2, b2), L, q.dtype)
        kr, vr = k.flip(-2), v.flip(-2)
        outs, lses, splits = [], [], []
        bufs: dict[tuple, Tensor] = {}
        for c0, c1 in query_blocks(L, block):
            split = plan.split(c0, c1)
            splits.append(split.kept())
            parts, bs = [], plan.block(c0, c1, split)
            for a in range(0, c1, score_tile):
                e, n = min(c1, a + score_tile), c1 - c0
                bias = plan.fill(bs, c0, c1, a, e, _buffer(bufs, (H, n, e - a), q).view(H, n, e - a + n - 1))
                keys = slice(L - c1 + a, L - c1 + e)
                parts.append(FLASH(q[:, :, c0:c1], kr[:, :, keys], vr[:, :, keys], 0.0, False,
                                   attn_mask=bias.unsqueeze(0).expand(B, *bias.shape), scale=scale)[:2])
            o, lse = _merge(parts)
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, kr, vr, u, w, w1, b1, w2, b2, out, lse)
        ctx.scale, ctx.block, ctx.score_tile, ctx.splits = scale, block, score_tile, splits
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, kr, vr, u, w, w1, b1, w2, b2, out, lse = ctx.saved_tensors
        B, H, L, D = q.shape
        plan = _Plan(u, w, (w1, b1, w2, b2), L, q.dtype)
        acc = _Moments(plan, L)
        grads = TileGrads(q, kr, vr, dout.contiguous(), out, lse, ctx.scale)
        bufs: dict[tuple, Tensor] = {}
        for (c0, c1), split in zip(query_blocks(L, ctx.block), ctx.splits):
            bs = plan.block(c0, c1, split)
            acc.start(bs, c0, c1)
            for a in range(0, c1, ctx.score_tile):
                e = min(c1, a + ctx.score_tile)
                n, m = c1 - c0, e - a
                flat = _buffer(bufs, (B, H, n, m), q)
                plan.fill(bs, c0, c1, a, e, flat[0].view(H, n, m + n - 1))
                if B > 1:
                    flat[1:].copy_(flat[:1].expand_as(flat[1:]))
                grads.skewed_tile(flat, c0, c1, a, e)
                acc.add((flat.sum(0) if B > 1 else flat[0]).view(H, n, m + n - 1), a)
            acc.finish()
        dq, dk, dv = grads.result()
        du, dw, dw1, db1, dw2, db2 = acc.result()
        du_full = torch.zeros_like(u)
        du_full[:L] = du.to(u.dtype)
        return (dq, dk.flip(-2), dv.flip(-2), du_full, dw.to(w.dtype), dw1.to(w1.dtype), db1.to(b1.dtype),
                dw2.to(w2.dtype), db2.to(b2.dtype), None, None, None)


def _buffer(bufs: dict[tuple, Tensor], shape: tuple, like: Tensor) -> Tensor:
    """A skewed ``(*lead, n (m + n - 1))`` buffer for a tile of n queries by m keys (``shape = (*lead, n, m)``),
    one per shape and call (its contents written by :meth:`_Plan.fill` before every use)."""
    *lead, n, m = shape
    if shape not in bufs:
        bufs[shape] = like.new_empty(*lead, n * (m + n - 1))
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
    """The backward's sums over the tiles, from which every parameter's gradient follows (module docstring).
    Per block, the sums of dS and dS w along each distance per sub-block (``cols``) and dS at the band pairs; at
    the block's end, per head the sums of dS (``g1``) and dS x (via ``onx``) where each unit is folded in as on,
    the band units' sums of dS relu(...) (``inr``) and of ``Y_k [active] (1, x)`` with ``Y_k = sum_h W2[h, k]
    dS``; and ``u``'s and ``w``'s gradients from ``dx = sum_h f_h'(x) dS`` per pair."""

    def __init__(self, plan: _Plan, L: int):
        self.plan = plan
        H, K = plan.w2.shape
        z = lambda *s: plan.u.new_zeros(*s)  # noqa: E731
        self.g1, self.on1, self.onx, self.inr = z(H), z(H, K), z(H, K), z(H, K)
        self.y1, self.yx, self.du, self.dw = z(K), z(K), z(L), z(L)

    def start(self, bs: BlockSplit, c0: int, c1: int) -> None:
        n, S = c1 - c0, bs.const.shape[1]
        self.bs, self.c0, self.c1, self.wr = bs, c0, c1, self.plan.w[c0:c1]
        self.rows = torch.stack([torch.ones_like(self.wr), self.wr]).view(2, S, bs.sub).transpose(0, 1)  # (S, 2, sub)
        self.cols = self.plan.u.new_zeros(self.plan.H, S, 2, c1 + n - 1)
        self.band = None if bs.pairs is None else torch.zeros_like(bs.pairs.bias)

    def add(self, ds: Tensor, a: int) -> None:
        """``ds (H, n, m + n - 1)``: a tile's dS (summed over the batch) in skewed coordinates, the tables' column
        a + c at column c, zero outside the tile's pairs."""
        bs, (H, n, width) = self.bs, ds.shape
        per = ds.view(H, -1, bs.sub, width)  # (H, S, sub, width)
        self.cols[..., a: a + width] += torch.matmul(self.rows, per)
        # as (.., 1, width) @ (.., width, sub): the (.., sub, width) @ (.., width, 1) form takes ~8x longer on CPU
        self.dw[self.c0:self.c1] += (bs.su[:, :, None, a: a + width] @ per.transpose(-1, -2)).sum(0).view(n)
        if bs.pairs is not None:  # each pair in one tile
            assert self.band is not None  # made with the pairs
            sel, at = bs.pairs.tile(a, a + width - n + 1, width)
            self.band.index_copy_(1, sel, ds.view(H, -1).index_select(1, at))

    def finish(self) -> None:
        """The block's share of every sum, from its sums along each distance and at the band pairs."""
        plan, bs, n, H = self.plan, self.bs, self.c1 - self.c0, self.plan.H
        s1, swu = self.cols[:, :, 0, n - 1:], self.cols[:, :, 1, n - 1:] * plan.u[:self.c1]  # distances 0 .. c1 - 1
        t1, tx = s1.sum((1, 2)), swu.sum((1, 2))
        self.g1 += t1
        self.on1.addr_(t1, bs.on_all)
        self.onx.addr_(tx, bs.on_all)
        if bs.on is not None:
            on = bs.on.reshape(len(bs.kinked), -1).t()
            self.on1.index_add_(1, bs.kinked, s1.reshape(H, -1) @ on)
            self.onx.index_add_(1, bs.kinked, swu.reshape(H, -1) @ on)
        self.du[:self.c1] += (bs.slope * self.cols[:, :, 1, n - 1:]).sum((0, 1))
        if bs.pairs is not None:
            self._band(bs.pairs)

    def _band(self, pr: Pairs) -> None:
        plan, ds = self.plan, self.band  # (H, P)
        assert ds is not None  # made with the pairs
        self.inr.index_add_(1, pr.unit, ds * pr.act)
        ym = (ds * plan.w2[:, pr.unit]).sum(0).mul_(pr.act > 0)  # (P,)
        self.y1.index_add_(0, pr.unit, ym)
        self.yx.index_add_(0, pr.unit, ym * pr.x)
        dx = ym.mul_(plan.w1[pr.unit])
        self.du.index_add_(0, pr.dist, dx * self.wr[pr.row])
        self.dw.index_add_(0, self.c0 + pr.row, dx * plan.u[pr.dist])

    def result(self):
        """Gradients of u, w (in the compute dtype) and of W1, b1 (K,), W2 (H, K), b2 (H,)."""
        p = self.plan
        dw2 = self.onx * p.w1 + self.on1 * p.b1 + self.inr
        dw1 = (p.w2 * self.onx).sum(0) + self.yx
        db1 = (p.w2 * self.on1).sum(0) + self.y1
        return self.du, self.dw, dw1, db1, dw2, self.g1
