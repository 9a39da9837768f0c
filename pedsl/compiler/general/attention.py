"""Attention in the general forward: every key (cached then new), the masks of a block of queries, SDPA or
the scored rows of a block, and the dispatch to the banded, flash, distance-table and MLP kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from pedsl.compiler.kernel_support import (band_call, bias_call, causal_call, consecutive, explicit_scores,
                                           fresh_sequence_call, mlp_call, window_call)
from pedsl.compiler.general.masks import seen_both_ways
from pedsl.compiler.general.remap import RemappedKeys
from pedsl.compiler.scores import modified_scores, normalised, own_key_counts
from pedsl.ops.flash import flash_supports
from pedsl.ops.window_kernels import banded_attention
from pedsl.compiler.general.inputs import Layout, document_ids_vary, last_tokens
from pedsl.compiler.general.cache import append_layout, cached, check_cache
from pedsl.compiler.general.windows import key_starts, shape_of, visible
from pedsl.compiler.general.bias import Biases, axis_rows, bias_rows, distance_tables, key_axis_rows, run_length
from pedsl.compiler.general.relative import relative_call, relative_rows, relative_scale

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.mask_side import MaskSide
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

# <embedded>
# ---------------------------------------------------------------------- attention
QUERY_CHUNK = 256  # queries per block of explicit masks (memory: B * H * 256 * L_keys)
WINDOW_BLOCK = 128  # queries per block of a windowed call (keys per block: WINDOW_BLOCK + window - 1)


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
                 shape=None, k0: int = 0, scheme: MaskSide | None = None, kspan=None):
    """Boolean (B, 1|H, r1 - r0, Lk) mask of the query rows r0..r1 over the keys k0..k0 + Lk (``kpos``,
    ``kdoc``, ``kvalid``, ``kspan`` are those keys'), or None when every key is allowed. ``shape``: the scheme's
    (window, chunk), or None; ``scheme``: its mask widens the causal one (pedsl.compiler.general.masks)."""
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
    return o if vs is None or ws is None else o + ws.to(V.dtype) * vs  # ws: the sink's weight, given a sink


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


def window_attend(band, ready, q, K, V, window: int | None, chunk: int | None) -> Tensor:
    """A band whose bulk no mask cuts: a sliding window on the C++ band kernel ``band`` (None: not there) where its
    call check (:func:`band_call`) takes it and ``ready()`` says the kernels are built, else (and a chunk) the
    flash path's banded calls."""
    if band is not None and ready is not None and window is not None and band_call(q, K, V, window) and ready():
        return band(q, K, V, window)
    return banded_attention(q, K, V, window, chunk)


def attend_blocks(scheme: SchemeSide, q, k, v, bi: Biases, lay: Layout, cache, sink=None, qc=None,
                  kernels: Kernels | None = None):
    """Attention of the queries over every key, the cache's and this call's, by blocks of queries (with
    a window or chunk: each block over the span of keys it can see, O(L N) time and memory; an unmasked band on
    :func:`window_attend`). ``qc``: the queries as given (before transports and temperature), which CoPE's
    embedding term reads. ``kernels``: whose band kernel a band may run on, and whose C++ causal kernel takes a
    fresh call where it can (:func:`rows_attend`); None: the flash path and the blocks only."""
    Hq, Lq = q.shape[1], q.shape[2]
    L = k.shape[2]
    Lc = cache.length if cache is not None else 0
    shape, cap = shape_of(scheme), scheme.softcap
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
    if shape is not None and causal_call(fast, "flash-window", q, fresh, one_doc, unmasked) and window_call(
            fast, flash_supports(q), shape.window, shape.chunk, lay.positions):  # the band, no mask on its bulk
        cpp_band, cpp_ready = (None, None) if kernels is None else (kernels.band_attention, kernels.bias_ready)
        return window_attend(cpp_band, cpp_ready, q, K, V, shape.window, shape.chunk)
    if kernels is not None and fresh and one_doc and unmasked:
        o = rows_attend(scheme, kernels, q, K, V, bi, lay, sink)
        if o is not None:
            return o
    qpos_all = last_tokens(lay.positions, Lq, 1)
    cq_all = None if bi.coord is None else last_tokens(bi.coord, Lq, -1)
    tables = distance_tables(scheme, bi.tables, qpos_all, kpos)
    qax = last_tokens(axis_rows(lay), Lq, -1) if bi.axial else None
    kax = key_axis_rows(cache, lay, kpos) if bi.axial else None
    band = shape if shape is not None and not shape.symmetric else None  # a symmetric window: every key span, masked
    block = WINDOW_BLOCK if band is not None else QUERY_CHUNK
    starts = None if band is None else key_starts(band, lay, kpos, kdoc, key_validity(lay, kvalid, Lc), Lq, block)
    kspan = all_spans(cache, lay, Lc)
    q0 = Lc + L - Lq
    # explicit scores are formed for every key of the span: stop at the block's last query (causal)
    explicit = explicit_scores(scheme.normalize, scheme.cope_max_pos)
    last = (lambda r1: q0 + r1) if explicit else (lambda r1: Lc + L)
    remapped = RemappedKeys(scheme, K, kpos, lay.n) if scheme.remap_bounds else None
    rel = None if scheme.relative is None else relative_call(scheme, q, K, qpos_all, kpos)
    scale = None if scheme.relative is None else relative_scale(scheme, q.shape[-1])
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
        if rel is not None and scale is not None:  # content-position terms, scaled as the raw scores SDPA scales
            term = relative_rows(scheme, rel, q[:, :, r0:r1], qpos_all[:, r0:r1], kp, k0, k1) * scale
            bias = term.to(q.dtype) if bias is None else bias + term.to(q.dtype)
        if explicit:  # key index k - k0 of this span; the query's own key is q0 + r - k0
            outs.append(explicit_rows(scheme, q[:, :, r0:r1], K[:, :, k0:k1], V[:, :, k0:k1], mask, bias,
                                      q0 + r0 - k0, None if qc is None else qc[:, :, r0:r1]))
            continue
        if remapped is not None:
            outs.append(remapped.rows(q[:, :, r0:r1], qpos_all[:, r0:r1], k0, k1, V[:, :, k0:k1], mask, bias,
                                      sink_rows(sink, r0, r1), cap))
            continue
        outs.append(attend(q[:, :, r0:r1], K[:, :, k0:k1], V[:, :, k0:k1], mask, bias, scale=scale,
                           sink=sink_rows(sink, r0, r1), softcap=cap))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def rows_attend(scheme: SchemeSide, kernels: Kernels, q, K, V, bi: Biases, lay: Layout, sink):
    """A fresh call of one document, no padding or mask (the caller checked), on the kernels' C++ causal kernel
    with everything in its rows (kernel_support's ``bias``): the coordinate biases ``c_i - c_j`` as its key term
    ``-c``, the distance tables summed once (H, distances), the soft cap, a sink logit column (GPT-OSS's, softmax
    plus one's zeros) and a sliding window. None where the call holds what it does not compute (biases reading the
    query position or per-axis distances, a sink with a value, a chunk; tables or a window at positions that
    do not count up by one) or the kernel is not there (a generated module)."""
    run = kernels.bias_attention
    shape = shape_of(scheme)
    if run is None or bi.queries or bi.axial or (sink is not None and sink[1] is not None):
        return None
    if shape is not None and (shape.chunk is not None or shape.symmetric):
        return None
    if (shape is not None or bi.tables) and not consecutive(lay.positions):
        return None
    if not bias_call(scheme.fast_paths, kernels, q, K, V):  # asked last: the first ask builds the C++ kernels
        return None
    tables = list(distance_tables(scheme, bi.tables, lay.positions, lay.positions).values())
    return run(q, K, V, key_term=None if bi.coord is None else -bi.coord,
               table=sum(tables[1:], tables[0]) if tables else None, sink=None if sink is None else sink[0],
               cap=scheme.softcap, window=None if shape is None else shape.window)


def all_spans(cache, lay: Layout, Lc: int):
    """Every key's span key, the cache's then this call's (after all_keys appended them), or None."""
    if lay.spans is None or not Lc:
        return lay.spans
    return cached(cache, "span", Lc + lay.spans.shape[1])


def distance_attend(scheme: SchemeSide, kernels: Kernels, q, k, v, bi: Biases, lay: Layout, cache):
    """Biases that are all distance tables, over one fresh causal sequence, on the kernels' Toeplitz kernel
    (the tables summed once (H, distances), each block of queries reading its rows as a view of it); or one
    bias of FIRE's form on the kernels' MLP-bias kernel (:func:`query_mlp_attend`). None where the call
    needs :func:`attend_blocks` (what the two kernels take: their declarations and call checks in
    ``kernel_support``)."""
    if bi.queries:
        return query_mlp_attend(scheme, kernels, q, k, v, bi, lay, cache)
    if bi.coord is not None:  # coordinate biases: rows_attend, inside attend_blocks (with a sink, cap or window)
        return None
    toeplitz, in_rows = kernels.distance_attention, kernels.bias_attention
    if toeplitz is None or not fresh_sequence_call(scheme.fast_paths, "distance", kernels, q, k, lay, cache):
        return None
    pos = lay.positions
    tables = list(distance_tables(scheme, bi.tables, pos, pos).values())
    table = sum(tables[1:], tables[0])
    if in_rows is not None and bias_call(scheme.fast_paths, kernels, q, k, v):  # the table inside the C++ kernel's rows
        return in_rows(q, k, v, table=table)
    return toeplitz(q, k, v, table)


def query_mlp_attend(scheme: SchemeSide, kernels: Kernels, q, k, v, bi: Biases, lay: Layout, cache):
    """One bias ``mlp(u(distance) * w(query_position))`` with one hidden ReLU layer (FIRE; the scheme's
    ``query_mlp``) and no other bias, over one fresh causal sequence whose rows all start at the same
    position (w reads it), on the kernels' MLP-bias kernel. None otherwise."""
    mlp = kernels.mlp_attention
    if mlp is None or scheme.query_mlp is None or not mlp_call(scheme.fast_paths, kernels, q, k, lay, cache):
        return None
    factors = scheme.query_mlp(bi.queries[0], lay.positions[0], q.device)
    return None if factors is None else mlp(q, k, v, *factors)


def explicit_rows(scheme: SchemeSide, q, K, V, mask, bias, q0: int, qc=None) -> Tensor:
    """Attention of a block of queries (global token index q0, q0 + 1, ...) over every key when the weights
    are not a softmax of a bias known beforehand (stick-breaking, sigmoid, CoPE): key j counts for query i when j <= i
    (j < i for stick-breaking without ``attend_current``) and ``mask`` allows it; no key gives zeros."""
    Lk, rows = K.shape[2], q.shape[2]
    qi = torch.arange(q0, q0 + rows, device=q.device)[:, None]
    kj = torch.arange(Lk, device=q.device)[None, :]
    ok = ((kj <= qi) if own_key_counts(scheme.attend_current, scheme.normalize) else (kj < qi))[None, None]
    ok = ok if mask is None else ok & mask
    emb = scheme.contextual_embedding if scheme.cope_max_pos is not None else None
    return scored_rows(q, K, V, ok, bias, cap=scheme.softcap, normalize=scheme.normalize,
                       qc=qc, emb=emb, sigmoid_bias=scheme.sigmoid_bias)


def key_validity(lay: Layout, kvalid, Lc: int):
    """Every key's validity (the cached keys' as this call's (B, cached + L) mask says), or None."""
    if lay.key_valid_cached is None:
        return kvalid
    kv = lay.key_valid_cached
    rest = lay.valid if kvalid is None else kvalid[:, Lc:]
    return torch.cat([kv if kvalid is None else kvalid[:, :Lc] & kv, rest], dim=1)
# </embedded>
