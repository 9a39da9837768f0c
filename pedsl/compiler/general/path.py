"""PaTH in the general forward: its blockwise kernel on a fresh sequence, inside a window, and its decode
rule (pending Householder steps on the cached keys, applied every PATH_FLUSH tokens)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pedsl.compiler.kernel_support import path_call
from pedsl.compiler.general.inputs import F64, Layout, angle_dtype, document_ids_vary
from pedsl.compiler.general.cache import AttentionCache, append_layout, cached, check_cache, path_flush, stored
from pedsl.compiler.general.windows import Shape, key_starts, shape_of, visible_pairs
from pedsl.compiler.general.attention import all_keys, allowed_mask, attend, sink_rows
from pedsl.ops.path_decode import FUSED_FLUSH, fused_path_scores

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

# <embedded>
# ---------------------------------------------------------------------- path
PATH_BLOCK = 64  # PaTH inside a window: steps per block of the windowed kernel
PATH_FLUSH = FUSED_FLUSH  # PaTH decoding: pending Householder steps applied to the cached keys every this many tokens
HARD_RESET = float("-inf")  # a log-gate that forgets everything before it (the PaTH kernel clamps it)


def path_attend(scheme: SchemeSide, kernels: Kernels, q, k, v, hh, coord, lay: Layout, cache, sink=None):
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
        assert shape is not None  # the kernel's declaration needs a window or a chunk (kernel_support)
        return _path_local(kernels, q, k, v, w, beta, coord, lay, cache, shape, sink)
    if run == "path-blockwise":
        return _path_blockwise(kernels, q, k, v, w, beta, coord, lay, cache)
    if cache is not None:
        check_cache(cache, B, H)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w, beta))
    if cache is not None and not grad and (Lc == 0 or cache._buf["k"].dtype == angle_dtype(k.dtype)):
        cdt = angle_dtype(k.dtype)  # half precision: the cache and the pending product in float32
        sink = None if sink is None else (sink[0].to(cdt), None if sink[1] is None else sink[1].to(cdt))
        qd, kd, vd, wd, bd = (t.to(cdt) for t in (q, k, v, w, beta))
        return path_decode_inplace(qd, kd, vd, wd, bd, coord, lay, cache, shape, sink).to(q.dtype)
    return _path_decode_rule(q, k, v, w, beta, coord, lay, cache, grad, shape, sink)


def _path_blockwise(kernels: Kernels, q, k, v, w, beta, coord, lay: Layout, cache):
    B, H, L, _ = k.shape
    lf = None
    if coord is not None:
        lf = torch.diff(coord, dim=-1, prepend=coord[..., :1])
    start = torch.zeros_like(lay.valid)
    start[:, 1:] = (lay.docs[:, 1:] != lay.docs[:, :-1]) | (lay.valid[:, 1:] & ~lay.valid[:, :-1])
    if bool(start.any()):
        lf = torch.zeros(B, H, L, dtype=F64, device=q.device) if lf is None else lf.clone()
        lf = lf.masked_fill(start[:, None, :].expand(B, H, L), HARD_RESET)
    kernel = kernels.path_attention
    assert kernel is not None  # path_call chose path-blockwise: the kernels have it
    o = kernel(q, k, v, w, beta, lf)
    if lay.padded:  # left padding: its queries see no key
        o = o * lay.valid[:, None, :, None].to(o.dtype)
    return _path_prefilled(kernels, o, k, v, w, beta, coord, lay, cache)


def _path_prefilled(kernels: Kernels, o, k, v, w, beta, coord, lay: Layout, cache):
    """A fresh sequence's PaTH output ``o``; a cache gets every key moved to the last token."""
    if cache is not None:  # half-precision calls keep PaTH's cache in float32 (steps accumulate there)
        cdt = angle_dtype(k.dtype)
        transported = kernels.path_transported_keys
        assert transported is not None  # every supplier of PaTH's blockwise kernels supplies it beside them
        all_keys(cache, lay, transported(k.to(cdt), w.to(cdt), beta.to(cdt)), v.to(cdt), coord, 0)
    return o


def _path_local(kernels: Kernels, q, k, v, w, beta, coord, lay: Layout, cache, shape: Shape, sink):
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
    kernel = kernels.path_local_attention
    assert kernel is not None  # path_call chose path-window: the kernels have it
    o = kernel(q, k, v, w, beta, lf, reach=reach, allowed=allowed, sink=sink, block_size=PATH_BLOCK)
    return _path_prefilled(kernels, o, k, v, w, beta, coord, lay, cache)


def _path_decode_rule(q, k, v, w, beta, coord, lay: Layout, cache, grad: bool, shape=None, sink=None):
    """The decode rule with autograd (or without a cache): every earlier key moved by each new step."""
    B, H, L, D = k.shape
    Lq = q.shape[2]
    Lc = cache.length if cache is not None else 0
    old = {n: stored(cache, n, Lc) for n in ("k", "v", "pos", "doc", "valid")} if Lc else {}
    if cache is not None and cache.path_pending is not None:
        path_flush(cache, cache.path_flushed or 0, cache.path_pending)
    Kt = old["k"] if Lc else k[:, :, :0]
    if grad or Kt.dtype != k.dtype:
        Kt = Kt.to(k.dtype).clone()
    kpos = torch.cat([old["pos"], lay.positions], 1) if Lc else lay.positions
    kdoc = torch.cat([old["doc"], lay.docs], 1) if Lc else lay.docs
    kvalid = torch.cat([old["valid"], lay.valid], 1) if Lc else lay.valid
    kco = None if coord is None else (torch.cat([stored(cache, "coord", Lc), coord], -1) if Lc else coord)
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
    kpos, kdoc, kvalid = (stored(cache, n, total) for n in ("pos", "doc", "valid"))
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
                R = stored(cache, "k", n).narrow(2, nf, n - nf).flatten(0, 1)  # (Z, n - nf, D)
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
    """One query (B, H, D) over the n + 1 cached keys, the first nf of them scored through ``P^T q``: on torch's
    fused kernel where it applies (no bias, mask or sink), else by explicit scores."""
    fused = fused_path_scores(stored(cache, "k", n + 1), stored(cache, "v", total).narrow(2, 0, n + 1), q, P, nf,
                              mask=mask, bias=kco, sink=sink)
    if fused is not None:
        return fused
    B, H, D = q.shape
    Z = B * H
    qt = q.reshape(Z, D, 1)
    Kall = stored(cache, "k", n + 1).flatten(0, 1)  # (Z, n + 1, D)
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
        o = torch.bmm(p[..., :-1].reshape(Z, 1, n + 1), stored(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
        if sink[1] is not None:
            o = o + p[..., -1:].reshape(Z, 1, 1) * sink[1].expand(B, H, 1, D).reshape(Z, 1, D)
        return o.view(B, H, 1, D)
    p = torch.softmax(s, dim=-1)
    if ok is not None:
        p = p * ok
    o = torch.bmm(p.reshape(Z, 1, n + 1), stored(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
    return o.view(B, H, 1, D)
# </embedded>
