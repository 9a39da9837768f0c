"""Which pairs of tokens see each other at run time: the scheme's ``mask`` (docs/semantics.md §11a), written
once for the general forward (:mod:`pedsl.compiler.general`) and every module ``pedsl compile`` writes, which
carries the text below the banner verbatim.

Every pair j <= i (token order, one document, neither padded) is visible; a mask other than ``causal`` shows a
query keys after it too: ``bidirectional`` every key, ``prefix`` (N) the keys of its span when both positions
are below N, ``spans`` the keys whose ``span_ids`` equal its own nonzero one. Prefix and spans become one thing
here: a span key per token (prefix: 1 below N, else 0; spans: the ids), pairs of one nonzero span key seeing
each other. With a non-causal mask a window is symmetric, ``|p_i - p_j| < window``, and a bias over distance
reads ``|p_i - p_j|`` (a linear one, ALiBi's ``slope * (p_i - p_j)``, becomes ``slope * |p_i - p_j|``).
Torch only; the refusals are returned as (message, hint), raised by the caller as its own input error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.mask_side import MaskSide

# <embedded>
# ---------------------------------------------------------------------------------------------
# Attention masks (pedsl.compiler.general.masks, copied verbatim): span keys, the pairs seen both ways,
# distances and linear biases of a non-causal mask, and the calls a mask refuses.
# ---------------------------------------------------------------------------------------------
MASK_SPAN_KINDS = ("prefix", "spans")  # the masks whose pairs seen both ways are spans of tokens


def mask_kind(scheme: MaskSide) -> str:
    """The scheme's mask: causal, bidirectional, prefix or spans."""
    return scheme.mask


def span_keys(scheme: MaskSide, positions: Tensor, valid: Tensor, span_ids: Tensor | None) -> Tensor | None:
    """(B, L) long: the span key of each new token (0: in no span; padding is in none), or None where the mask
    has no spans (causal, bidirectional). ``span_ids``: the call's ids (B, L) long, read by ``mask = spans``."""
    kind = mask_kind(scheme)
    if kind == "prefix":
        prefix = scheme.mask_prefix
        if prefix is None:
            raise ValueError("mask = prefix(N) has its N")
        return (positions < prefix).long() * valid
    if kind == "spans":
        return torch.zeros_like(positions) if span_ids is None else span_ids * valid
    return None


def span_ids_refusal(scheme: MaskSide, span_ids) -> tuple[str, str] | None:
    """Why the call's ``span_ids`` do not fit the scheme (only ``mask = spans`` reads them), or None."""
    if span_ids is None or mask_kind(scheme) == "spans":
        return None
    return (f"span_ids given, but the scheme's mask is {mask_kind(scheme)}: only mask = spans reads them",
            "drop span_ids, or give the scheme mask = spans")


def cache_refusal(scheme: MaskSide) -> tuple[str, str] | None:
    """Why the scheme cannot decode (a bidirectional mask: no output is final before the last token), or None."""
    if mask_kind(scheme) != "bidirectional":
        return None
    return ("the scheme's mask is bidirectional: every token sees the tokens after it, so no output is final "
            "before the last token and there is nothing to decode",
            "call the module on the whole sequence without a cache, or use mask = prefix(N) or spans")


def split_span_refusal(new_spans: Tensor, new_docs: Tensor, old_spans: Tensor, old_docs: Tensor,
                       old_valid: Tensor) -> tuple[str, str] | None:
    """Why a call continuing a cache would split a span (a new token in the span of a cached one, whose output
    was returned without it), or None. ``new_*`` (B, L) of the call, ``old_*`` (B, Lc) of the cache."""
    hit = ((new_spans[:, :, None] == old_spans[:, None, :]) & (new_spans[:, :, None] != 0)
           & (new_docs[:, :, None] == old_docs[:, None, :]) & old_valid[:, None, :])
    if not bool(hit.any()):
        return None
    return ("this call's tokens continue a span (a prefix, or tokens of one span id) whose earlier tokens are "
            "cached: their outputs were returned without the new tokens they should see",
            "give the whole span in one call (prefill the prefix at once), then decode the tokens after it")


def seen_both_ways(scheme: MaskSide, causal: Tensor | None, qspan: Tensor | None,
                   kspan: Tensor | None) -> Tensor | None:
    """The pairs a block of queries may see before documents, padding and windows: ``causal`` (1, 1, rows, Lk)
    (None: every key is at or before its query) widened by the mask; None where every pair is visible.
    ``qspan (B, rows)``, ``kspan (B, Lk)``: the span keys (:func:`span_keys`) of the block's queries and keys."""
    kind = mask_kind(scheme)
    if kind == "bidirectional" or causal is None:
        return None
    if kind not in MASK_SPAN_KINDS:
        return causal
    if qspan is None or kspan is None:
        raise ValueError("a spans mask needs the span keys of the block's queries and keys")
    same = qspan[:, :, None].eq(kspan[:, None, :]) & qspan.ne(0)[:, :, None]
    return causal | same[:, None]


def pair_distances(scheme: MaskSide, qpos: Tensor, kpos: Tensor) -> Tensor:
    """(B, rows, Lk): the distance a bias reads between the queries at ``qpos (B, rows)`` and the keys at
    ``kpos (B, Lk)``: ``p_i - p_j`` (0 where negative) with a causal mask, ``|p_i - p_j|`` otherwise."""
    d = qpos[:, :, None] - kpos[:, None, :]
    return d.clamp(min=0) if mask_kind(scheme) == "causal" else d.abs()


def coordinate_differences(scheme: MaskSide, cq: Tensor, ck: Tensor, qpos: Tensor, kpos: Tensor) -> Tensor:
    """(B, H, rows, Lk) float64 ``c_i - c_j`` of per-token coordinates ``cq (B, H, rows)``, ``ck (B, H, Lk)``. With
    a non-causal mask the coordinates are ``slope * p`` (the check refuses gates there), so the difference is
    taken the other way round where ``p_j > p_i``: ``slope * |p_i - p_j|``, ALiBi's encoder form."""
    d = cq.unsqueeze(-1) - ck.unsqueeze(-2)
    if mask_kind(scheme) == "causal":
        return d
    return torch.where((qpos[:, :, None] >= kpos[:, None, :])[:, None], d, -d)


def symmetric_window(scheme: MaskSide) -> bool:
    """Whether a window reaches both ways, ``|p_i - p_j| < window`` (a non-causal mask)."""
    return mask_kind(scheme) != "causal"
# </embedded>
