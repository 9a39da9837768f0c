"""The layout of a call's inputs: the transport and bias kinds, InputError, and the positions, documents,
validity and attention masks every later step of the general forward reads (:class:`Layout`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from pedsl.compiler.general.masks import span_ids_refusal, span_keys, split_span_refusal

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.mask_side import MaskSide

# <embedded>
# ---------------------------------------------------------------------- inputs
F64 = torch.float64
ROPE, SO2, HOUSEHOLDER = "rope-table", "accumulated-so2", "householder"  # transport kinds
DENSE = "dense-rotation"  # q, k rotated by R(p) = P^T expm(sum_a p_a A_a) P (general.dense)
TABLE_BIAS, LINEAR_BIAS, GATE_BIAS = "distance-table", "linear-distance", "forget-gate"  # bias kinds
QUERY_BIAS = "query-table"  # a distance table that reads the query position too: evaluated per block of queries
AXIS_BIAS = "axis-distance"  # a term over per-axis distances i_a - j_a: evaluated per block of (query, key) pairs


class InputError(ValueError):
    """Inputs that do not fit the call (shapes, masks, positions, the cache), with a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """Rotation angles (|A| < 2 pi) stay in float32 for half-precision inputs (bfloat16 keeps ~0.03 rad)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def last_tokens(t: Tensor, n: int, dim: int = -2) -> Tensor:
    """The last n entries of the token axis ``dim`` (a size-1 axis broadcasts and stays)."""
    return t if t.shape[dim] == 1 else t.narrow(dim, t.shape[dim] - n, n)


class Layout(NamedTuple):
    positions: Tensor  # (B, L) long
    docs: Tensor  # (B, L) long
    valid: Tensor  # (B, L) bool: False for padding
    padded: bool
    key_valid_cached: Tensor | None  # (B, Lc) bool from a (B, Lc + L) mask (this call only)
    mask4: Tensor | None  # (B|1, 1|Hq, Lq, Lc + L) bool
    n: int  # the run-time length: max position + 1
    axes_pos: Tensor | None = None  # (B, L, A) long: the per-axis positions of a scheme with A > 1 axes
    spans: Tensor | None = None  # (B, L) long: each token's span key (pedsl.compiler.general.masks), None: no spans


def bool_mask(m: Tensor) -> Tensor:
    """The boolean form of a mask (True = attend)."""
    if m.dtype == torch.bool:
        return m
    if not m.is_floating_point():
        return m != 0
    neg = (m == float("-inf")) | (m <= torch.finfo(m.dtype).min / 2)
    if not bool(((m == 0) | neg).all()):
        raise InputError("attn_mask: a float mask must hold only 0 (attend) and -inf or the dtype's minimum "
                         "(masked); other values would be a bias",
                         "pass a boolean mask (True = attend); biases come from the scheme")
    return ~neg


def int_arg(name: str, t, B: int, L: int, device) -> Tensor:
    if not isinstance(t, Tensor) or t.shape != (B, L) or t.is_floating_point() or t.is_complex():
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise InputError(f"{name} must be an integer tensor (B, L) = ({B}, {L}) for the L tokens of k and v, "
                         f"got {got}" + (f" of {t.dtype}" if isinstance(t, Tensor) else ""),
                         f"one {name[:-1] if name.endswith('s') else name} per key/value token")
    return t.to(device=device, dtype=torch.long)


def _split_mask(attn_mask, heads: int, B: int, L: int, Lq: int, Lc: int, device):
    """(valid (B, L), key_valid_cached (B, Lc) | None, mask4 | None) from the attn_mask of a call."""
    total = Lc + L
    valid = torch.ones(B, L, dtype=torch.bool, device=device)
    if attn_mask is None:
        return valid, None, None
    if not isinstance(attn_mask, Tensor):
        raise InputError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    m = bool_mask(attn_mask.to(device))
    if m.dim() == 2 and m.shape == (B, L):
        return m, None, None
    if m.dim() == 2 and m.shape == (B, total):
        return m[:, Lc:], m[:, :Lc], None
    if m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, heads) and m.shape[2:] == (Lq, total):
        return valid, None, m
    raise InputError(
        f"attn_mask has shape {tuple(attn_mask.shape)}; it must be a padding mask (B, L) = ({B}, {L}) or "
        f"(B, cached + L) = ({B}, {total}), or an attention mask (B, 1|H, Lq, cached + L) = "
        f"({B}, 1|{heads}, {Lq}, {total})", "True (or 0.0) = attend")


def axis_positions(positions, axes: tuple, B: int, L: int, device) -> tuple[Tensor, Tensor | None]:
    """The one-axis positions (B, L) of a call (the largest over the axes) and, for a scheme with A > 1
    axes, its per-axis positions (B, L, A), from ``positions (A, B, L)``; one axis also takes (B, L)."""
    A = max(1, len(axes))
    if A == 1 and not (isinstance(positions, Tensor) and positions.dim() == 3):
        return int_arg("positions", positions, B, L, device), None
    named = f"{A} position axes ({', '.join(axes)})" if axes else "one position axis"
    if (not isinstance(positions, Tensor) or positions.shape != (A, B, L) or positions.is_floating_point()
            or positions.is_complex()):
        got = (f"{tuple(positions.shape)} of {positions.dtype}" if isinstance(positions, Tensor)
               else type(positions).__name__)
        raise InputError(f"positions: the scheme has {named}, so positions must be an integer tensor "
                         f"(A, B, L) = ({A}, {B}, {L}) (Hugging Face's layout of multi-axis position_ids), got {got}",
                         f"row a holds every token's position along the a-th axis; text alone has every axis "
                         f"the same: positions.expand({A}, {B}, {L})")
    per_axis = positions.to(device=device, dtype=torch.long)
    if A == 1:
        return per_axis[0], None
    return per_axis.max(0).values, per_axis.permute(1, 2, 0)


def layout(heads: int, B: int, L: int, Lq: int, positions, document_ids, attn_mask, cache, device,
           axes: tuple = (), scheme: MaskSide | None = None, span_ids=None) -> Layout:
    """Positions, documents, validity and masks of the L tokens of a call, continuing the cache; the span keys
    of the ``scheme``'s mask (``span_ids``: the call's, for ``mask = spans``)."""
    lay = _layout(heads, B, L, Lq, positions, document_ids, attn_mask, cache, device, axes)
    if len(axes) > 1 and lay.axes_pos is None:  # every axis at the one-axis position (text, decoding)
        lay = lay._replace(axes_pos=lay.positions[..., None].expand(B, L, len(axes)))
    if scheme is None:
        return lay
    refused = span_ids_refusal(scheme, span_ids)
    if refused is not None:
        raise InputError(*refused)
    ids = None if span_ids is None else int_arg("span_ids", span_ids, B, L, device)
    lay = lay._replace(spans=span_keys(scheme, lay.positions, lay.valid, ids))
    if lay.spans is not None and cache is not None:
        check_spans_continue(cache, lay)
    return lay


def check_spans_continue(cache, lay: Layout) -> None:
    """Refuse a call whose tokens join a span some cached tokens are in (their outputs are returned already)."""
    if lay.spans is None or not cache.length:
        return
    if "span" in cache._buf:
        old = [cache.get(n) for n in ("span", "doc", "valid")]
    elif cache.raw is not None and cache.raw.get("spans") is not None:  # the reference backend: its raw inputs
        old = [cache.raw[n] for n in ("spans", "docs", "valid")]
    else:
        return
    refused = split_span_refusal(lay.spans, lay.docs, *old)
    if refused is not None:
        raise InputError(*refused)


def _layout(heads: int, B: int, L: int, Lq: int, positions, document_ids, attn_mask, cache, device,
            axes: tuple) -> Layout:
    Lc = cache.length if cache is not None else 0
    if (positions is None and document_ids is None and attn_mask is None and cache is not None
            and cache.last_pos is not None):  # decoding: the row's document and positions continue
        pos = (cache.last_pos + 1)[:, None] + torch.arange(L, device=device)
        cache._doc_view = cache.last_doc[:, None].expand(B, L)
        return Layout(pos, cache._doc_view, torch.ones(B, L, dtype=torch.bool, device=device),
                      False, None, None, int(pos.max()) + 1)
    if (cache is not None and cache.dropped and isinstance(attn_mask, Tensor) and attn_mask.dim() in (2, 4)
            and attn_mask.shape[-1] == cache.dropped + Lc + L):  # a mask over every token so far
        attn_mask = attn_mask[..., cache.dropped:]
    per_axis = None
    if positions is not None:
        positions, per_axis = axis_positions(positions, axes, B, L, device)
    valid, kv_cached, mask4 = _split_mask(attn_mask, heads, B, L, Lq, Lc, device)
    ends = None if cache is None else cache.row_ends()  # each row's last position and document so far
    if document_ids is None:
        docs = (ends[1].clone() if ends is not None else torch.zeros(B, dtype=torch.long, device=device))
        docs = docs[:, None].expand(B, L)
    else:
        docs = int_arg("document_ids", document_ids, B, L, device)
    # the previous unpadded token of each token (index in this call, -1: the cache's last one)
    lv = torch.cummax(torch.where(valid, torch.arange(L, device=device), -1), dim=1).values
    prev = torch.cat([lv.new_full((B, 1), -1), lv[:, :-1]], dim=1)
    inside = prev >= 0
    prev_c = prev.clamp(min=0)
    prev_doc = torch.gather(docs, 1, prev_c)
    prev_ok = inside.clone()
    if ends is not None:
        prev_doc = torch.where(inside, prev_doc, ends[1][:, None])
        prev_ok = inside | (ends[0] >= 0)[:, None]
    same = prev_ok & (prev_doc == docs)
    if positions is None:
        # index inside the document among unpadded tokens, continuing the cache's document
        c = torch.cumsum(valid.long(), dim=1)
        start = valid & ~same
        cm = torch.cummax(torch.where(start, c - 1, torch.full_like(c, -(1 << 40))), dim=1).values
        base0 = torch.zeros(B, dtype=torch.long, device=device)
        if ends is not None:
            last_pos, last_doc = ends
            has_prev = last_pos >= 0
            cont = has_prev & ((docs[:, 0] == last_doc) if L else has_prev)
            base0 = torch.where(cont, -(last_pos + 1), base0)
        pos = (c - 1 - torch.maximum(cm, base0[:, None])).clamp(min=0)
    else:
        pos = positions
        prev_pos = torch.gather(pos, 1, prev_c)
        if ends is not None:
            prev_pos = torch.where(inside, prev_pos, ends[0][:, None])
        bad = valid & same & (pos < prev_pos)
        if per_axis is None and bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise InputError(
                f"positions go backwards inside a document: row {b}, token {t} is at position {int(pos[b, t])} "
                f"after {int(prev_pos[b, t])}" + (" (the cache's last token)" if not bool(inside[b, t]) else ""),
                "a new sequence in the same row needs a new document_ids value (packed batches), "
                "and a new sequence needs a new cache")
    posv = pos[valid] if bool(valid.any()) else pos
    n = int(posv.max()) + 1 if posv.numel() else 1
    return Layout(pos, docs, valid, not bool(valid.all()), kv_cached, mask4, max(n, 1), per_axis)


def document_ids_vary(docs: Tensor) -> bool:
    return docs.shape[1] > 1 and bool((docs[:, 1:] != docs[:, :-1]).any())
# </embedded>
