"""Content-position terms in the general forward (``relative = shaw / transformer_xl / deberta``, docs/semantics.md
§3b): per call the position tables (and, for DeBERTa's p2c, the keys times the query table), per block of queries
the query times the key table, each gathered at its pair's row index. Nothing of size (B, H, L, L) beyond one
block of queries, and never a (rows, keys, head_dim) tensor: the tables have few rows (Shaw's 2K + 1, DeBERTa's
2 buckets), or one row per distance of the call (Transformer-XL)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import SchemeSide

# <embedded>
# ---------------------------------------------------------------------- relative (content-position terms)
class RelativeCall(NamedTuple):
    keys: Tensor | None  # (H|1, rows, D): the table the queries read (Shaw: shared by the heads; None: no c2p)
    low: int  # the signed distance of row 0 (Transformer-XL: the call's least distance; else 0, rows by index)
    key_terms: Tensor | None  # (B, H, Lk, rows): k_j . Q[row] (DeBERTa's p2c), or None
    key_bias: Tensor | None  # (B, H, 1, Lk): u . k_j (Transformer-XL), or None
    query_bias: Tensor | None  # (1, H, 1, D): v, added to the queries reading the table (Transformer-XL), or None


def relative_terms(scheme: SchemeSide) -> tuple[str, int, int, int, bool, bool]:
    """The scheme's (kind, max_distance, dim, buckets, c2p, p2c); a scheme without them has no business here."""
    if scheme.relative is None:
        raise ValueError("the scheme has no content-position terms (relative = ...)")
    return scheme.relative


def learned_table(t: Tensor | None, name: str) -> Tensor:
    """A learned table the terms read; the module made it when it made the terms."""
    if t is None:
        raise ValueError(f"content-position terms without their learned {name}")
    return t


def relative_scale(scheme: SchemeSide, D: int) -> float:
    """The scale of every raw score: 1 / sqrt(D), DeBERTa's 1 / sqrt(D (1 + its terms))."""
    kind, _, _, _, c2p, p2c = relative_terms(scheme)
    factor = 1 + int(c2p) + int(p2c) if kind == "deberta" else 1
    return (D * factor) ** -0.5


def deberta_bucket(d: Tensor, buckets: int, max_distance: int) -> Tensor:
    """DeBERTa-v2's log bucket of the signed distance ``d`` (Hugging Face's ``make_log_bucket_position``, in
    float32 as it computes it): distances below buckets / 2 keep their value, longer ones are log-spaced up to
    max_distance, where they reach buckets - 1, and keep growing beyond (the caller clamps)."""
    mid = buckets // 2
    f = d.to(torch.float32)
    absd = torch.where((d < mid) & (d > -mid), torch.full_like(f, mid - 1), f.abs())
    denom = torch.log(torch.tensor((max_distance - 1) / mid, dtype=torch.float32, device=d.device))
    logd = torch.ceil(torch.log(absd / mid) / denom * (mid - 1)) + mid
    return torch.where(absd <= mid, f, logd * torch.sign(f)).long()


def relative_index(scheme: SchemeSide, d: Tensor, low: int) -> Tensor:
    """The table row each signed distance ``d = p_i - p_j`` reads: Shaw ``clip(j - i, -K, K) + K``, DeBERTa its
    bucket + buckets clamped to 0 .. 2 buckets - 1, Transformer-XL ``d - low``."""
    kind, K, _, buckets, _, _ = relative_terms(scheme)
    if kind == "shaw":
        return (-d).clamp(-K, K) + K
    if kind == "deberta":
        return (deberta_bucket(d, buckets, K) + buckets).clamp(0, 2 * buckets - 1)
    return d - low


def sinusoid_rows(d: Tensor, dim: int) -> Tensor:
    """Transformer-XL's position embedding of the distances ``d``: ``[sin(d w), cos(d w)]``, ``w_k =
    10000^(-2k / dim)``, in float64, (len(d), dim)."""
    w = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=d.device) / dim))
    a = d.to(torch.float64)[:, None] * w[None, :]
    return torch.cat([torch.sin(a), torch.cos(a)], dim=-1)


def relative_call(scheme: SchemeSide, q: Tensor, K: Tensor, qpos: Tensor, kpos: Tensor) -> RelativeCall:
    """What every block of the call reads: the key table (Transformer-XL's over the call's distances, from the
    query's least to its greatest), DeBERTa's p2c keys times the query table, Transformer-XL's u . k_j.
    ``K (B, Hk, Lk, D)`` every key; key heads are repeated to the query heads where they differ."""
    kind, _, dim, _, _, p2c = relative_terms(scheme)
    H, dt = q.shape[1], q.dtype
    if K.shape[1] != H:
        K = K.repeat_interleave(H // K.shape[1], dim=1)
    if kind == "shaw":
        return RelativeCall(learned_table(scheme.relative_keys, "keys").to(dt)[None], 0, None, None, None)
    if kind == "deberta":
        keys = scheme.relative_keys
        table = None if keys is None else keys.to(dt).transpose(0, 1)  # (H, rows, D)
        kq = None
        if p2c:
            queries = learned_table(scheme.relative_queries, "queries").to(dt).transpose(0, 1)
            kq = torch.einsum("bhjd,hsd->bhjs", K, queries)
        return RelativeCall(table, 0, kq, None, None)
    low = int((qpos.min() - kpos.max()).clamp(max=0)) if qpos.numel() and kpos.numel() else 0
    high = int((qpos.max() - kpos.min()).clamp(min=0)) if qpos.numel() and kpos.numel() else 0
    d = torch.arange(low, high + 1, device=q.device)
    proj = learned_table(scheme.relative_keys, "keys")  # W_R (dim, H, D)
    table = torch.einsum("se,ehd->hsd", sinusoid_rows(d, dim).to(proj.dtype), proj).to(dt)
    u, v = learned_table(scheme.relative_u, "u").to(dt), learned_table(scheme.relative_v, "v").to(dt)
    return RelativeCall(table, low, None, torch.einsum("hd,bhjd->bhj", u, K)[:, :, None], v[None, :, None])


def relative_rows(scheme: SchemeSide, rc: RelativeCall, q: Tensor, qpos: Tensor, kpos: Tensor, k0: int,
                  k1: int) -> Tensor:
    """The content-position terms of a block of queries ``q (B, H, rows, D)`` at ``qpos (B, rows)`` over the keys
    k0..k1 at ``kpos (B, Lk)``, before the scale: (B, H, rows, Lk). The query times every table row, gathered at
    each pair's row; DeBERTa's p2c (the keys times the table, computed once per call) likewise."""
    B, H, rows = q.shape[0], q.shape[1], q.shape[2]
    idx = relative_index(scheme, qpos[:, :, None] - kpos[:, None, :], rc.low)  # (B, rows, Lk)
    idx = idx[:, None].expand(B, H, rows, idx.shape[-1])
    out = q.new_zeros(B, H, rows, idx.shape[-1])
    if rc.keys is not None:
        qr = q if rc.query_bias is None else q + rc.query_bias
        out = out + torch.gather(qr @ rc.keys.transpose(-1, -2), 3, idx)
    if rc.key_terms is not None:  # k_j . Q[row(i, j)]: the keys' rows gathered, then (key, query) -> (query, key)
        out = out + torch.gather(rc.key_terms[:, :, k0:k1], 3, idx.transpose(2, 3)).transpose(2, 3)
    if rc.key_bias is not None:
        out = out + rc.key_bias[..., k0:k1]
    return out
# </embedded>
