"""Biases in the general forward: float64 per-token coordinates continuing the cache's, distance tables,
and the rows of bias a block of queries reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from pedsl.compiler.general.masks import coordinate_differences, pair_distances
from pedsl.compiler.general.inputs import AXIS_BIAS, F64, LINEAR_BIAS, Layout, QUERY_BIAS, TABLE_BIAS, last_tokens
from pedsl.compiler.general.cache import stored
from pedsl.compiler.general.values import TokenValues

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import SchemeSide

# <embedded>
# ---------------------------------------------------------------------- bias
class Biases(NamedTuple):
    coord: Tensor | None  # (B, H, L) float64: b(i, j) = c_i - c_j summed over the coordinate biases
    tables: list  # indices of the distance-table biases
    gates: dict  # bias index -> the running log-gate sums to keep in the cache
    queries: tuple = ()  # indices of the biases that read the query position (QUERY_BIAS)
    axial: tuple = ()  # indices of the biases over per-axis distances (AXIS_BIAS)


def biases(scheme: SchemeSide, vals: TokenValues, lay: Layout, cache) -> Biases:
    """Float64 coordinates of the L new tokens (gate sums continue the cache's) and the table biases."""
    B, L = lay.valid.shape
    coord: Tensor | None = None
    tables: list[int] = []
    queries: list[int] = []
    axial: list[int] = []
    gates: dict[int, Tensor] = {}
    for i, (kind, raw) in enumerate(vals.biases):
        if kind in (TABLE_BIAS, QUERY_BIAS, AXIS_BIAS):
            {TABLE_BIAS: tables, QUERY_BIAS: queries, AXIS_BIAS: axial}[kind].append(i)
            continue
        if kind == LINEAR_BIAS:
            c = raw.to(F64)[None, :, None] * lay.positions.to(F64)[:, None, :]  # (B, H, L): s (p_i - p_j)
        else:
            lg = last_tokens(raw, L, -1).to(F64) * lay.valid[:, None, :]
            c = torch.cumsum(lg, dim=-1)
            prev = cache.gates.get(i) if cache is not None else None
            if prev is not None:
                c = c + prev.unsqueeze(-1)
            gates[i] = c[..., -1]
            c = c.expand(B, scheme.heads, L)
        coord = c if coord is None else coord + c
    return Biases(coord, tables, gates, tuple(queries), tuple(axial))


def distance_tables(scheme: SchemeSide, tables, qpos, kpos) -> dict:
    """The distance-table biases over every distance of the call, (H, top) float64 each: computed once per
    call (O(H L)), then gathered per block of queries."""
    if not tables:
        return {}
    top = run_length(qpos, kpos)
    return {i: scheme.distance_table(i, top, kpos.device) for i in tables}


def axis_rows(lay: Layout) -> Tensor:
    """(B, A, L): the call's tokens' positions along each axis (one axis: the positions)."""
    return lay.positions[:, None] if lay.axes_pos is None else lay.axes_pos.permute(0, 2, 1)


def key_axis_rows(cache, lay: Layout, kpos: Tensor) -> Tensor:
    """(B, A, keys): every key's positions along each axis, the cache's then this call's (after all_keys)."""
    if lay.axes_pos is None:
        return kpos[:, None]
    return axis_rows(lay) if cache is None else stored(cache, "axes", kpos.shape[1])


def run_length(qpos, kpos) -> int:
    """The call's run-time length ``n`` as the reference reads it: the span of positions from the first
    key to the last query, plus one (one fresh sequence: its length)."""
    return int((qpos.max() - kpos.min()).clamp(min=0)) + 1 if qpos.numel() and kpos.numel() else 1


def bias_rows(scheme: SchemeSide, tables, coord_q, kcoord, qpos, kpos, dtype, queries=(), axial=(), qax=None, kax=None,
              n_run: int | None = None):
    """Float64 biases (B, H, rows, Lk) of a block of queries, cast to ``dtype`` at the end (``tables``: the
    distance tables of :func:`distance_tables`; ``queries``: the biases that read the query position,
    evaluated here at the block's query positions, with the call's run-time length ``n_run``; ``axial``: the
    biases over per-axis distances, evaluated at the block's (query, key) pairs from their per-axis
    positions ``qax (B, A, rows)``, ``kax (B, A, Lk)``)."""
    bias = None
    if kcoord is not None:
        bias = coordinate_differences(scheme, coord_q, kcoord, qpos, kpos)
    if axial:
        d = (qax[..., :, None] - kax[..., None, :]).permute(0, 2, 3, 1)  # (B, rows, Lk, A): i_a - j_a
        for i in axial:
            full = scheme.axis_table(i, d, qpos)
            bias = full if bias is None else bias + full
    if tables or queries:
        dist = pair_distances(scheme, qpos, kpos)  # (B, rows, Lk)
        for tab in tables.values():  # (H, top) float64
            full = tab[:, dist].permute(1, 0, 2, 3)  # (B, H, rows, Lk)
            bias = full if bias is None else bias + full
        top = int(dist.max()) + 1 if dist.numel() else 1
        for i in queries:  # (B|1, H, rows, top) at the block's query positions, gathered at each key's distance
            tab = scheme.query_table(i, qpos, top, kpos.device, n_run)
            B, H = dist.shape[0], tab.shape[1]
            full = torch.gather(tab.expand(B, H, *tab.shape[2:]), 3, dist[:, None].expand(B, H, *dist.shape[1:]))
            bias = full if bias is None else bias + full
    return None if bias is None else bias.to(dtype)
# </embedded>
