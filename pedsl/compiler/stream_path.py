"""PaTH in the general forward: the blockwise kernel for a fresh full sequence, the decode rule
token by token otherwise, and the in-place decode with lazily applied Householder steps."""

from __future__ import annotations

import torch

from pedsl.compiler.attend import all_keys, allowed_mask, attend
from pedsl.compiler.cache import append_layout, cached
from pedsl.compiler.inputs import Layout, document_ids_vary
from pedsl.compiler.shapes import angle_dtype as _angle_dtype

F64 = torch.float64
HARD_RESET = float("-inf")  # a log-gate that forgets everything before it (the PaTH kernel clamps it)


def path_forward(mod, q, k, v, hh, coord, lay: Layout, cache, Lq):
    """PaTH: the blockwise kernel for a fresh full sequence (packed documents and left padding become
    hard resets of the log-gate), otherwise the decode rule token by token: each new token's step
    ``H_t`` moves every earlier key, ``Kt <- Kt - beta_t (Kt w_t) w_t^T``, then its query attends."""
    from pedsl.ops.path import path_attention, path_transported_keys

    w, beta = hh
    B, H, L, D = k.shape
    Lc = cache.length if cache is not None else 0
    left_pad = not lay.padded or bool((lay.valid.long().diff(dim=1) >= 0).all())
    if Lc == 0 and Lq == L and lay.mask4 is None and lay.key_valid_cached is None and left_pad:
        lf = None
        if coord is not None:
            lf = torch.diff(coord, dim=-1, prepend=coord[..., :1])
        start = torch.zeros_like(lay.valid)
        start[:, 1:] = (lay.docs[:, 1:] != lay.docs[:, :-1]) | (lay.valid[:, 1:] & ~lay.valid[:, :-1])
        if bool(start.any()):
            lf = torch.zeros(B, H, L, dtype=F64, device=q.device) if lf is None else lf.clone()
            lf = lf.masked_fill(start[:, None, :].expand(B, H, L), HARD_RESET)
        o = path_attention(q, k, v, w, beta, lf)
        if lay.padded:
            o = o * lay.valid[:, None, :, None].to(o.dtype)
        if cache is not None:  # half-precision calls keep PaTH's cache in float32 (steps accumulate there)
            cdt = _angle_dtype(k.dtype)
            all_keys(cache, lay, path_transported_keys(k.to(cdt), w.to(cdt), beta.to(cdt)), v.to(cdt), coord, 0)
        return o
    # the decode rule
    if cache is not None and (cache.batch_size != B or (cache.heads_kv is not None and cache.heads_kv != H)):
        all_keys(cache, lay, k, v, coord, Lc)  # raises the error
    Kt = cached(cache, "k", Lc) if Lc else k[:, :, :0]
    Vc = cached(cache, "v", Lc) if Lc else v[:, :, :0]
    pos_c = cached(cache, "pos", Lc) if Lc else lay.positions[:, :0]
    doc_c = cached(cache, "doc", Lc) if Lc else lay.docs[:, :0]
    val_c = cached(cache, "valid", Lc) if Lc else lay.valid[:, :0]
    co_c = (cached(cache, "coord", Lc) if Lc else coord[..., :0]) if coord is not None else None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w, beta))
    if cache is not None and not grad and (Lc == 0 or cache._buf["k"].dtype == _angle_dtype(k.dtype)):
        cdt = _angle_dtype(k.dtype)  # half precision: the cache and the pending product in float32
        return path_decode_inplace(*(t.to(cdt) for t in (q, k, v, w, beta)), coord, lay, cache, Lq).to(q.dtype)
    if cache is not None and cache.path_pending is not None:
        path_flush(cache, cache.path_flushed, cache.path_pending)
    if grad or Kt.dtype != k.dtype:
        Kt = Kt.to(k.dtype).clone()
    kpos = torch.cat([pos_c, lay.positions], 1)
    kdoc = torch.cat([doc_c, lay.docs], 1)
    kvalid = torch.cat([val_c, lay.valid], 1)
    kco = None if coord is None else torch.cat([co_c, coord], -1)
    Vall = torch.cat([Vc.to(v.dtype), v], 2)
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
        mask = allowed_mask(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc)
        mask = None if mask is None else mask[..., :n]  # keys after this query are not moved yet (causal)
        bias = None if kco is None else (kco[..., Lc + t: Lc + t + 1].unsqueeze(-1) - kco[..., :n].unsqueeze(-2)).to(q.dtype)
        outs.append(attend(q[:, :, r: r + 1], Kt, Vall[:, :, :n], mask, bias))
    if cache is not None:
        cache.heads_kv = H
        cache.put("k", Kt.detach(), 0)  # every key moved to the newest token
        append_layout(cache, lay, v, coord)
    return torch.cat(outs, dim=2)


PATH_FLUSH = 32  # PaTH decoding: pending Householder steps applied to the cached keys every this many tokens


def path_flush(cache, nf: int, P) -> None:
    """Apply the pending product ``P`` of PaTH steps to the first ``nf`` keys (those cached before the
    last flush): ``K <- K P^T``. Afterwards every cached key is transported to the newest token."""
    if P is not None and nf:
        Kf = cached(cache, "k", nf).flatten(0, 1)
        Kf.copy_(torch.bmm(Kf, P.transpose(1, 2)))
    cache.path_pending, cache.path_flushed = None, None


def path_decode_inplace(q, k, v, w, beta, coord, lay: Layout, cache, Lq):
    """The decode rule without autograd, on the cache's own buffers, with the steps applied lazily.

    The keys cached before the last flush are stored as transported to the flush point f; the
    steps since then are kept as one D x D product ``P = H_t ... H_(f+1)`` per head (D^2 per token),
    so a query scores them through ``P^T q`` (``q . P K_j = (P^T q) . K_j``: one pass over the cache,
    as SDPA); the few keys cached since the flush are moved eagerly, and every ``PATH_FLUSH`` tokens
    ``K <- K P^T`` brings all keys up to date (two passes, amortised). Per token and head about
    2 + 3 / PATH_FLUSH passes over the cache against SDPA's two."""
    B, H, L, D = k.shape
    Z = B * H
    Lc = cache.length
    cache.heads_kv = H
    append_layout(cache, lay, v, coord)
    total = Lc + L
    kpos, kdoc, kvalid = (cached(cache, n, total) for n in ("pos", "doc", "valid"))
    kco = cached(cache, "coord", total) if coord is not None else None
    multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    scale = D ** -0.5
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
            qt = q[:, :, r].reshape(Z, D, 1)
            Kall = cached(cache, "k", n + 1).flatten(0, 1)  # (Z, n + 1, D)
            if nf and P is not None:
                s = torch.cat([torch.bmm(Kall[:, :nf], torch.bmm(P.transpose(1, 2), qt)),
                               torch.bmm(Kall[:, nf:], qt)], 1)
            else:
                s = torch.bmm(Kall, qt)
            s = s.view(B, H, 1, n + 1) * scale
            if kco is not None:
                s = s + (kco[..., n: n + 1].unsqueeze(-1) - kco[..., : n + 1].unsqueeze(-2)).to(s.dtype)
            mask = allowed_mask(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc)
            ok = None
            if mask is not None:
                mask = mask[..., : n + 1]
                s = s.masked_fill(~mask, float("-inf"))
                ok = mask.any(-1, keepdim=True)
                s = s.masked_fill(~ok, 0.0)
            p = torch.softmax(s, dim=-1)
            if ok is not None:
                p = p * ok
            o = torch.bmm(p.reshape(Z, 1, n + 1), cached(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
            outs.append(o.view(B, H, 1, D))
        if n + 1 - nf >= PATH_FLUSH:
            path_flush(cache, nf, P)
            nf, P = n + 1, None
    cache.path_pending, cache.path_flushed = P, nf
    return torch.cat(outs, dim=2)
