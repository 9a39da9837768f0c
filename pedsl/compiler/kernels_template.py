"""Kernels copied verbatim into every module that `pedsl compile` writes (torch only).

Kept as a real module so it is linted and importable; codegen copies the text
after the ``# ----`` banner.
"""

import math

import torch
import torch.nn.functional as F

# what every generated module defines above the kernels (placeholders here, so this file imports)
HEADS = HEAD_DIM = CONV_HISTORY = 0
TRANSFORMS = BIASES = ()

# ---------------------------------------------------------------------------------------------
# Kernels. Every value below is a tensor laid out as (batch, head, position, distance, pair|chan),
# with size-1 dimensions where it does not vary, so arithmetic broadcasts by axis.
# ---------------------------------------------------------------------------------------------
F64 = torch.float64
TWO_PI = 2.0 * math.pi


def _axis(values, axis, device):
    """A constant vector as a 5-d tensor along 'pair' (last) or 'head' (second)."""
    t = torch.as_tensor(values, dtype=F64, device=device)
    return t.view(1, 1, 1, 1, -1) if axis == "pair" else t.view(1, -1, 1, 1, 1)


def _distances(L, device):
    return torch.arange(L, dtype=F64, device=device).view(1, 1, 1, L, 1)


def _t(v, device=None):
    return v if torch.is_tensor(v) else torch.tensor(float(v), dtype=F64, device=device)


def _frozen_token_table(seed, vocab_size, pairs):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, pairs, generator=g, dtype=F64)


def _frozen_position_table(seed, pairs, L, chunk=1024):
    """Standard normal values per (position, pair), generated in chunks so every prefix is stable."""
    parts = []
    for c in range(0, max(L, 1), chunk):
        g = torch.Generator().manual_seed(seed * 1_000_003 + c // chunk)
        parts.append(torch.randn(chunk, pairs, generator=g, dtype=F64))
    return torch.cat(parts)[:L]


def _per_head_site(module, inp, B, L, heads, width):
    """A learned map of x or of the tokens, one value per head (and pair or channel): (B, H, L, 1, W)."""
    out = module(inp)  # (B, L, H * W)
    return out.view(B, L, heads, width).permute(0, 2, 1, 3).unsqueeze(3)


def _frozen_at(seed, pairs, pos):
    """The position table read at the positions pos (B, 1, L, 1, 1): (B, 1, L, 1, P)."""
    p = pos[:, 0, :, 0, 0].long().clamp(min=0)
    table = _frozen_position_table(seed, pairs, int(p.max()) + 1 if p.numel() else 1).to(pos.device)
    return table[p].view(p.shape[0], 1, p.shape[1], 1, pairs)


def _shortconv(conv, v, seg):
    """Causal depthwise convolution over positions of v (B, H, L, 1, W), as a sum of shifted taps; a tap
    reads zeros across a document boundary or at padding (seg = (docs, valid), each (B, L))."""
    docs, valid = seg
    B, H, L, _, W = v.shape
    flat = v[:, :, :, 0, :].permute(0, 1, 3, 2).reshape(v.shape[0], H * W, L).to(conv.weight.dtype)
    flat = flat.expand(docs.shape[0], -1, -1)
    K = conv.weight.shape[-1]
    out = 0
    for s in range(min(K, L)):
        keep = F.pad(valid, (s, 0))[:, :L].clone()
        if s:
            keep[:, s:] &= docs[:, s:] == docs[:, :-s]
        out = out + F.pad(flat, (s, 0))[..., :L] * keep[:, None, :].to(flat.dtype) * conv.weight[:, 0, K - 1 - s, None]
    return out.reshape(-1, H, W, L).permute(0, 1, 3, 2).unsqueeze(3)


def _rotate(x, cos, sin, first, second):
    """Rotate channel pairs (first[k], second[k]) of x (B, H, L, D) by the angles behind cos/sin (..., L, P)."""
    xa, xb = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = xa * cos - xb * sin
    out[..., second] = xb * cos + xa * sin
    return out


def _geometric(base, pairs, device):
    """The geometric grid base^(-2k / (2 pairs)) as a 5-d tensor along 'pair'."""
    k = torch.arange(pairs, dtype=F64, device=device)
    return (base ** (-2.0 * k / (2 * pairs))).view(1, 1, 1, 1, pairs)


# ---------------------------------------------------------------------------------------------
# The forward: positions, documents, padding and attention masks, grouped-query attention, queries
# behind their keys, and the decoding cache (see the module's forward docstring).
# ---------------------------------------------------------------------------------------------
class Cache:
    """What one attention layer keeps between decoding calls: the keys as transported to the newest
    token, the values (rotated when values are transported), the token layout, the float64 bias
    coordinates c_j (b(i, j) = c_i - c_j), running cumulative angles and gate sums, and the last
    tokens' inputs for short convolutions. Make it with ``module.new_cache(batch_size)``."""

    def __init__(self, owner, batch_size):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"new_cache: batch_size must be a positive integer, got {batch_size!r}")
        self.owner, self.batch_size, self.length = id(owner), int(batch_size), 0
        self.k = self.v = self.pos = self.doc = self.valid = self.coord = None
        self.angles, self.gates, self.window = {}, {}, None
        self.last_pos = self.last_doc = None

    def __len__(self):
        return self.length


def _int_arg(name, t, B, L, device):
    if not torch.is_tensor(t) or tuple(t.shape) != (B, L) or t.is_floating_point():
        raise ValueError(f"{name} must be an integer tensor (B, L) = ({B}, {L}) for the L tokens of k and v")
    return t.to(device=device, dtype=torch.long)


def _bool_mask(m):
    if m.dtype == torch.bool:
        return m
    if not m.is_floating_point():
        return m != 0
    neg = (m == float("-inf")) | (m <= torch.finfo(m.dtype).min / 2)
    if not bool(((m == 0) | neg).all()):
        raise ValueError("attn_mask: a float mask must hold only 0 (attend) and -inf or the dtype's minimum (masked)")
    return ~neg


def _layout(B, L, Lq, heads, positions, document_ids, attn_mask, cache, dev):
    """positions, docs, valid (B, L) of this call's tokens; the mask parts; the run-time length n."""
    Lc = cache.length if cache is not None else 0
    total = Lc + L
    valid = torch.ones(B, L, dtype=torch.bool, device=dev)
    kv_cached = mask4 = None
    if attn_mask is not None:
        m = _bool_mask(attn_mask.to(dev))
        if m.dim() == 2 and tuple(m.shape) == (B, L):
            valid = m
        elif m.dim() == 2 and tuple(m.shape) == (B, total):
            valid, kv_cached = m[:, Lc:], m[:, :Lc]
        elif m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, heads) and tuple(m.shape[2:]) == (Lq, total):
            mask4 = m
        else:
            raise ValueError(f"attn_mask has shape {tuple(m.shape)}: use (B, L), (B, cached + L) or (B, 1|H, Lq, cached + L)")
    has_prev = cache is not None and cache.last_pos is not None
    if document_ids is None:
        docs = (cache.last_doc if has_prev else torch.zeros(B, dtype=torch.long, device=dev))[:, None].expand(B, L)
    else:
        docs = _int_arg("document_ids", document_ids, B, L, dev)
    ar = torch.arange(L, device=dev)
    lv = torch.cummax(torch.where(valid, ar, -1), dim=1).values
    prev = torch.cat([lv.new_full((B, 1), -1), lv[:, :-1]], dim=1)  # previous unpadded token (-1: the cache's)
    inside = prev >= 0
    prev_c = prev.clamp(min=0)
    prev_doc = torch.gather(docs, 1, prev_c)
    prev_ok = inside
    if has_prev:
        prev_doc = torch.where(inside, prev_doc, cache.last_doc[:, None])
        prev_ok = inside | (cache.last_pos >= 0)[:, None]
    same = prev_ok & (prev_doc == docs)
    if positions is None:  # index inside the document among unpadded tokens, continuing the cache
        c = torch.cumsum(valid.long(), dim=1)
        cm = torch.cummax(torch.where(valid & ~same, c - 1, torch.full_like(c, -(1 << 40))), dim=1).values
        base0 = torch.zeros(B, dtype=torch.long, device=dev)
        if has_prev:
            cont = (cache.last_pos >= 0) & (docs[:, 0] == cache.last_doc)
            base0 = torch.where(cont, -(cache.last_pos + 1), base0)
        pos = (c - 1 - torch.maximum(cm, base0[:, None])).clamp(min=0)
    else:
        pos = _int_arg("positions", positions, B, L, dev)
        prev_pos = torch.gather(pos, 1, prev_c)
        if has_prev:
            prev_pos = torch.where(inside, prev_pos, cache.last_pos[:, None])
        if bool((valid & same & (pos < prev_pos)).any()):
            raise ValueError("positions go backwards inside a document (a new sequence needs a new document id)")
    pv = pos[valid] if bool(valid.any()) else pos
    n = int(pv.max()) + 1 if pv.numel() else 1
    return dict(pos=pos, docs=docs, valid=valid, kv_cached=kv_cached, mask4=mask4, n=max(n, 1))


def _last(t, n, dim=-2):
    return t if t.shape[dim] == 1 else t.narrow(dim, t.shape[dim] - n, n)


def _rot(x, angles, first, second, dt):
    """Rotate pairs (first[k], second[k]) of x by float64 angles (..., L, P), cos/sin cast at the end."""
    adt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    return _rotate(x.to(adt), torch.cos(angles).to(adt), torch.sin(angles).to(adt), first, second).to(dt)


def _forward(mod, q, k, v, x, tokens, positions, document_ids, cache, attn_mask):
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if (Hq, D) != (HEADS, HEAD_DIM) or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"expected q (B, {HEADS}, Lq, {HEAD_DIM}) and k, v (B, Hkv, L, {HEAD_DIM}); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if Hq % Hkv or Lq > L:
        raise ValueError(f"k and v need a divisor of {Hq} heads and at least Lq = {Lq} tokens, got {tuple(k.shape)}")
    if cache is not None and (cache.owner != id(mod) or cache.batch_size != B):
        raise ValueError("cache was made by another module or for another batch size: use module.new_cache(B)")
    dev, dt = q.device, q.dtype
    lay = _layout(B, L, Lq, HEADS, positions, document_ids, attn_mask, cache, dev)
    # the inputs the expressions read: the cache's last tokens (short convolutions), then this call's
    win = dict(x=x, tokens=tokens, pos=lay["pos"], docs=lay["docs"], valid=lay["valid"])
    if cache is not None and cache.window is not None:
        win = {n: (None if t is None else torch.cat([cache.window[n].to(t.dtype), t], 1)) for n, t in win.items()}
    LW = win["pos"].shape[1]
    pos5 = win["pos"].to(F64).view(B, 1, LW, 1, 1)
    vals = mod._values(B, LW, win["x"], win["tokens"], pos5, (win["docs"], win["valid"]), lay["n"], dev, dt)
    valid = lay["valid"]
    # rotations (absolute angles) of q (its last Lq tokens), k and v
    rots, hh = [], None
    scales = []  # rotate(..., scale = m): q and k of the group times m (HF's attention factor)
    for i, (op, targets, first, second, chans, scale) in enumerate(TRANSFORMS):
        val = vals[f"t{i}"]
        if scale != 1:
            scales.append((chans, scale))
        if op == "rope-table":
            rots.append((targets, first, second, torch.remainder(_last(val[:, :, :, 0, :], L), TWO_PI)))
        elif op == "accumulated-so2":
            a = _last(val[:, :, :, 0, :], L).to(F64) * valid[:, None, :, None]
            A = torch.cumsum(a, dim=-2)
            if cache is not None and i in cache.angles:
                A = A + cache.angles[i].unsqueeze(-2)
            A = torch.remainder(A, TWO_PI)
            if cache is not None:
                cache.angles[i] = A[..., -1, :].detach()
            rots.append((targets, first, second, A))
        else:
            w_g, beta = val
            w = torch.zeros(B, HEADS, L, D, dtype=dt, device=dev)
            w[..., chans] = _last(w_g, L).to(dt)
            hh = (w, _last(beta, L, -1).to(dt) * valid[:, None, :])
    coord, tables = None, []
    for i, (op, node) in enumerate(BIASES):
        if op == "distance-table":
            tables.append(i)
            continue
        if op == "linear-distance":
            c = vals[f"b{i}"][None, :, None] * lay["pos"].to(F64)[:, None, :]  # slope * p: b(i, j) = c_i - c_j
        else:
            lg = _last(vals[f"b{i}"], L, -1).to(F64) * valid[:, None, :]
            c = torch.cumsum(lg, dim=-1)
            if cache is not None and i in cache.gates:
                c = c + cache.gates[i].unsqueeze(-1)
            if cache is not None:
                cache.gates[i] = c[..., -1].detach()
            c = c.expand(B, HEADS, L)
        coord = c if coord is None else coord + c
    if hh is not None or any(a.shape[1] > 1 for *_, a in rots):  # per-head transports: k, v per query head
        k, v = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    undo = []
    for targets, first, second, a in rots:
        q = _rot(q, _last(a, Lq), first, second, dt)
        k = _rot(k, a, first, second, dt)
        if targets == "qkv":
            v = _rot(v, a, first, second, dt)
            undo.append((first, second, _last(a, Lq)))
    for chans, scale in scales:
        s = torch.ones(D, dtype=dt, device=dev)
        s[chans] = scale
        q, k = q * s, k * s
    if "tau" in vals:
        ft = torch.promote_types(dt, torch.float32)  # half precision: multiply in float32, round once
        q = (q.to(ft) * _last(vals["tau"], Lq, -1).to(ft).unsqueeze(-1)).to(dt)
    # every key of the call: the cache's, then this call's
    Lc = cache.length if cache is not None else 0
    old = (cache.k, cache.v, cache.pos, cache.doc, cache.valid, cache.coord) if Lc else None
    cat = lambda a, b, d: b if a is None or b is None else torch.cat([a.to(b.dtype), b], d)  # noqa: E731
    kpos = cat(old and old[2], lay["pos"], 1)
    kdoc = cat(old and old[3], lay["docs"], 1)
    kvalid = cat(old and old[4], valid, 1)
    kco = None if coord is None else cat(old and old[5], coord, -1)
    if lay["kv_cached"] is not None:
        kvalid = torch.cat([kvalid[:, :Lc] & lay["kv_cached"], kvalid[:, Lc:]], 1)
    V = cat(old and old[1], v, 2)
    qd = _last(lay["docs"], Lq, 1)
    qpos = _last(lay["pos"], Lq, 1)
    rows = torch.arange(Lc + L - Lq, Lc + L, device=dev)

    def allowed(r0, r1, n):
        m = torch.arange(n, device=dev)[None, :] <= rows[r0:r1, None]
        m = m[None, None] & (qd[:, r0:r1, None] == kdoc[:, None, :n])[:, None] & kvalid[:, None, None, :n]
        return m if lay["mask4"] is None else m & lay["mask4"][:, :, r0:r1, :n]

    def bias(r0, r1, n):
        b = None if kco is None else _last(coord, Lq, -1)[..., r0:r1, None] - kco[..., None, :n]
        for i in tables:
            dist = (qpos[:, r0:r1, None] - kpos[:, None, :n]).clamp(min=0)
            tab = mod._table(i, int(dist.max()) + 1, dev)  # (H, distance)
            full = tab[:, dist].permute(1, 0, 2, 3)
            b = full if b is None else b + full
        return b

    if hh is None:
        K = cat(old and old[0], k, 2)
        outs = []
        for r0 in range(0, Lq, 256):  # blocks of queries: explicit masks and float64 biases, cast once
            r1 = min(Lq, r0 + 256)
            outs.append(_attend(q[:, :, r0:r1], K, V, allowed(r0, r1, Lc + L), bias(r0, r1, Lc + L)))
        o = torch.cat(outs, 2)
    else:  # PaTH: each token's step H_t moves every earlier key, Kt <- Kt - beta_t (Kt w_t) w_t^T
        w, beta = hh
        K = old[0].to(dt) if Lc else k[:, :, :0]
        outs = []
        for t in range(L):
            if K.shape[2]:
                K = K - (beta[:, :, t, None, None] * (K @ w[:, :, t, :, None])) * w[:, :, t, None, :]
            K = torch.cat([K, k[:, :, t:t + 1]], 2)
            r = t - (L - Lq)
            if r >= 0:
                outs.append(_attend(q[:, :, r:r + 1], K, V[:, :, :Lc + t + 1], allowed(r, r + 1, Lc + t + 1),
                                    bias(r, r + 1, Lc + t + 1)))
        o = torch.cat(outs, 2)
    for first, second, a in reversed(undo):  # R(A_i)^T at the query's angle
        o = _rot(o, -a, first, second, dt)
    if cache is not None:
        cache.k, cache.v = K.detach(), V.detach()
        cache.pos, cache.doc, cache.valid = kpos, kdoc, cat(old and old[4], valid, 1)
        cache.coord = None if kco is None else kco.detach()
        cache.length += L
        keep = min(CONV_HISTORY, LW)
        cache.window = None if not keep else {n: (None if t is None else t[:, LW - keep:].detach())
                                              for n, t in win.items()}
        any_v = valid.any(1)
        last = torch.where(valid, torch.arange(L, device=dev), -1).max(1).values.clamp(min=0)
        if cache.last_pos is None:
            cache.last_pos = torch.full((B,), -1, dtype=torch.long, device=dev)
            cache.last_doc = torch.zeros(B, dtype=torch.long, device=dev)
        cache.last_pos = torch.where(any_v, lay["pos"].gather(1, last[:, None])[:, 0], cache.last_pos)
        cache.last_doc = torch.where(any_v, lay["docs"].gather(1, last[:, None])[:, 0], cache.last_doc)
    return o


def _attend(q, k, v, mask, bias):
    """SDPA with a boolean mask and a float64 bias (cast once); a query with no key gives zeros."""
    ok = mask.any(-1, keepdim=True)
    mask = mask | ~ok
    am = mask if bias is None else bias.to(q.dtype).masked_fill(~mask, float("-inf"))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=am, enable_gqa=q.shape[1] != k.shape[1])
    return o * ok.to(o.dtype)
