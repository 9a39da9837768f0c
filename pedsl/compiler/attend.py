"""Attention over the cached and new keys of a general call: the keys, the boolean mask of
allowed keys per block of queries, float64 bias rows, and SDPA with fully-masked rows giving zeros."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pedsl.compiler.cache import append_tokens, cached
from pedsl.compiler.inputs import Layout, document_ids_vary, last_tokens
from pedsl.compiler.shapes import as_hd as _as_hd
from pedsl.errors import ShapeError

F64 = torch.float64
QUERY_CHUNK = 256  # queries per block of explicit masks (memory: B * H * 256 * L_keys)


def all_keys(cache, lay, k, v, coord, Lc: int):
    """All keys of the call: cached ones then this call's (the new ones keep their autograd graph)."""
    if cache is None:
        return k, v, lay.positions, lay.docs, lay.valid, coord
    if cache.batch_size != k.shape[0]:
        raise ShapeError(f"cache: it was made for batch size {cache.batch_size}, this call has {k.shape[0]}",
                         hint="make one cache per sequence batch: module.new_cache(batch_size)")
    if cache.heads_kv is not None and cache.heads_kv != k.shape[1]:
        raise ShapeError(f"cache: it holds keys of {cache.heads_kv} heads, this call gives {k.shape[1]}",
                         hint="use the same number of key/value heads for every call with one cache")
    if Lc == 0:
        append_tokens(cache, lay, k, v, coord)
        return k, v, lay.positions, lay.docs, lay.valid, coord
    grad = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or
                                         (coord is not None and coord.requires_grad))
    old = [cached(cache, n, Lc) for n in ("k", "v", "pos", "doc", "valid", "coord")] if grad else None
    append_tokens(cache, lay, k, v, coord)
    if not grad:
        # the appended buffers already hold every key: no copy
        full = [cached(cache, n, Lc + k.shape[2]) for n in ("k", "v", "pos", "doc", "valid", "coord")]
        return tuple(full)
    cat = lambda a, b, d: None if b is None else torch.cat([a.to(b.dtype), b], dim=d)  # noqa: E731
    return (cat(old[0], k, 2), cat(old[1], v, 2), cat(old[2], lay.positions, 1), cat(old[3], lay.docs, 1),
            cat(old[4], lay.valid, 1), cat(old[5], coord, 2))


def allowed_mask(lay: Layout, Lc: int, L: int, r0: int, r1: int, Lq: int, kpos, kdoc, kvalid, multi_doc: bool):
    """Boolean (B, 1|H, r1 - r0, Lk) mask of the query rows r0..r1, or None when every key is allowed."""
    Lk = Lc + L
    B = lay.valid.shape[0]
    m = None
    q0 = Lc + L - Lq  # global index of query row 0
    if Lq > 1 and not (r1 - r0 == 1 and r0 == Lq - 1):
        qi = torch.arange(q0 + r0, q0 + r1, device=kpos.device)
        m = (torch.arange(Lk, device=kpos.device)[None, :] <= qi[:, None])[None, None]
    if multi_doc:
        qd = lay.docs[:, L - Lq + r0: L - Lq + r1]
        d = (qd[:, :, None] == kdoc[:, None, :])[:, None]
        m = d if m is None else m & d
    kv = kvalid
    if lay.key_valid_cached is not None:
        if kv is None:
            kv = torch.ones(B, Lk, dtype=torch.bool, device=kpos.device)
        kv = torch.cat([kv[:, :Lc] & lay.key_valid_cached, kv[:, Lc:]], dim=1)
    if kv is not None and not bool(kv.all()):
        m = kv[:, None, None, :] if m is None else m & kv[:, None, None, :]
    if lay.mask4 is not None:
        m4 = lay.mask4[:, :, r0:r1]
        m = m4 if m is None else m & m4
    return m


def bias_rows(mod, tables, coord_q, kcoord, qpos, kpos, dtype):
    """Float64 biases (B, H, rows, Lk) of a block of queries, cast to ``dtype`` at the end."""
    bias = None
    if kcoord is not None:
        bias = coord_q.unsqueeze(-1) - kcoord.unsqueeze(-2)
    if tables:
        dist = (qpos[:, :, None] - kpos[:, None, :]).clamp(min=0)  # (B, rows, Lk)
        top = int(dist.max()) + 1 if dist.numel() else 1
        for b in tables:
            term = mod.evaluator.run(b.site.expr, mod._ctx(top, device=kpos.device), b.site.name)
            tab = _as_hd(term, top, mod.heads).to(F64)  # (H, top)
            full = tab[:, dist].permute(1, 0, 2, 3)  # (B, H, rows, Lk)
            bias = full if bias is None else bias + full
    return None if bias is None else bias.to(dtype)


def attend(q, k, v, mask, bias, scale=None):
    """SDPA of a block of queries with a boolean mask and an additive bias; rows with no key give zeros."""
    Hq, Hk = q.shape[1], k.shape[1]
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


def sdpa_forward(mod, q, k, v, coord, tables, lay: Layout, cache, Lq):
    B, Hq, _, D = q.shape
    L = k.shape[2]
    Lc = cache.length if cache is not None else 0
    K, V, kpos, kdoc, kvalid, kcoord = all_keys(cache, lay, k, v, coord, Lc)
    if cache is not None and Lc and cache.one_doc and lay.docs is cache._doc_view:
        multi_doc = False  # decoding inside the cached document
    else:
        multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    if cache is not None and Lc and cache.all_valid and not lay.padded:
        kvalid = None
    qpos_all = last_tokens(lay.positions, Lq, 1)
    cq_all = None if coord is None else last_tokens(coord, Lq, -1)
    outs = []
    for r0 in range(0, Lq, QUERY_CHUNK):
        r1 = min(Lq, r0 + QUERY_CHUNK)
        mask = allowed_mask(lay, Lc, L, r0, r1, Lq, kpos, kdoc, kvalid, multi_doc)
        if mask is None and r1 - r0 > 1 and Lq == Lc + L and r0 == 0 and not tables and kcoord is None:
            outs.append(F.scaled_dot_product_attention(q[:, :, r0:r1], K, V, is_causal=True,
                                                       enable_gqa=Hq != K.shape[1]))
            continue
        bias = bias_rows(mod, tables, None if cq_all is None else cq_all[..., r0:r1], kcoord,
                          qpos_all[:, r0:r1], kpos, q.dtype)
        outs.append(attend(q[:, :, r0:r1], K, V, mask, bias))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
