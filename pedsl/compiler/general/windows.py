"""Sliding windows and chunks in the general forward: the :class:`Shape` of a scheme's visibility, which
keys a query sees, where each block of queries starts reading keys, and the trimming of the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from pedsl.compiler.general.masks import symmetric_window
from pedsl.compiler.general.inputs import Layout
from pedsl.compiler.general.cache import AttentionCache, path_flush, stored, token_axis

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import WindowSide

# <embedded>
# ---------------------------------------------------------------------- windows
RANK = 1 << 40  # windows: a document's rank times this plus a position orders a row's keys (positions < 2^40)


class Shape(NamedTuple):
    """The attention's shape (docs/semantics.md §11): key j is visible to query i iff
    ``0 <= p_i - p_j < window`` (sliding) or ``p_i // chunk == p_j // chunk`` (chunked), or
    ``p_j < keep`` (``keep_first``: StreamingLLM's sinks), inside the causal, document and padding masks."""

    window: int | None
    chunk: int | None
    symmetric: bool = False  # a non-causal mask: the window reaches both ways, |p_i - p_j| < window
    keep: int | None = None  # keep_first: the keys at the positions below it stay visible beside the band

    def chunk_size(self) -> int:
        """The chunk of a shape without a window (:func:`shape_of` makes none with neither)."""
        if self.chunk is None:
            raise ValueError("an attention shape has a window or a chunk")
        return self.chunk


def shape_of(scheme: WindowSide) -> Shape | None:
    w, c = scheme.window, scheme.chunk
    return None if w is None and c is None else Shape(w, c, symmetric_window(scheme), scheme.keep_first)


def visible(shape: Shape, qpos: Tensor, kpos: Tensor) -> Tensor:
    """(B, rows, keys) bool: the keys at ``kpos (B, keys)`` the window lets the queries at ``qpos (B, rows)`` see."""
    return visible_pairs(shape, qpos[:, :, None], kpos[:, None, :])


def visible_pairs(shape: Shape, qpos: Tensor, kpos: Tensor) -> Tensor:
    """Whether the window lets a query at ``qpos`` see a key at ``kpos`` (broadcast against each other)."""
    if shape.window is not None:
        band = ((qpos - kpos).abs() if shape.symmetric else qpos - kpos) < shape.window
    else:
        chunk = shape.chunk_size()
        band = torch.div(qpos, chunk, rounding_mode="floor") == torch.div(kpos, chunk, rounding_mode="floor")
    return band if shape.keep is None else band | (kpos < shape.keep)


def key_starts(shape: Shape, lay: Layout, kpos: Tensor, kdoc: Tensor, kvalid, Lq: int, block: int) -> list:
    """The first key any query of each block of ``block`` queries can see (an index into the keys).

    The keys of a row are ordered by ``rank(document) * RANK + position`` (a running maximum over
    the valid ones, so padding keeps the order); a query sees no key whose order is below its own
    document's rank plus the lowest position its window reaches, so a binary search bounds the span."""
    B, Lk = kpos.shape
    if shape.keep is not None:  # the first keys of every document stay visible: each block reads from the first
        return [0] * -(-Lq // block)
    rank = torch.zeros_like(kpos)
    if Lk > 1:
        rank[:, 1:] = torch.cumsum((kdoc[:, 1:] != kdoc[:, :-1]).long(), dim=1)
    order = rank * RANK + kpos
    if kvalid is not None:
        order = torch.where(kvalid, order, torch.full_like(order, -(1 << 62)))
    order = torch.cummax(order, dim=1).values
    L = lay.positions.shape[1]
    qp = lay.positions[:, L - Lq:]
    low = qp - (shape.window - 1) if shape.window is not None else torch.div(
        qp, shape.chunk_size(), rounding_mode="floor") * shape.chunk_size()
    lo = torch.searchsorted(order.contiguous(), (rank[:, Lk - Lq:] * RANK + low).contiguous())  # (B, Lq)
    nb = -(-Lq // block)
    pad = nb * block - Lq
    if pad:
        lo = torch.cat([lo, lo.new_full((B, pad), Lk)], dim=1)
    return lo.view(B, nb, block).amin(dim=(0, 2)).tolist()


def trim_cache(cache: AttentionCache, shape: Shape) -> None:
    """Drop the cached tokens no later query can see (before the first one a future query of the row's
    document could see, in every row), once there are at least ``max(64, width)`` of them: the
    cache then holds at most about twice the window (or chunk), however long decoding goes."""
    Lc = cache.length
    ends = cache.row_ends()
    if not Lc or ends is None:
        return
    pos, doc, valid = (stored(cache, n, Lc) for n in ("pos", "doc", "valid"))
    last, ldoc = ends[0][:, None], ends[1][:, None]
    if shape.window is not None:
        alive = pos > last - shape.window
    else:
        chunk = shape.chunk_size()
        alive = torch.div(pos, chunk, rounding_mode="floor") == torch.div(last, chunk, rounding_mode="floor")
    if shape.keep is not None:  # the first keys stay: nothing before them is dropped
        alive = alive | (pos < shape.keep)
    alive = alive & (doc == ldoc) & valid
    first = torch.where(alive.any(1), alive.long().argmax(1), torch.full_like(ends[0], Lc))
    d = int(first.min())
    if d < max(64, shape.window or shape.chunk_size()):
        return
    path_flush(cache, cache.path_flushed or 0, cache.path_pending)  # PaTH: every kept key up to date
    keep = Lc - d
    for name, b in cache._buf.items():
        ax = token_axis(b)
        b.narrow(ax, 0, keep).copy_(b.narrow(ax, d, keep).clone())
    cache.length = keep
    cache.dropped += d
# </embedded>
