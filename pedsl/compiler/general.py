"""The general forward of a compiled scheme, written once: positions, documents, padding and attention
masks, grouped-query attention, queries behind their keys, and the decoding cache.

This file needs nothing but torch and :mod:`pedsl.compiler.window_kernels` (the O(L N) banded
kernels of sliding windows and chunks, torch only too); in process ``banded_attention`` comes from
:mod:`pedsl.compiler.band_kernel` (a sliding window on its C++ kernel where it is built, ``window_kernels``
otherwise), while a generated module binds ``window_kernels``' own and keeps the flash path. ``SchemeAttention`` runs it (through
:mod:`pedsl.compiler.stream`) whenever a call is more than one full causal sequence at positions 0..L-1
with as many key/value heads as query heads (that case keeps the fused kernels of ``module.py``), and
``pedsl compile`` copies everything below the ``# ----`` banner of both verbatim into the module it
writes (a test checks the copy byte for byte). What a call means:

* k, v ``(B, Hkv, L, D)`` are L new tokens; q ``(B, Hq, Lq, D)`` are the queries of the *last* Lq
  of them (Lq <= L); with a cache, every cached token precedes them. ``Hq`` is a multiple of
  ``Hkv``: query head ``h`` reads key/value head ``h // (Hq / Hkv)`` (GQA / MQA). k and v stay at
  ``Hkv`` heads unless the scheme's transport differs per head (learned per-head angles, PaTH),
  which needs one transported key per query head.
* ``positions (B, L)``: integer positions, read by every position-indexed quantity (RoPE phases,
  distance biases, position-indexed steps, temperatures). Default: the index of the token inside
  its document, counting only unpadded tokens, continuing the cache.
  A scheme with ``axes a_1, ..., a_A`` (A > 1) takes ``positions (A, B, L)``, Hugging Face's layout of
  multi-axis ``position_ids``: ``position.a`` reads row a. Its one-axis position (the run-time length,
  where decoding continues) is the largest over the axes; without positions every axis reads the
  default above, so decoding after an image continues every axis at the largest position of the row's
  last token + 1 (HF's ``rope_deltas``). Positions may go back along an axis (rows of an image).
* ``document_ids (B, L)``: a token attends only inside its document; every accumulated quantity
  (cumulative angles, forget-gate sums, Householder products, short convolutions) restarts at a
  boundary. (Transports and gate sums between two tokens of one document only involve that
  document's steps, so they restart by construction; short convolutions are cut explicitly.)
* ``attn_mask``: boolean. ``(B, L)`` or ``(B, Lc + L)`` marks padding: a padded token does not
  exist - no query attends to it, its steps are the identity (angle 0, log-gate 0, beta 0) and
  short convolutions read zeros there - so a left-padded row equals the row unpadded. ``(B, 1|Hq,
  Lq, Lc + L)`` restricts attention only. An additive float mask of zeros and ``-inf`` (or the
  dtype's minimum) is read as the boolean ``mask == 0``. A query with no key left gives zeros.
* ``span_ids (B, L)``: integers, read by a scheme with ``mask = spans`` only (refused elsewhere): tokens
  sharing a nonzero id see each other both ways. A scheme's ``mask`` (bidirectional, prefix, spans;
  :mod:`pedsl.compiler.masking`, docs/semantics.md §11a) widens the causal mask per block of queries; a
  bidirectional scheme has no cache, and a call may not join a span some cached token is in.
* ``cache``: an :class:`AttentionCache` from ``module.new_cache(batch_size)``: it stores the keys
  as the scheme transports them to the newest token (RoPE family: rotated at their positions;
  accumulated SO(2): rotated by their cumulative angles; PaTH: moved through every later
  Householder step), the values (rotated when values are transported), the bias coordinates
  (ALiBi ``slope * position``, forget gates ``G_j = sum log f``, float64) and the running state
  (cumulative angles, gate sums, the last tokens' inputs for short convolutions). Prefill plus
  decoding equals one full forward, with one documented exception: a table that depends on the
  run-time length n (dynamic NTK; n = the largest position of the call + 1) rotates each key with
  the table in force when it was cached, as Hugging Face does, so past the original length a
  decoded sequence differs from one full forward of it (tested in test_compiler_stream.py).

Biases are differences of per-token float64 coordinates ``b(i, j) = c_i - c_j`` (the ALiBi and
forget-gate forms), formed per block of queries in float64 and only then cast to the compute dtype,
so a bfloat16 call is as exact as a hand-written bfloat16 bias.

What the scheme supplies (``scheme`` below; ``SchemeAttention``'s adapter in :mod:`pedsl.compiler.module_values`,
the generated class in a compiled module): ``heads``, ``head_dim``, ``axes`` (its position axes), ``conv_history`` (earlier tokens a
short convolution re-reads), ``transforms`` (records with ``kind``, ``values``, ``channels``,
``scale``), ``normalize`` and ``attend_current`` (softmax or stick-breaking weights), ``cope_max_pos`` (None, or
CoPE's positions, with its ``contextual_embedding``), ``token_values(window, dtype)`` (a :class:`TokenValues`) and ``distance_table(i, size,
device)`` (bias i over distances 0..size-1, ``(H, size)`` float64). The primitives (rotations,
cumulative sums of angles, the blockwise PaTH kernel, the Toeplitz kernel of distance tables) come as
``kernels``: :class:`TorchKernels` here, pedsl's fused ones in process.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from pedsl.compiler.band_kernel import banded_attention
from pedsl.compiler.masking import (cache_refusal, coordinate_differences, pair_distances, seen_both_ways,
                                    span_ids_refusal, span_keys, split_span_refusal, symmetric_window)
from pedsl.compiler.kernel_support import (bias_call, causal_call, explicit_scores, fresh_sequence_call, mlp_call, path_call,
                                           window_call)
from pedsl.compiler.remap_scores import RemappedKeys
from pedsl.compiler.scores import (modified_scores, normalised, own_key_counts, scale_by_temperature,
                                   sink_column)
from pedsl.ops.flash import flash_supports

# ---------------------------------------------------------------------------------------------
# The general forward (pedsl.compiler.general, copied verbatim). Steps: layout (positions,
# documents, validity, masks), window (the inputs the expressions read), transports (rotations and
# Householder steps, accumulated across calls), biases (float64 coordinates and distance tables),
# attend (blocks of queries, or PaTH's decode rule), cache update.
# ---------------------------------------------------------------------------------------------
F64 = torch.float64
TWO_PI = 2.0 * math.pi
ROPE, SO2, HOUSEHOLDER = "rope-table", "accumulated-so2", "householder"  # transport kinds
TABLE_BIAS, LINEAR_BIAS, GATE_BIAS = "distance-table", "linear-distance", "forget-gate"  # bias kinds
QUERY_BIAS = "query-table"  # a distance table that reads the query position too: evaluated per block of queries
AXIS_BIAS = "axis-distance"  # a term over per-axis distances i_a - j_a: evaluated per block of (query, key) pairs
QUERY_CHUNK = 256  # queries per block of explicit masks (memory: B * H * 256 * L_keys)
PATH_BLOCK = 64  # PaTH inside a window: steps per block of the windowed kernel
PATH_FLUSH = 32  # PaTH decoding: pending Householder steps applied to the cached keys every this many tokens
HARD_RESET = float("-inf")  # a log-gate that forgets everything before it (the PaTH kernel clamps it)
WINDOW_BLOCK = 128  # queries per block of a windowed call (keys per block: WINDOW_BLOCK + window - 1)
RANK = 1 << 40  # windows: a document's rank times this plus a position orders a row's keys (positions < 2^40)


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


# ---------------------------------------------------------------------- layout
class Layout(NamedTuple):
    positions: Tensor  # (B, L) long
    docs: Tensor  # (B, L) long
    valid: Tensor  # (B, L) bool: False for padding
    padded: bool
    key_valid_cached: Tensor | None  # (B, Lc) bool from a (B, Lc + L) mask (this call only)
    mask4: Tensor | None  # (B|1, 1|Hq, Lq, Lc + L) bool
    n: int  # the run-time length: max position + 1
    axes_pos: Tensor | None = None  # (B, L, A) long: the per-axis positions of a scheme with A > 1 axes
    spans: Tensor | None = None  # (B, L) long: each token's span key (pedsl.compiler.masking), None: no spans


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
           axes: tuple = (), scheme=None, span_ids=None) -> Layout:
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
    if not cache.length:
        return
    if "span" in cache._buf:
        old = [cached(cache, n, cache.length) for n in ("span", "doc", "valid")]
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
    has_prev = last_pos = last_doc = None
    if cache is not None and cache.last_pos is not None:
        has_prev = cache.last_pos >= 0
        last_pos, last_doc = cache.last_pos, cache.last_doc
    if document_ids is None:
        docs = (last_doc.clone() if last_doc is not None else torch.zeros(B, dtype=torch.long, device=device))
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
    if has_prev is not None:
        prev_doc = torch.where(inside, prev_doc, last_doc[:, None])
        prev_ok = inside | has_prev[:, None]
    same = prev_ok & (prev_doc == docs)
    if positions is None:
        # index inside the document among unpadded tokens, continuing the cache's document
        c = torch.cumsum(valid.long(), dim=1)
        start = valid & ~same
        cm = torch.cummax(torch.where(start, c - 1, torch.full_like(c, -(1 << 40))), dim=1).values
        base0 = torch.zeros(B, dtype=torch.long, device=device)
        if has_prev is not None:
            cont = has_prev & ((docs[:, 0] == last_doc) if L else has_prev)
            base0 = torch.where(cont, -(last_pos + 1), base0)
        pos = (c - 1 - torch.maximum(cm, base0[:, None])).clamp(min=0)
    else:
        pos = positions
        prev_pos = torch.gather(pos, 1, prev_c)
        if has_prev is not None:
            prev_pos = torch.where(inside, prev_pos, last_pos[:, None])
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


# ---------------------------------------------------------------------- the decoding cache
class AttentionCache:
    """What one attention layer keeps between decoding calls (see the module docstring).

    Create it with ``module.new_cache(batch_size)``; pass it as ``cache=`` to every call of that
    module (a prefill of any length, then one token or one chunk at a time). ``len(cache)`` is the
    number of cached tokens. Buffers grow by doubling, so appending costs O(new tokens).
    """

    def __init__(self, module, batch_size: int, scheme: str):
        refused = cache_refusal(module)
        if refused is not None:
            raise InputError(*refused)
        if int(batch_size) != batch_size or batch_size < 1:
            raise InputError(f"new_cache: batch_size must be a positive integer, got {batch_size!r}")
        self.scheme = scheme
        self.owner = id(module)
        self.batch_size = int(batch_size)
        self.length = 0
        self.heads_kv: int | None = None  # heads of the stored keys (Hkv, or Hq when transports differ per head)
        self._buf: dict[str, Tensor] = {}  # name -> buffer with the token axis last-but-one or last
        self.angles: dict[int, Tensor] = {}  # transform index -> (B, H|1, P) float64 running cumulative angles
        self.gates: dict[int, Tensor] = {}  # bias index -> (B, H) float64 running log-gate sums
        self.window: dict[str, Tensor | None] | None = None  # the last tokens' inputs (short convolutions)
        self.last_pos: Tensor | None = None  # (B,) position of the last unpadded token (-1: none yet)
        self.last_doc: Tensor | None = None  # (B,) its document
        self.raw: dict[str, Tensor | None] | None = None  # reference backend: every input so far
        self._doc_view = None  # the document ids layout() gave a continuing decoding call
        self.path_pending: Tensor | None = None  # PaTH: product of the steps since the last flush, (B*H, D, D)
        self.path_flushed: int | None = None  # PaTH: keys before this index wait for path_pending (None: none)
        self.centres: dict[int, int] = {}  # transform index -> xPos: the centre c its cached keys are scaled at
        self.one_doc = True  # every cached token of a row is in the row's current document
        self.all_valid = True  # no cached token is padding
        self.dropped = 0  # tokens a window or chunk no longer sees, dropped from the front

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"AttentionCache(scheme={self.scheme!r}, batch_size={self.batch_size}, length={self.length})"

    # buffers: token axis is dim 2 for (B, H, L, D) / (B, H, L), dim 1 for (B, L)
    def get(self, name: str) -> Tensor | None:
        return cached(self, name, self.length)

    def put(self, name: str, new: Tensor, old_len: int) -> None:
        """Write ``new`` (token axis as in the buffer) after the first ``old_len`` tokens."""
        ax = token_axis(new)
        n = new.shape[ax]
        b = self._buf.get(name)
        need = old_len + n
        if b is None or b.shape[ax] < need or b.dtype != new.dtype or b.device != new.device:
            cap = max(16, 1 << (need - 1).bit_length())
            shape = list(new.shape)
            shape[ax] = cap
            nb = torch.zeros(shape, dtype=new.dtype, device=new.device)
            if b is not None and old_len:
                nb.narrow(ax, 0, old_len).copy_(b.narrow(ax, 0, old_len))
            self._buf[name] = b = nb
        b.narrow(ax, old_len, n).copy_(new)


def token_axis(t: Tensor) -> int:
    return 1 if t.dim() == 2 else 2


def cached(cache: AttentionCache, name: str, n: int) -> Tensor | None:
    """The first n tokens of a cache buffer (a view), or None when the cache has no such buffer."""
    b = cache._buf.get(name)
    return None if b is None else b.narrow(token_axis(b), 0, n)


def append_layout(cache: AttentionCache, lay: Layout, v: Tensor, coord: Tensor | None) -> None:
    """Append this call's values, token layout and bias coordinates after the cached tokens."""
    Lc = cache.length
    cache.put("v", v.detach(), Lc)
    cache.put("pos", lay.positions, Lc)
    cache.put("doc", lay.docs, Lc)
    cache.put("valid", lay.valid, Lc)
    if lay.axes_pos is not None:  # (B, A, L): the per-axis positions a bias over distance.AXIS reads
        cache.put("axes", lay.axes_pos.permute(0, 2, 1), Lc)
    if coord is not None:
        cache.put("coord", coord.detach(), Lc)
    if lay.spans is not None:
        cache.put("span", lay.spans, Lc)


def check_cache(cache: AttentionCache, B: int, heads_kv: int) -> None:
    if cache.batch_size != B:
        raise InputError(f"cache: it was made for batch size {cache.batch_size}, this call has {B}",
                         "make one cache per sequence batch: module.new_cache(batch_size)")
    if cache.heads_kv is not None and cache.heads_kv != heads_kv:
        raise InputError(f"cache: it holds keys of {cache.heads_kv} heads, this call gives {heads_kv}",
                         "use the same number of key/value heads for every call with one cache")


def update_cache(cache: AttentionCache, lay: Layout, tr, bi, win, conv_history: int) -> None:
    """After a call (its keys and values are stored already): the running angles and gate sums, the
    last tokens' inputs, where each row stands (last position and document) and the length."""
    cache.angles.update({i: a.detach() for i, a in tr.angles.items()})
    cache.gates.update({i: g.detach() for i, g in bi.gates.items()})
    win.keep(cache, conv_history)
    B, L = lay.valid.shape
    if not lay.padded and cache.last_pos is not None and cache.one_doc and cache.all_valid and (
            lay.docs is cache._doc_view):  # decoding: the row's document continues, nothing padded
        cache.last_pos = lay.positions[:, -1]
        cache.length += L
        return
    cache.all_valid = cache.all_valid and not lay.padded
    first = cache.last_doc if cache.last_pos is not None else lay.docs[:, 0]
    cache.one_doc = cache.one_doc and bool((lay.docs == first[:, None]).all())
    advance_rows(cache, lay)


def advance_rows(cache: AttentionCache, lay: Layout) -> None:
    """Each row's last unpadded token (position and document) after the call; the cache's new length."""
    B, L = lay.valid.shape
    device = lay.valid.device
    if cache.last_pos is None:
        cache.last_pos = torch.full((B,), -1, dtype=torch.long, device=device)
        cache.last_doc = torch.zeros(B, dtype=torch.long, device=device)
    any_v = lay.valid.any(1)
    idx = torch.where(lay.valid, torch.arange(L, device=device), -1).max(1).values.clamp(min=0)
    cache.last_pos = torch.where(any_v, lay.positions.gather(1, idx[:, None])[:, 0], cache.last_pos)
    cache.last_doc = torch.where(any_v, lay.docs.gather(1, idx[:, None])[:, 0], cache.last_doc)
    cache.length += L


# ---------------------------------------------------------------------- window
class Window:
    """The inputs the expressions read: the cache's last tokens (short convolutions) then this call's.
    ``parts`` holds x, tokens, positions, docs and valid over ``Lw`` tokens (``L`` of them new)."""

    def __init__(self, lay: Layout, x, tokens, cache, device):
        self.L = lay.positions.shape[1]
        parts = dict(x=x, tokens=tokens, positions=lay.positions, docs=lay.docs, valid=lay.valid, axes_pos=lay.axes_pos)
        w = cache.window if cache is not None else None
        if w is not None and w["positions"].shape[1]:
            parts = {k: (None if v is None else torch.cat([w[k].to(v.dtype), v], dim=1)) for k, v in parts.items()}
        self.parts = parts
        self.Lw = parts["positions"].shape[1]
        self.n, self.device = lay.n, device
        self.segmented = lay.padded or document_ids_vary(lay.docs) or self.Lw != self.L

    def keep(self, cache: AttentionCache, history: int) -> None:
        """Store the last ``history`` tokens' inputs in the cache (what the widest short convolution reads)."""
        if history:
            cache.window = {k: (None if v is None else v[:, v.shape[1] - min(history, v.shape[1]):].detach())
                            for k, v in self.parts.items()}


class TokenValues(NamedTuple):
    """What the scheme computes per token over a window (float64 where static):

    ``transports[i]`` for transform i: ROPE a phase ``(B|1, H|1, Lw, P)`` or ready ``(cos, sin)`` tables
    (scale included, angle dtype); SO2 the step angles ``(B|1, H|1, Lw, P)``; HOUSEHOLDER ``(w, beta)``,
    w ``(B|1, H, Lw, C)`` over the group's channels, beta ``(B|1, H|1, Lw)``. ``biases[i]`` is
    ``(kind, value)``: LINEAR_BIAS the slope ``(H,)``, GATE_BIAS the log gates ``(B|1, H|1, Lw)``,
    TABLE_BIAS None (read through ``distance_table``). ``tau``: the temperature ``(B|1, H|1, Lw)`` or None.
    """

    transports: list
    biases: list
    tau: Tensor | None = None


# ---------------------------------------------------------------------- transports
class Transports(NamedTuple):
    rots: list  # (transform, (cos, sin)) for ROPE, (transform, float64 angles) for SO2, over the L new tokens
    householder: tuple | None  # (w (B, H, L, D), beta (B, H, L)) in the compute dtype, or None
    angles: dict  # transform index -> the running cumulative angles to keep in the cache
    per_head: bool  # a transport differs per query head: k and v need one copy per query head


def transports(scheme, kernels, vals: TokenValues, lay: Layout, cache, dtype) -> Transports:
    """Rotations of the L new tokens (cumulative angles continue the cache's) and PaTH's steps."""
    B, L = lay.valid.shape
    adt = angle_dtype(dtype)
    valid = lay.valid
    rots, angles, hh = [], {}, None
    for i, (t, raw) in enumerate(zip(scheme.transforms, vals.transports)):
        if t.kind == ROPE:
            if isinstance(raw, tuple):
                cs = tuple(last_tokens(c, L) for c in raw)
            else:
                ph = torch.remainder(last_tokens(raw, L).to(F64), TWO_PI)
                cs = ((t.scale * torch.cos(ph)).to(adt), (t.scale * torch.sin(ph)).to(adt))
            if t.xpos_gamma:
                up = xpos_scale(t, lay.positions, xpos_centre(kernels, t, i, lay, cache))
                cs = cs + (up.unsqueeze(1).to(adt),)
            rots.append((t, cs))
        elif t.kind == SO2:
            a = last_tokens(raw, L).to(F64) * valid[:, None, :, None]
            A = kernels.cumulative_angles(a)
            prev = cache.angles.get(i) if cache is not None else None
            if prev is not None:
                A = A + prev.unsqueeze(-2)
            A = torch.remainder(A, TWO_PI)
            angles[i] = A[..., -1, :]
            rots.append((t, A))
        else:
            w_g, beta = raw
            H, D = scheme.heads, scheme.head_dim
            wv = last_tokens(w_g, L).to(dtype).expand(B, H, L, len(t.channels))
            if len(t.channels) == D:
                w = wv
            else:
                w = torch.zeros(B, H, L, D, dtype=dtype, device=valid.device).index_copy(
                    -1, torch.tensor(t.channels, device=valid.device), wv)
            hh = (w, last_tokens(beta, L, -1).expand(B, H, L).to(dtype) * valid[:, None, :])
    per_head = hh is not None or any((a[0] if isinstance(a, tuple) else a).shape[1] > 1 for _, a in rots)
    return Transports(rots, hh, angles, per_head)


def full_layout_pairs(t: Transform, D: int, layout: str | None):
    """The pairs of the whole head's layout (``layout``: the kernels' own, None for kernels that rotate
    any pairs they are given) that a transform's pairs are: (first, second) of the whole head and the
    indices k of the transform's pairs among them - interleaved (2k, 2k + 1) or halves (k, k + D/2) - or None."""
    first, second = getattr(t, "first", None), getattr(t, "second", None)
    if first is None:  # a plan's step: its pairs in the kernels' layout, within its channels
        n = len(t.channels)
        first, second = ((t.channels[0::2], t.channels[1::2]) if layout == "interleaved"
                         else (t.channels[: n // 2], t.channels[n // 2:]))
    if layout != "halves" and all(a % 2 == 0 and b == a + 1 for a, b in zip(first, second)):
        return tuple(range(0, D, 2)), tuple(range(1, D, 2)), tuple(a // 2 for a in first)
    if layout != "interleaved" and all(a < D // 2 and b == a + D // 2 for a, b in zip(first, second)):
        return tuple(range(D // 2)), tuple(range(D // 2, D)), tuple(first)
    return None


def merged_rotations(rots: list, D: int, layout: str | None = None) -> list:
    """Several RoPE-table rotations of q and k only (axial schemes: one group per axis) whose pairs are pairs
    of one whole-head layout, as one rotation of the whole head (identity on the other pairs): one pass over
    q and k instead of one per group. Anything else is returned as it is."""
    table = [(t, ang) for t, ang in rots if t.kind == ROPE and not t.values]
    if len(table) < 2:
        return rots
    full = [full_layout_pairs(t, D, layout) for t, _ in table]
    if any(f is None for f in full) or len({f[0] for f in full}) != 1:
        return rots
    lead = torch.broadcast_shapes(*(ang[0].shape[:-1] for _, ang in table))
    like = table[0][1][0]
    cos = torch.ones(*lead, D // 2, dtype=like.dtype, device=like.device)
    sin = torch.zeros(*lead, D // 2, dtype=like.dtype, device=like.device)
    for (t, (c, s)), (_, _, ks) in zip(table, full):
        idx = torch.tensor(ks, device=like.device)
        cos = cos.index_copy(-1, idx, c.expand(*lead, c.shape[-1]))
        sin = sin.index_copy(-1, idx, s.expand(*lead, s.shape[-1]))
    whole = Transform(ROPE, False, tuple(range(D)), full[0][0], full[0][1])
    return [(whole, (cos, sin))] + [r for r in rots if not (r[0].kind == ROPE and not r[0].values)]
def xpos_scale(t, positions: Tensor, centre: int) -> Tensor:
    """xPos's scale of q's pairs at ``positions`` (B, L): ``zeta_k ** ((p - centre) / gamma)``, (B, L, P)
    float64; k's pairs take its inverse (docs/semantics.md §2c). InputError where a scale passes 2^+-63:
    a score matrix multiplies a query's scale by any key's inverse one (masked keys too), and past 2^126
    that product overflows float32, so the scores would be inf - inf or 0 * inf."""
    z = torch.tensor(t.xpos_zeta, dtype=F64, device=positions.device)
    e = (positions.to(F64) - centre) / t.xpos_gamma
    bits = float(e.abs().max()) * math.log2(1 / min(t.xpos_zeta)) if e.numel() else 0.0
    if bits > 63:
        raise InputError(f"xpos(gamma = {t.xpos_gamma:g}): positions up to {int(positions.max())} (centre {centre}) "
                         f"need q and k scaled by 2^+-{bits:.1f}, beyond what float32 scores hold (2^+-63)",
                         "raise gamma or use shorter sequences (docs/semantics.md §2c: about 70 gamma tokens)")
    return z ** e.unsqueeze(-1)


def xpos_centre(kernels, t, i: int, lay: Layout, cache) -> int:
    """The centre c of xPos's exponents (p - c) / gamma in this call. Without a cache, n // 2 (as
    rotary-embedding-torch and x-transformers), so the scales stay within zeta^(+-n / (2 gamma)). With a
    cache, the centre its keys were stored at, as long as it is within gamma of n // 2; past that the
    cached keys are rescaled once to the new centre (``zeta^((c_new - c_old) / gamma)`` per pair), so a
    long decode stays as far from overflow as one full forward. The logits read only c's differences,
    so every centre gives the same attention."""
    c = lay.n // 2
    if cache is None:
        return c
    old = cache.centres.get(i)
    if old is None or cache.length == 0:
        cache.centres[i] = c
        return c
    if abs(c - old) <= t.xpos_gamma:
        return old
    K = cached(cache, "k", cache.length)
    f = torch.tensor(t.xpos_zeta, dtype=F64, device=K.device) ** ((c - old) / t.xpos_gamma)
    f = f.to(angle_dtype(K.dtype)).expand(1, 1, K.shape[2], len(t.xpos_zeta))
    ch = t.channels if len(t.channels) != K.shape[-1] else None
    K.copy_(kernels.rotate(K, f, torch.zeros_like(f), t, ch))  # angle 0: a scale of each pair
    cache.centres[i] = c
    return c


def transport_qkv(kernels, tr: Transports, q, k, v):
    """q (its last Lq tokens), k and v rotated by their absolute angles; what undoes the value rotation."""
    Lq, D, adt = q.shape[2], q.shape[3], angle_dtype(q.dtype)
    undo = []
    for t, ang in merged_rotations(tr.rots, D, getattr(kernels, "layout", None)):
        ch = t.channels if len(t.channels) != D else None
        if t.kind == ROPE:
            ck, sk = ang[:2]
            cq, sq = last_tokens(ck, Lq), last_tokens(sk, Lq)
            if len(ang) == 3:  # xPos: q's pairs times zeta^((i - c) / gamma), k's divided by zeta^((j - c) / gamma)
                up = ang[2]
                cq, sq, ck, sk = cq * last_tokens(up, Lq), sq * last_tokens(up, Lq), ck / up, sk / up
            q = kernels.rotate(q, cq, sq, t, ch)
            k = kernels.rotate(k, ck, sk, t, ch)
            if t.values:
                v = kernels.rotate(v, ck, sk, t, ch)
                undo.append((t, ch, (cq, sq)))
        else:
            ang_d = ang.to(adt)
            q = kernels.rotate_by_angles([q], last_tokens(ang_d, Lq), t, ch)[0]
            if t.values:
                k, v = kernels.rotate_by_angles([k, v], ang_d, t, ch)
                undo.append((t, ch, last_tokens(ang, Lq)))
            else:
                k = kernels.rotate_by_angles([k], ang_d, t, ch)[0]
    return q, k, v, undo


def undo_values(kernels, undo, o):
    """R(A_i)^T = R(-A_i) at the query's angle, for every transport that rotated the values."""
    for t, ch, a in reversed(undo):
        if isinstance(a, tuple):
            o = kernels.rotate(o, a[0], -a[1], t, ch)
        else:
            o = kernels.rotate_by_angles([o], (-a).to(angle_dtype(o.dtype)), t, ch)[0]
    return o


# ---------------------------------------------------------------------- biases
class Biases(NamedTuple):
    coord: Tensor | None  # (B, H, L) float64: b(i, j) = c_i - c_j summed over the coordinate biases
    tables: list  # indices of the distance-table biases
    gates: dict  # bias index -> the running log-gate sums to keep in the cache
    queries: tuple = ()  # indices of the biases that read the query position (QUERY_BIAS)
    axial: tuple = ()  # indices of the biases over per-axis distances (AXIS_BIAS)


def biases(scheme, vals: TokenValues, lay: Layout, cache) -> Biases:
    """Float64 coordinates of the L new tokens (gate sums continue the cache's) and the table biases."""
    B, L = lay.valid.shape
    coord, tables, gates, queries, axial = None, [], {}, [], []
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


def distance_tables(scheme, tables, qpos, kpos) -> dict:
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
    return axis_rows(lay) if cache is None else cached(cache, "axes", kpos.shape[1])


def run_length(qpos, kpos) -> int:
    """The call's run-time length ``n`` as the reference reads it: the span of positions from the first
    key to the last query, plus one (one fresh sequence: its length)."""
    return int((qpos.max() - kpos.min()).clamp(min=0)) + 1 if qpos.numel() and kpos.numel() else 1


def bias_rows(scheme, tables, coord_q, kcoord, qpos, kpos, dtype, queries=(), axial=(), qax=None, kax=None,
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


# ---------------------------------------------------------------------- attend
def all_keys(cache, lay: Layout, k, v, coord, Lc: int):
    """All keys of the call: cached ones then this call's (the new ones keep their autograd graph).
    Appends this call's keys, values and layout to the cache."""
    if cache is None:
        return k, v, lay.positions, lay.docs, lay.valid, coord
    check_cache(cache, k.shape[0], k.shape[1])
    names = ("k", "v", "pos", "doc", "valid", "coord")
    grad = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or
                                         (coord is not None and coord.requires_grad))
    old = [cached(cache, n, Lc) for n in names] if grad and Lc else None
    if cache.heads_kv is None:
        cache.heads_kv = k.shape[1]
    cache.put("k", k.detach(), Lc)
    append_layout(cache, lay, v, coord)
    if Lc == 0:
        return k, v, lay.positions, lay.docs, lay.valid, coord
    if old is None:  # the appended buffers already hold every key: no copy
        return tuple(cached(cache, n, Lc + k.shape[2]) for n in names)
    cat = lambda a, b, d: None if b is None else torch.cat([a.to(b.dtype), b], dim=d)  # noqa: E731
    return (cat(old[0], k, 2), cat(old[1], v, 2), cat(old[2], lay.positions, 1), cat(old[3], lay.docs, 1),
            cat(old[4], lay.valid, 1), cat(old[5], coord, 2))


def allowed_mask(lay: Layout, Lc: int, L: int, r0: int, r1: int, Lq: int, kpos, kdoc, kvalid, multi_doc: bool,
                 shape=None, k0: int = 0, scheme=None, kspan=None):
    """Boolean (B, 1|H, r1 - r0, Lk) mask of the query rows r0..r1 over the keys k0..k0 + Lk (``kpos``,
    ``kdoc``, ``kvalid``, ``kspan`` are those keys'), or None when every key is allowed. ``shape``: the scheme's
    (window, chunk), or None; ``scheme``: its mask widens the causal one (pedsl.compiler.masking)."""
    Lk = kpos.shape[1]
    B = lay.valid.shape[0]
    m = None
    q0 = Lc + L - Lq  # global index of query row 0
    if Lq > 1 and not (r1 - r0 == 1 and r0 == Lq - 1):
        qi = torch.arange(q0 + r0, q0 + r1, device=kpos.device)
        m = (torch.arange(k0, k0 + Lk, device=kpos.device)[None, :] <= qi[:, None])[None, None]
    if scheme is not None:
        qspan = None if lay.spans is None else lay.spans[:, L - Lq + r0: L - Lq + r1]
        m = seen_both_ways(scheme, m, qspan, kspan)
    if multi_doc:
        qd = lay.docs[:, L - Lq + r0: L - Lq + r1]
        d = (qd[:, :, None] == kdoc[:, None, :])[:, None]
        m = d if m is None else m & d
    kv = kvalid
    if lay.key_valid_cached is not None and k0 < Lc:
        if kv is None:
            kv = torch.ones(B, Lk, dtype=torch.bool, device=kpos.device)
        n = min(Lk, Lc - k0)
        kv = torch.cat([kv[:, :n] & lay.key_valid_cached[:, k0:k0 + n], kv[:, n:]], dim=1)
    if kv is not None and not bool(kv.all()):
        m = kv[:, None, None, :] if m is None else m & kv[:, None, None, :]
    if lay.mask4 is not None:
        m4 = lay.mask4[:, :, r0:r1, k0:k0 + Lk]
        m = m4 if m is None else m & m4
    if shape is not None:
        w = visible(shape, lay.positions[:, L - Lq + r0: L - Lq + r1], kpos)[:, None]
        m = w if m is None else m & w
    return m


# ---------------------------------------------------------------------- windows
class Shape(NamedTuple):
    """The attention's shape (docs/semantics.md §11): key j is visible to query i iff
    ``0 <= p_i - p_j < window`` (sliding) or ``p_i // chunk == p_j // chunk`` (chunked), inside
    the causal, document and padding masks."""

    window: int | None
    chunk: int | None
    symmetric: bool = False  # a non-causal mask: the window reaches both ways, |p_i - p_j| < window


def shape_of(scheme) -> Shape | None:
    w, c = getattr(scheme, "window", None), getattr(scheme, "chunk", None)
    return None if w is None and c is None else Shape(w, c, symmetric_window(scheme))


def visible(shape: Shape, qpos: Tensor, kpos: Tensor) -> Tensor:
    """(B, rows, keys) bool: the keys at ``kpos (B, keys)`` the window lets the queries at ``qpos (B, rows)`` see."""
    return visible_pairs(shape, qpos[:, :, None], kpos[:, None, :])


def visible_pairs(shape: Shape, qpos: Tensor, kpos: Tensor) -> Tensor:
    """Whether the window lets a query at ``qpos`` see a key at ``kpos`` (broadcast against each other)."""
    if shape.window is not None:
        return ((qpos - kpos).abs() if shape.symmetric else qpos - kpos) < shape.window
    return torch.div(qpos, shape.chunk, rounding_mode="floor") == torch.div(kpos, shape.chunk, rounding_mode="floor")


def key_starts(shape: Shape, lay: Layout, kpos: Tensor, kdoc: Tensor, kvalid, Lq: int, block: int) -> list:
    """The first key any query of each block of ``block`` queries can see (an index into the keys).

    The keys of a row are ordered by ``rank(document) * RANK + position`` (a running maximum over
    the valid ones, so padding keeps the order); a query sees no key whose order is below its own
    document's rank plus the lowest position its window reaches, so a binary search bounds the span."""
    B, Lk = kpos.shape
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
        qp, shape.chunk, rounding_mode="floor") * shape.chunk
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
    if not Lc or cache.last_pos is None:
        return
    pos, doc, valid = (cached(cache, n, Lc) for n in ("pos", "doc", "valid"))
    last, ldoc = cache.last_pos[:, None], cache.last_doc[:, None]
    if shape.window is not None:
        alive = pos > last - shape.window
    else:
        alive = torch.div(pos, shape.chunk, rounding_mode="floor") == torch.div(last, shape.chunk,
                                                                                rounding_mode="floor")
    alive = alive & (doc == ldoc) & valid
    first = torch.where(alive.any(1), alive.long().argmax(1), torch.full_like(cache.last_pos, Lc))
    d = int(first.min())
    if d < max(64, shape.window or shape.chunk):
        return
    path_flush(cache, cache.path_flushed or 0, cache.path_pending)  # PaTH: every kept key up to date
    keep = Lc - d
    for name, b in cache._buf.items():
        ax = token_axis(b)
        b.narrow(ax, 0, keep).copy_(b.narrow(ax, d, keep).clone())
    cache.length = keep
    cache.dropped += d


def sink_rows(sink, r0: int, r1: int):
    return None if sink is None else (sink[0][..., r0:r1], sink[1])


def attend(q, k, v, mask, bias, scale=None, sink=None, softcap=None):
    """SDPA of a block of queries with a boolean mask and an additive bias; rows with no key give zeros.
    ``sink``: (logit column (B, Hq, rows), value (1, Hq, 1, D) or None), one more key every row sees.
    ``softcap``: the scores (with the bias) pass through softcap * tanh(s / softcap) first (explicit scores)."""
    if softcap is not None:  # no SDPA caps: the explicit scores of the pipeline
        return scored_rows(q, k, v, mask, bias, cap=softcap, sink=sink, scale=scale)
    Hq, Hk = q.shape[1], k.shape[1]
    if sink is not None:
        q, k, v, mask, bias = with_sink(q, k, v, mask, bias, sink)
        Hk = k.shape[1]
    ok = None
    if mask is not None:
        ok = mask.any(-1, keepdim=True)
        if not bool(ok.all()):
            mask = mask | ~ok
        else:
            ok = None
    if bias is not None:
        am = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    else:
        am = mask
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=am, scale=scale, enable_gqa=Hq != Hk)
    if ok is not None:
        o = o * ok.to(o.dtype)
    return o


def _scored_block(q, K, V, ok, bias, scale, cap, normalize, col, vs, qc, emb, sigmoid_bias):
    s = modified_scores(q @ K.transpose(-1, -2), scale=scale, bias=bias, cap=cap)
    w, ws = normalised(s, ok, normalize=normalize, sink=col, qc=qc, emb=emb, sigmoid_bias=sigmoid_bias)
    o = w.to(V.dtype) @ V
    return o if vs is None else o + ws.to(V.dtype) * vs


def scored_rows(q, K, V, ok, bias, *, cap=None, normalize="softmax", sink=None, qc=None, emb=None, scale=None,
                sigmoid_bias=0.0):
    """Attention of a block of queries over the keys ``ok (B|1, 1|H, rows, Lk)`` allows (None: all) with
    explicit scores, through the one score pipeline (:mod:`pedsl.compiler.scores`: scale, bias, soft cap
    ``cap``; the sink ``(logit column, value or None)``, CoPE's ``qc``, ``emb`` and the ``normalize``-r with
    its ``sigmoid_bias``), in
    float32 at least; with gradients the block is recomputed in the backward pass (activation
    checkpointing), so training holds O(rows x Lk) scores."""
    Hq, Hk, D = q.shape[1], K.shape[1], q.shape[3]
    if Hq != Hk:
        K, V = K.repeat_interleave(Hq // Hk, dim=1), V.repeat_interleave(Hq // Hk, dim=1)
    dt = torch.promote_types(q.dtype, torch.float32)
    col, vs = (None, None) if sink is None else sink
    args = (q.to(dt), K.to(dt), V, ok, None if bias is None else bias.to(dt), D ** -0.5 if scale is None else scale,
            cap, normalize, col, None if vs is None else vs.to(V.dtype), qc, emb, sigmoid_bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, K, V, bias, col, vs, qc, emb) if t is not None):
        return torch.utils.checkpoint.checkpoint(_scored_block, *args, use_reentrant=False).to(q.dtype)
    return _scored_block(*args).to(q.dtype)


def with_sink(q, k, v, mask, bias, sink):
    """q, k, v, mask and bias with the sink as one more key: a zero key whose bias is the sink's logit."""
    col, vs = sink
    B, Hq, R, D = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    if vs is not None and Hk != Hq:  # a value per query head: one key/value head per query head
        k, v = k.repeat_interleave(Hq // Hk, dim=1), v.repeat_interleave(Hq // Hk, dim=1)
        Hk = Hq
    k = torch.cat([k, k.new_zeros(B, Hk, 1, D)], dim=2)
    v = torch.cat([v, v.new_zeros(B, Hk, 1, D) if vs is None else vs.expand(B, Hk, 1, D)], dim=2)
    base = bias if bias is not None else q.new_zeros(1, 1, 1, 1)
    bias = torch.cat([base.expand(B, Hq, R, Lk), col.to(q.dtype).unsqueeze(-1)], dim=-1)
    if mask is not None:
        mask = torch.cat([mask.expand(B, mask.shape[1], R, Lk), mask.new_ones(B, mask.shape[1], R, 1)], dim=-1)
    return q, k, v, mask, bias


def attend_blocks(scheme, q, k, v, bi: Biases, lay: Layout, cache, sink=None, qc=None):
    """Attention of the queries over every key, the cache's and this call's, by blocks of queries (with
    a window or chunk: each block over the span of keys it can see, O(L N) time and memory). ``qc``: the
    queries as given (before transports and temperature), which CoPE's embedding term reads."""
    Hq, Lq = q.shape[1], q.shape[2]
    L = k.shape[2]
    Lc = cache.length if cache is not None else 0
    shape, cap = shape_of(scheme), getattr(scheme, "softcap", None)
    K, V, kpos, kdoc, kvalid, kcoord = all_keys(cache, lay, k, v, bi.coord, Lc)
    if cache is not None and Lc and cache.one_doc and lay.docs is cache._doc_view:
        multi_doc = False  # decoding inside the cached document
    else:
        multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    if cache is not None and Lc and cache.all_valid and not lay.padded:
        kvalid = None
    fast = scheme.fast_paths  # the kernels the plan's features allow (pedsl.compiler.kernel_support)
    fresh, one_doc, unmasked = Lc == 0 and Lq == L, not multi_doc, not lay.padded and lay.mask4 is None
    if causal_call(fast, "causal-sdpa", q, fresh, one_doc, unmasked):  # one causal sequence at given positions
        return F.scaled_dot_product_attention(q, K, V, is_causal=True, enable_gqa=Hq != K.shape[1])
    if causal_call(fast, "flash-window", q, fresh, one_doc, unmasked) and window_call(
            fast, flash_supports(q), shape.window, shape.chunk, lay.positions):  # the band, no mask on its bulk
        return banded_attention(q, K, V, shape.window, shape.chunk)
    qpos_all = last_tokens(lay.positions, Lq, 1)
    cq_all = None if bi.coord is None else last_tokens(bi.coord, Lq, -1)
    tables = distance_tables(scheme, bi.tables, qpos_all, kpos)
    qax = last_tokens(axis_rows(lay), Lq, -1) if bi.axial else None
    kax = key_axis_rows(cache, lay, kpos) if bi.axial else None
    banded = shape is not None and not shape.symmetric  # a symmetric window: every key span, masked
    block = WINDOW_BLOCK if banded else QUERY_CHUNK
    starts = key_starts(shape, lay, kpos, kdoc, key_validity(lay, kvalid, Lc), Lq, block) if banded else None
    kspan = all_spans(cache, lay, Lc)
    q0 = Lc + L - Lq
    # explicit scores are formed for every key of the span: stop at the block's last query (causal)
    explicit = explicit_scores(scheme.normalize, scheme.cope_max_pos)
    last = (lambda r1: q0 + r1) if explicit else (lambda r1: Lc + L)
    remapped = RemappedKeys(scheme, K, kpos, lay.n) if getattr(scheme, "remap", None) is not None else None
    outs = []
    for b, r0 in enumerate(range(0, Lq, block)):
        r1 = min(Lq, r0 + block)
        k0, k1 = (0, last(r1)) if starts is None else (min(starts[b], q0 + r0), q0 + r1)
        kp, kd = kpos[:, k0:k1], kdoc[:, k0:k1]
        kva = None if kvalid is None else kvalid[:, k0:k1]
        mask = allowed_mask(lay, Lc, L, r0, r1, Lq, kp, kd, kva, multi_doc, shape, k0, scheme,
                            None if kspan is None else kspan[:, k0:k1])
        bias = bias_rows(scheme, tables, None if cq_all is None else cq_all[..., r0:r1],
                         None if kcoord is None else kcoord[..., k0:k1], qpos_all[:, r0:r1], kp, q.dtype, bi.queries,
                         bi.axial, None if qax is None else qax[..., r0:r1], None if kax is None else kax[..., k0:k1],
                         run_length(qpos_all, kpos))
        if explicit:  # key index k - k0 of this span; the query's own key is q0 + r - k0
            outs.append(explicit_rows(scheme, q[:, :, r0:r1], K[:, :, k0:k1], V[:, :, k0:k1], mask, bias,
                                      q0 + r0 - k0, None if qc is None else qc[:, :, r0:r1]))
            continue
        if remapped is not None:
            outs.append(remapped.rows(q[:, :, r0:r1], qpos_all[:, r0:r1], k0, k1, V[:, :, k0:k1], mask, bias,
                                      sink_rows(sink, r0, r1), cap))
            continue
        outs.append(attend(q[:, :, r0:r1], K[:, :, k0:k1], V[:, :, k0:k1], mask, bias, sink=sink_rows(sink, r0, r1),
                           softcap=cap))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def all_spans(cache, lay: Layout, Lc: int):
    """Every key's span key, the cache's then this call's (after all_keys appended them), or None."""
    if lay.spans is None or not Lc:
        return lay.spans
    return cached(cache, "span", Lc + lay.spans.shape[1])


def distance_attend(scheme, kernels, q, k, v, bi: Biases, lay: Layout, cache):
    """Biases that are all distance tables, over one fresh causal sequence, on the kernels' Toeplitz kernel
    (the tables summed once (H, distances), each block of queries reading its rows as a view of it); or one
    bias of FIRE's form on the kernels' MLP-bias kernel (:func:`query_mlp_attend`). None where the call
    needs :func:`attend_blocks` (what the two kernels take: their declarations and call checks in
    ``kernel_support``)."""
    if bi.queries:
        return query_mlp_attend(scheme, kernels, q, k, v, bi, lay, cache)
    if not fresh_sequence_call(scheme.fast_paths, "distance", kernels, q, k, lay, cache):
        return None
    pos = lay.positions
    tables = list(distance_tables(scheme, bi.tables, pos, pos).values())
    table = sum(tables[1:], tables[0])
    if bias_call(scheme.fast_paths, kernels, q, k, v):  # the table inside the C++ kernel's rows
        return kernels.bias_attention(q, k, v, table=table)
    return kernels.distance_attention(q, k, v, table)


def query_mlp_attend(scheme, kernels, q, k, v, bi: Biases, lay: Layout, cache):
    """One bias ``mlp(u(distance) * w(query_position))`` with one hidden ReLU layer (FIRE; the scheme's
    ``query_mlp``) and no other bias, over one fresh causal sequence whose rows all start at the same
    position (w reads it), on the kernels' MLP-bias kernel. None otherwise."""
    if not hasattr(scheme, "query_mlp") or not mlp_call(scheme.fast_paths, kernels, q, k, lay, cache):
        return None
    factors = scheme.query_mlp(bi.queries[0], lay.positions[0], q.device)
    return None if factors is None else kernels.mlp_attention(q, k, v, *factors)


def explicit_rows(scheme, q, K, V, mask, bias, q0: int, qc=None) -> Tensor:
    """Attention of a block of queries (global token index q0, q0 + 1, ...) over every key when the weights
    are not a softmax of a bias known beforehand (stick-breaking, sigmoid, CoPE): key j counts for query i when j <= i
    (j < i for stick-breaking without ``attend_current``) and ``mask`` allows it; no key gives zeros."""
    Lk, rows = K.shape[2], q.shape[2]
    qi = torch.arange(q0, q0 + rows, device=q.device)[:, None]
    kj = torch.arange(Lk, device=q.device)[None, :]
    ok = ((kj <= qi) if own_key_counts(scheme.attend_current, scheme.normalize) else (kj < qi))[None, None]
    ok = ok if mask is None else ok & mask
    emb = scheme.contextual_embedding if scheme.cope_max_pos is not None else None
    return scored_rows(q, K, V, ok, bias, cap=getattr(scheme, "softcap", None), normalize=scheme.normalize,
                       qc=qc, emb=emb, sigmoid_bias=getattr(scheme, "sigmoid_bias", 0.0))


def key_validity(lay: Layout, kvalid, Lc: int):
    """Every key's validity (the cached keys' as this call's (B, cached + L) mask says), or None."""
    if lay.key_valid_cached is None:
        return kvalid
    kv = lay.key_valid_cached
    rest = lay.valid if kvalid is None else kvalid[:, Lc:]
    return torch.cat([kv if kvalid is None else kvalid[:, :Lc] & kv, rest], dim=1)


# ---------------------------------------------------------------------- PaTH
def path_attend(scheme, kernels, q, k, v, hh, coord, lay: Layout, cache, sink=None):
    """PaTH: the blockwise kernel for a fresh full sequence where ``kernels`` has one (packed documents
    and left padding become hard resets of the log-gate), the windowed kernel for a fresh sequence
    inside a window or chunk (its mask decides documents, padding and the sink), otherwise the decode
    rule token by token:
    each new token's step ``H_t`` moves every earlier key, ``Kt <- Kt - beta_t (Kt w_t) w_t^T``, then
    its query attends."""
    w, beta = hh
    B, H, L, D = k.shape
    Lq = q.shape[2]
    Lc = cache.length if cache is not None else 0
    shape = shape_of(scheme)
    run = path_call(scheme.fast_paths, kernels, lay, Lc == 0 and Lq == L)
    if run == "path-window":
        return _path_local(kernels, q, k, v, w, beta, coord, lay, cache, shape, sink)
    if run == "path-blockwise":
        return _path_blockwise(kernels, q, k, v, w, beta, coord, lay, cache)
    if cache is not None:
        check_cache(cache, B, H)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w, beta))
    if cache is not None and not grad and (Lc == 0 or cache._buf["k"].dtype == angle_dtype(k.dtype)):
        cdt = angle_dtype(k.dtype)  # half precision: the cache and the pending product in float32
        sink = None if sink is None else (sink[0].to(cdt), None if sink[1] is None else sink[1].to(cdt))
        return path_decode_inplace(*(t.to(cdt) for t in (q, k, v, w, beta)), coord, lay, cache, shape,
                                   sink).to(q.dtype)
    return _path_decode_rule(q, k, v, w, beta, coord, lay, cache, grad, shape, sink)


def _path_blockwise(kernels, q, k, v, w, beta, coord, lay: Layout, cache):
    B, H, L, _ = k.shape
    lf = None
    if coord is not None:
        lf = torch.diff(coord, dim=-1, prepend=coord[..., :1])
    start = torch.zeros_like(lay.valid)
    start[:, 1:] = (lay.docs[:, 1:] != lay.docs[:, :-1]) | (lay.valid[:, 1:] & ~lay.valid[:, :-1])
    if bool(start.any()):
        lf = torch.zeros(B, H, L, dtype=F64, device=q.device) if lf is None else lf.clone()
        lf = lf.masked_fill(start[:, None, :].expand(B, H, L), HARD_RESET)
    o = kernels.path_attention(q, k, v, w, beta, lf)
    if lay.padded:  # left padding: its queries see no key
        o = o * lay.valid[:, None, :, None].to(o.dtype)
    return _path_prefilled(kernels, o, k, v, w, beta, coord, lay, cache)


def _path_prefilled(kernels, o, k, v, w, beta, coord, lay: Layout, cache):
    """A fresh sequence's PaTH output ``o``; a cache gets every key moved to the last token."""
    if cache is not None:  # half-precision calls keep PaTH's cache in float32 (steps accumulate there)
        cdt = angle_dtype(k.dtype)
        all_keys(cache, lay, kernels.path_transported_keys(k.to(cdt), w.to(cdt), beta.to(cdt)), v.to(cdt), coord, 0)
    return o


def _path_local(kernels, q, k, v, w, beta, coord, lay: Layout, cache, shape: Shape, sink):
    """PaTH inside a window or chunk over a fresh sequence: the kernel scores each block of queries
    against the keys it can see only (O(L N)), the steps between them composed inside the window; the
    window, documents and padding decide each pair. ``reach``: how far back (in tokens) any query sees."""
    L = k.shape[2]
    pos, docs = lay.positions, lay.docs
    kvalid = lay.valid if lay.padded else None
    first = torch.tensor(key_starts(shape, lay, pos, docs, kvalid, L, 1), device=pos.device)
    reach = int((torch.arange(L, device=pos.device) - first).max()) if L else 0

    def allowed(i: Tensor, j: Tensor) -> Tensor:  # token indices (n, C, 1), (n, 1, m) -> (B, n, C, m)
        ok = visible_pairs(shape, pos[:, i], pos[:, j]) & (docs[:, i] == docs[:, j])
        return ok if kvalid is None else ok & kvalid[:, j]

    lf = None if coord is None else torch.diff(coord, dim=-1, prepend=coord[..., :1])
    o = kernels.path_local_attention(q, k, v, w, beta, lf, reach=reach, allowed=allowed, sink=sink,
                                     block_size=PATH_BLOCK)
    return _path_prefilled(kernels, o, k, v, w, beta, coord, lay, cache)


def _path_decode_rule(q, k, v, w, beta, coord, lay: Layout, cache, grad: bool, shape=None, sink=None):
    """The decode rule with autograd (or without a cache): every earlier key moved by each new step."""
    B, H, L, D = k.shape
    Lq = q.shape[2]
    Lc = cache.length if cache is not None else 0
    old = {n: cached(cache, n, Lc) for n in ("k", "v", "pos", "doc", "valid", "coord")} if Lc else {}
    if cache is not None and cache.path_pending is not None:
        path_flush(cache, cache.path_flushed, cache.path_pending)
    Kt = old["k"] if Lc else k[:, :, :0]
    if grad or Kt.dtype != k.dtype:
        Kt = Kt.to(k.dtype).clone()
    kpos = torch.cat([old["pos"], lay.positions], 1) if Lc else lay.positions
    kdoc = torch.cat([old["doc"], lay.docs], 1) if Lc else lay.docs
    kvalid = torch.cat([old["valid"], lay.valid], 1) if Lc else lay.valid
    kco = None if coord is None else (torch.cat([old["coord"], coord], -1) if Lc else coord)
    Vall = torch.cat([old["v"].to(v.dtype), v], 2) if Lc else v
    multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    outs = []
    for t in range(L):
        wt, bt = w[:, :, t], beta[:, :, t]  # (B, H, D), (B, H)
        if Kt.shape[2]:
            proj = Kt @ wt.unsqueeze(-1)  # (B, H, n, 1)
            if grad:
                Kt = Kt - (bt[..., None, None] * proj) * wt.unsqueeze(-2)
            else:
                Kt.sub_((bt[..., None, None] * proj) * wt.unsqueeze(-2))
        Kt = torch.cat([Kt, k[:, :, t: t + 1]], 2)
        r = t - (L - Lq)
        if r < 0:
            continue
        n = Lc + t + 1
        mask = allowed_mask(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc, shape)
        mask = None if mask is None else mask[..., :n]  # keys after this query are not moved yet (causal)
        bias = None if kco is None else (kco[..., Lc + t: Lc + t + 1].unsqueeze(-1) - kco[..., :n].unsqueeze(-2)).to(q.dtype)
        outs.append(attend(q[:, :, r: r + 1], Kt, Vall[:, :, :n], mask, bias, sink=sink_rows(sink, r, r + 1)))
    if cache is not None:
        cache.heads_kv = H
        cache.put("k", Kt.detach(), 0)  # every key moved to the newest token
        append_layout(cache, lay, v, coord)
    return torch.cat(outs, dim=2)


def path_flush(cache: AttentionCache, nf: int, P) -> None:
    """Apply the pending product ``P`` of PaTH steps to the first ``nf`` keys (those cached before the
    last flush): ``K <- K P^T``. Afterwards every cached key is transported to the newest token."""
    if P is not None and nf:
        Kf = cached(cache, "k", nf).flatten(0, 1)
        Kf.copy_(torch.bmm(Kf, P.transpose(1, 2)))
    cache.path_pending, cache.path_flushed = None, None


def path_decode_inplace(q, k, v, w, beta, coord, lay: Layout, cache: AttentionCache, shape=None, sink=None):
    """The decode rule without autograd, on the cache's own buffers, with the steps applied lazily.

    The keys cached before the last flush are stored as transported to the flush point f; the
    steps since then are kept as one D x D product ``P = H_t ... H_(f+1)`` per head (D^2 per token),
    so a query scores them through ``P^T q`` (``q . P K_j = (P^T q) . K_j``: one pass over the cache,
    as SDPA); the few keys cached since the flush are moved eagerly, and every ``PATH_FLUSH`` tokens
    ``K <- K P^T`` brings all keys up to date (two passes, amortised). Per token and head about
    2 + 3 / PATH_FLUSH passes over the cache against SDPA's two."""
    B, H, L, D = k.shape
    Lq = q.shape[2]
    Z = B * H
    Lc = cache.length
    cache.heads_kv = H
    append_layout(cache, lay, v, coord)
    total = Lc + L
    kpos, kdoc, kvalid = (cached(cache, n, total) for n in ("pos", "doc", "valid"))
    kco = cached(cache, "coord", total) if coord is not None else None
    multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    nf = Lc if cache.path_flushed is None else cache.path_flushed
    P = cache.path_pending
    outs = []
    for t in range(L):
        n = Lc + t  # keys before token t
        wt, bt = w[:, :, t].reshape(Z, D, 1), beta[:, :, t].reshape(Z, 1, 1)
        if n:
            # the pending product P <- H_t P (D x D per head), the recent keys moved eagerly
            if P is None:
                P = torch.eye(D, dtype=k.dtype, device=k.device).expand(Z, D, D) - bt * wt @ wt.transpose(1, 2)
            else:
                P = P - (bt * wt) @ (wt.transpose(1, 2) @ P)
            if n > nf:
                R = cached(cache, "k", n).narrow(2, nf, n - nf).flatten(0, 1)  # (Z, n - nf, D)
                R.baddbmm_(torch.bmm(R, wt) * bt, wt.transpose(1, 2), alpha=-1.0)
        cache.put("k", k[:, :, t: t + 1], n)
        r = t - (L - Lq)
        if r >= 0:
            mask = allowed_mask(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc, shape)
            outs.append(_path_score_one(cache, q[:, :, r], P, nf, n, kco, mask, total, sink_rows(sink, r, r + 1)))
        if n + 1 - nf >= PATH_FLUSH:
            path_flush(cache, nf, P)
            nf, P = n + 1, None
    cache.path_pending, cache.path_flushed = P, nf
    return torch.cat(outs, dim=2)


def _path_score_one(cache: AttentionCache, q, P, nf: int, n: int, kco, mask, total: int, sink=None):
    """One query (B, H, D) over the n + 1 cached keys, the first nf of them scored through ``P^T q``."""
    B, H, D = q.shape
    Z = B * H
    qt = q.reshape(Z, D, 1)
    Kall = cached(cache, "k", n + 1).flatten(0, 1)  # (Z, n + 1, D)
    if nf and P is not None:
        s = torch.cat([torch.bmm(Kall[:, :nf], torch.bmm(P.transpose(1, 2), qt)),
                       torch.bmm(Kall[:, nf:], qt)], 1)
    else:
        s = torch.bmm(Kall, qt)
    s = s.view(B, H, 1, n + 1) * D ** -0.5
    if kco is not None:
        s = s + (kco[..., n: n + 1].unsqueeze(-1) - kco[..., : n + 1].unsqueeze(-2)).to(s.dtype)
    ok = None
    if mask is not None:
        mask = mask[..., : n + 1]
        s = s.masked_fill(~mask, float("-inf"))
        ok = mask.any(-1, keepdim=True)
        if sink is None:
            s = s.masked_fill(~ok, 0.0)
    if sink is not None:  # one more key every query sees: its logit, its value (zero for a logit sink)
        s = torch.cat([s.expand(B, H, 1, n + 1), sink[0].reshape(B, H, 1, 1).to(s.dtype)], dim=-1)
        p = torch.softmax(s, dim=-1)
        o = torch.bmm(p[..., :-1].reshape(Z, 1, n + 1), cached(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
        if sink[1] is not None:
            o = o + p[..., -1:].reshape(Z, 1, 1) * sink[1].expand(B, H, 1, D).reshape(Z, 1, D)
        return o.view(B, H, 1, D)
    p = torch.softmax(s, dim=-1)
    if ok is not None:
        p = p * ok
    o = torch.bmm(p.reshape(Z, 1, n + 1), cached(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
    return o.view(B, H, 1, D)


# ---------------------------------------------------------------------- kernels and the forward
class Transform(NamedTuple):
    """A transport as the general forward reads it: its kind, whether it also turns the values, its
    channels, the pairs (first[k], second[k]) its rotations turn, rotate's scale of q and k, and xPos's
    gamma and per-pair decays."""

    kind: str
    values: bool
    channels: tuple
    first: tuple
    second: tuple
    scale: float = 1.0
    xpos_gamma: float = 0.0  # xpos(...): gamma and each pair's decay zeta_k; 0 and () for other transports
    xpos_zeta: tuple = ()


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, first, second) -> Tensor:
    """x (B, H, L, D) with its channel pairs (first[k], second[k]) rotated by the angles behind cos, sin
    (..., L, P); computed in cos's dtype and rounded once."""
    dt = x.dtype
    x = x.to(cos.dtype)
    xa, xb = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = xa * cos - xb * sin
    out[..., second] = xb * cos + xa * sin
    return out.to(dt)


class TorchKernels:
    """The primitives of the general forward in plain torch: rotations of a transform's channel pairs
    (``t.first``, ``t.second``), a float64 cumulative sum of step angles, no blockwise PaTH kernels
    (PaTH runs by its decode rule; a generated PaTH module subclasses this with its copies of them), and no
    Toeplitz distance-bias or MLP-bias kernel (distance tables and biases that read the query position run
    by blocks of queries)."""

    path_attention = path_local_attention = path_transported_keys = distance_attention = mlp_attention = None

    @staticmethod
    def rotate(x, cos, sin, t, channels):
        return rotate_pairs(x, cos, sin, t.first, t.second)

    @staticmethod
    def rotate_by_angles(xs, angles, t, channels):
        cos, sin = torch.cos(angles), torch.sin(angles)
        return [rotate_pairs(x, cos, sin, t.first, t.second) for x in xs]

    @staticmethod
    def cumulative_angles(a):
        return torch.cumsum(a, dim=-2)


def check_call(scheme, q, k, v, cache) -> None:
    """q (B, heads, Lq, head_dim) and k, v (B, Hkv, L, head_dim) with Hkv dividing the heads and Lq <= L;
    a cache made by this module for this batch."""
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if (Hq, D) != (scheme.heads, scheme.head_dim) or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise InputError(f"expected q (B, {scheme.heads}, Lq, {scheme.head_dim}) and k, v (B, Hkv, L, "
                         f"{scheme.head_dim}); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if Hq % Hkv or Lq > L:
        raise InputError(f"k and v need a divisor of {Hq} heads and at least Lq = {Lq} tokens, got {tuple(k.shape)}")
    if cache is not None and (not isinstance(cache, AttentionCache) or cache.owner != id(scheme)
                              or cache.batch_size != B):
        raise InputError("cache was made by another module or for another batch size: use module.new_cache(B)")


def general_forward(scheme, kernels, q, k, v, *, x=None, tokens=None, positions=None, document_ids=None,
                    cache=None, attn_mask=None, lay: Layout | None = None, span_ids=None) -> Tensor:
    """The call of the module docstring: q (B, Hq, Lq, D), k, v (B, Hkv, L, D) -> (B, Hq, Lq, D)."""
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if lay is None:
        lay = layout(scheme.heads, B, L, Lq, positions, document_ids, attn_mask, cache, q.device, scheme.axes, scheme,
                     span_ids)
    win = Window(lay, x, tokens, cache, q.device)
    vals = scheme.token_values(win, q.dtype)
    tr = transports(scheme, kernels, vals, lay, cache, q.dtype)
    if getattr(scheme, "remap", None) is not None:  # rotated per regime, block by block (remap_scores)
        tr = tr._replace(rots=[])
    bi = biases(scheme, vals, lay, cache)
    if tr.per_head and Hkv != Hq:  # transports differ per query head: one transported key per query head
        k, v = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    tau = None if vals.tau is None else last_tokens(vals.tau, Lq, -1)
    sink = sink_column(scheme, q, tau)
    qc = q if scheme.cope_max_pos is not None else None  # CoPE reads the query as given
    q, k, v, undo = transport_qkv(kernels, tr, q, k, v)
    q = scale_by_temperature(q, tau)
    if tr.householder is not None:
        o = path_attend(scheme, kernels, q, k, v, tr.householder, bi.coord, lay, cache, sink)
    else:
        o = distance_attend(scheme, kernels, q, k, v, bi, lay, cache)
        if o is None:
            o = attend_blocks(scheme, q, k, v, bi, lay, cache, sink, qc)
    o = undo_values(kernels, undo, o)
    if cache is not None:
        update_cache(cache, lay, tr, bi, win, scheme.conv_history)
        if shape_of(scheme) is not None:
            trim_cache(cache, shape_of(scheme))
    return o
