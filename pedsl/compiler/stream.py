"""The general forward of a compiled scheme: positions, documents, padding and attention masks,
grouped-query attention, queries behind their keys, and the decoding cache.

``SchemeAttention.forward`` takes this path whenever a call is more than one full causal sequence
at positions 0..L-1 with as many key/value heads as query heads (that case keeps the fused kernels
of ``module.py``). What a call means:

* k, v ``(B, Hkv, L, D)`` are L new tokens; q ``(B, Hq, Lq, D)`` are the queries of the *last* Lq
  of them (Lq <= L); with a cache, every cached token precedes them. ``Hq`` is a multiple of
  ``Hkv``: query head ``h`` reads key/value head ``h // (Hq / Hkv)`` (GQA / MQA). k and v stay at
  ``Hkv`` heads unless the scheme's transport differs per head (learned per-head angles, PaTH),
  which needs one transported key per query head.
* ``positions (B, L)``: integer positions, read by every position-indexed quantity (RoPE phases,
  distance biases, position-indexed steps, temperatures). Default: the index of the token inside
  its document, counting only unpadded tokens, continuing the cache.
* ``document_ids (B, L)``: a token attends only inside its document; every accumulated quantity
  (cumulative angles, forget-gate sums, Householder products, short convolutions) restarts at a
  boundary. (Transports and gate sums between two tokens of one document only involve that
  document's steps, so they restart by construction; short convolutions are cut explicitly.)
* ``attn_mask``: boolean. ``(B, L)`` or ``(B, Lc + L)`` marks padding: a padded token does not
  exist - no query attends to it, its steps are the identity (angle 0, log-gate 0, beta 0) and
  short convolutions read zeros there - so a left-padded row equals the row unpadded. ``(B, 1|Hq,
  Lq, Lc + L)`` restricts attention only. An additive float mask of zeros and ``-inf`` (or the
  dtype's minimum) is read as the boolean ``mask == 0``. A query with no key left gives zeros.
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
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pedsl.compiler.attend import sdpa_forward
from pedsl.compiler.cache import AttentionCache, cached
from pedsl.compiler.inputs import (
    Layout,
    Window,
    last_tokens,
    layout,
    query_scale,
    token_values,
)
from pedsl.compiler.plan import POSITION_TABLE, ROPE
from pedsl.compiler.shapes import angle_dtype as _angle_dtype
from pedsl.compiler.stream_path import path_forward
from pedsl.errors import ShapeError
from pedsl.ops import rotary
from pedsl.ops.bias import scale_queries

TABLE_MAX = 1 << 20  # static phase tables up to this many positions; beyond, phases are evaluated per call


# ---------------------------------------------------------------------- decoding fast path
def _fast_decode_plan(mod):
    """The static rotations of a scheme whose decode step needs nothing but them (RoPE family: static
    phase tables, no bias, no temperature, no short convolution, SDPA backend), else None. Cached on
    the module: the checks run once, not per token."""
    plan = mod.__dict__.get("_fast_decode")
    if plan is None:
        ok = (mod.backend != "reference" and not mod.biases and _static_temperature(mod)
              and not mod._conv_history and mod.transforms
              and all(t.static_table for t in mod.transforms))
        D = mod.head_dim
        plan = [(t, t.channels if len(t.channels) != D else None, t.values)
                for t in mod.transforms] if ok else False
        mod.__dict__["_fast_decode"] = plan
    return plan or None


def _static_temperature(mod) -> bool:
    """No temperature, or one that reads nothing but the position (a table indexed per token)."""
    return mod.temperature is None or mod.temperature.table == POSITION_TABLE


def _temperature_rows(mod, pos: Tensor, n: int, device) -> Tensor:
    """tau at the positions ``pos (B,)`` from a float64 table (H|1, size) grown by doubling: (B, H|1, 1, 1)."""
    tab = mod.__dict__.get("_tau_table")
    if tab is None or tab.shape[1] < n or tab.device != device:
        size = max(n, 2 ** math.ceil(math.log2(max(n, 1))), 256)
        tab = mod.__dict__["_tau_table"] = mod.query_scale(size, device)[0]
    return tab[:, pos].t()[:, :, None, None]


def _full_tables(mod, t, ch, n: int, device, dtype):
    """Full-width (size, D) tables ``cos~ = [c, c]``, ``sin~ = [-s, s]`` of a static rotation in the
    halves layout (identity on the pairs outside the group), so that ``x cos~ + roll(x, D/2) sin~``
    rotates every pair (k, k + D/2); None for other layouts and groups that are not pairs of the layout."""
    if mod.layout != "halves":
        return None
    D = mod.head_dim
    idx = None
    if ch is not None:
        kind, arg = rotary._plan(rotary._normalize_channels(ch, D), D, "halves")
        if kind != "embed":
            return None
        idx = torch.tensor(arg, device=device)
    store = mod.__dict__.setdefault("_fast_full", {})
    got = store.get(t.site)
    if got is not None and got[0].shape[0] >= n and got[0].device == device and got[0].dtype == dtype:
        return got
    size = max(n, 2 ** math.ceil(math.log2(max(n, 1))))
    cos, sin = mod.rope_tables(t, size, device, dtype)  # (size, P)
    if idx is not None:
        cos = torch.ones(size, D // 2, dtype=dtype, device=device).index_copy(-1, idx, cos)
        sin = torch.zeros(size, D // 2, dtype=dtype, device=device).index_copy(-1, idx, sin)
    store[t.site] = got = (torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1))
    return got


def _roll_rotate(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    if x.dtype != c.dtype:  # half precision: float32 tables, one rounding at the end (as rotary._rotate)
        return _roll_rotate(x.to(c.dtype), c, s).to(x.dtype)
    return torch.addcmul(x * c, x.roll(x.shape[-1] // 2, -1), s)


def _group_rotate(x: Tensor, c: Tensor, s: Tensor, *, ch, layout) -> Tensor:
    return rotary.apply_rotary_channels(x, c, s, ch, layout)


def decode_step(mod, q: Tensor, k: Tensor, v: Tensor, cache) -> Tensor | None:
    """One decoding token of a RoPE-family scheme (no positions, documents, mask or gradient; the cache
    continues one document with nothing padded): rotate q and k by one row of the cached tables, append
    to the cache, SDPA over the cache. Returns None when the general path is needed. Same result as
    :func:`stream_forward` (tested), without its per-call layout work."""
    plan = _fast_decode_plan(mod)
    if (plan is None or cache.last_pos is None or not cache.one_doc or not cache.all_valid
            or not cache.length or q.shape[2] != 1 or k.shape[2] != 1 or cache.batch_size != q.shape[0]
            or cache.heads_kv != k.shape[1] or cache.window is not None
            or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
        return None
    pos, p = _next_positions(cache)  # (B,); p: the shared position of every row, else None
    n = (p if p is not None else int(pos.max())) + 1
    if n > TABLE_MAX:
        return None
    dt = q.dtype
    adt = _angle_dtype(dt)
    undo = []
    for t, ch, qkv in plan:
        full = _full_tables(mod, t, ch, n, q.device, adt)
        if full is not None and p is not None:  # one row of the full-width tables, broadcast (a view)
            c, s = full[0][p], full[1][p]  # (D,), angle dtype
            rot = _roll_rotate
        elif full is not None:  # x cos + roll(x, D/2) sin~ with full-width rows: three element-wise ops
            c, s = full[0][pos][:, None, None], full[1][pos][:, None, None]  # (B, 1, 1, D), angle dtype
            rot = _roll_rotate
        else:
            cos, sin = mod.rope_tables(t, n, q.device, adt)
            c, s = cos[pos][:, None, None], sin[pos][:, None, None]  # (B, 1, 1, P)
            rot = functools.partial(_group_rotate, ch=ch, layout=mod.layout)
        q, k = rot(q, c, s), rot(k, c, s)
        if qkv:
            v = rot(v, c, s)
            undo.append((rot, c, s))
    if mod.temperature is not None:
        q = scale_queries(q, _temperature_rows(mod, pos, n, q.device)[..., 0])
    Lc = cache.length
    ones = cache.__dict__.get("_ones1")
    if ones is None or ones.shape[0] != q.shape[0] or ones.device != q.device:
        ones = cache.__dict__["_ones1"] = torch.ones(q.shape[0], 1, dtype=torch.bool, device=q.device)
    cache.put("k", k, Lc)
    cache.put("v", v, Lc)
    cache.put("pos", pos[:, None], Lc)
    cache.put("doc", cache.last_doc[:, None], Lc)
    cache.put("valid", ones, Lc)
    K, V = cached(cache, "k", Lc + 1), cached(cache, "v", Lc + 1)
    o = F.scaled_dot_product_attention(q, K, V, enable_gqa=q.shape[1] != K.shape[1])
    for rot, c, s in reversed(undo):
        o = rot(o, c, -s)
    cache.last_pos = pos
    cache.length = Lc + 1
    if p is not None:
        cache.__dict__["_fast_pos"] = (pos, p)
    return o


def _next_positions(cache) -> tuple[Tensor, int | None]:
    """The positions (B,) of a decoding token, ``last_pos + 1``, and that position as an int when
    every row shares it (else None). When the last call was this fast path (``last_pos`` is the
    tensor it left) the answer comes from a cached (size, B) table of positions: no tensor op, no
    synchronising ``.item()``; otherwise it is computed and checked once."""
    last = cache.last_pos
    st = cache.__dict__.get("_fast_pos")
    if st is not None and st[0] is last:
        p = st[1] + 1
    else:
        p = int(last[0]) + 1
        if p >= TABLE_MAX or not bool((last == last[0]).all()):
            return last + 1, None
    tab = cache.__dict__.get("_pos_table")
    if tab is None or tab.shape[0] <= p or tab.device != last.device:
        size = max(256, 1 << p.bit_length())
        tab = torch.arange(size, device=last.device).unsqueeze(1).expand(size, last.shape[0]).contiguous()
        cache.__dict__["_pos_table"] = tab
    return tab[p], p


# ---------------------------------------------------------------------- the forward
# Under torch.compile this path runs eagerly (one graph break at the call, no recompiles): its layout,
# mask and cache bookkeeping branch on tensor values (padding present? one document? the largest
# position), and a compiled module traced through it made 55 graphs for one prefill and five decoding
# steps, with a recompile per step (12 minutes of inductor on 2 cores); the fused path of module.py
# compiles. Measured in test_compiler_torch_compile.py; docs/semantics.md §8.7.
@torch.compiler.disable
def stream_forward(mod, q: Tensor, k: Tensor, v: Tensor, *, x=None, tokens=None, positions=None,
                   document_ids=None, cache=None, attn_mask=None) -> Tensor:
    if (cache is not None and positions is None and document_ids is None and attn_mask is None
            and x is None and tokens is None):
        o = decode_step(mod, q, k, v, cache)
        if o is not None:
            return o
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    device = q.device
    lay = layout(mod, B, L, Lq, positions, document_ids, attn_mask, cache, device)
    if mod.backend == "reference":
        return _reference(mod, q, k, v, x, tokens, lay, cache)
    win = Window(mod, lay, x, tokens, cache, device)
    dt = q.dtype
    rots, coord, tables, hh, state = token_values(mod, win, lay, dt, cache)
    tau = query_scale(mod, win, dt, Lq)
    per_head = hh is not None or any((A[0] if isinstance(A, tuple) else A).shape[1] > 1 for _, A in rots)
    if per_head and Hkv != Hq:  # transports differ per query head: one transported key per query head
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    # rotations (absolute angles) of q (its last Lq tokens), k and v
    undo = []
    for t, ang in rots:
        ch = t.channels if len(t.channels) != D else None
        if t.kind == ROPE:
            ck, sk = ang
            cq, sq = last_tokens(ck, Lq), last_tokens(sk, Lq)
            q = rotary.apply_rotary_channels(q, cq, sq, ch, mod.layout)
            k = rotary.apply_rotary_channels(k, ck, sk, ch, mod.layout)
            if t.values:
                v = rotary.apply_rotary_channels(v, ck, sk, ch, mod.layout)
                undo.append(((cq, sq), ch))
        else:
            aq = last_tokens(ang, Lq)
            ang_d = ang.to(_angle_dtype(dt))
            q = rotary.rotate_many_by_angles([q], last_tokens(ang_d, Lq), mod.layout, ch)[0]
            if t.values:
                k, v = rotary.rotate_many_by_angles([k, v], ang_d, mod.layout, ch)
                undo.append((aq, ch))
            else:
                k = rotary.rotate_many_by_angles([k], ang_d, mod.layout, ch)[0]
    if tau is not None:
        q = scale_queries(q, tau)
    if hh is not None:
        o = path_forward(mod, q, k, v, hh, coord, lay, cache, Lq)
    else:
        o = sdpa_forward(mod, q, k, v, coord, tables, lay, cache, Lq)
    for aq, ch in reversed(undo):  # R(A_i)^T = R(-A_i) at the query's angle
        if isinstance(aq, tuple):
            o = rotary.apply_rotary_channels(o, aq[0], -aq[1], ch, mod.layout)
        else:
            o = rotary.rotate_many_by_angles([o], (-aq).to(_angle_dtype(o.dtype)), mod.layout, ch)[0]
    if cache is not None:
        _commit(cache, lay, state, win, mod)
    return o


def _commit(cache: AttentionCache, lay: Layout, state, win: Window, mod) -> None:
    new_angles, new_gates = state
    cache.angles.update({i: a.detach() for i, a in new_angles.items()})
    cache.gates.update({i: g.detach() for i, g in new_gates.items()})
    win.keep(mod, cache)
    B, L = lay.valid.shape
    if not lay.padded and cache.last_pos is not None and cache.one_doc and cache.all_valid and (
            lay.docs is cache._doc_view):  # decoding: the row's document continues, nothing padded
        cache.last_pos = lay.positions[:, -1]
        cache.length += L
        return
    cache.all_valid = cache.all_valid and not lay.padded
    first = cache.last_doc if cache.last_pos is not None else lay.docs[:, 0]
    cache.one_doc = cache.one_doc and bool((lay.docs == first[:, None]).all())
    if cache.last_pos is None:
        cache.last_pos = torch.full((B,), -1, dtype=torch.long, device=lay.valid.device)
        cache.last_doc = torch.zeros(B, dtype=torch.long, device=lay.valid.device)
    any_v = lay.valid.any(1)
    idx = torch.where(lay.valid, torch.arange(L, device=lay.valid.device), -1).max(1).values.clamp(min=0)
    cache.last_pos = torch.where(any_v, lay.positions.gather(1, idx[:, None])[:, 0], cache.last_pos)
    cache.last_doc = torch.where(any_v, lay.docs.gather(1, idx[:, None])[:, 0], cache.last_doc)
    cache.length += L


# ---------------------------------------------------------------------- reference backend
def _reference(mod, q, k, v, x, tokens, lay: Layout, cache):
    """The naive float64 interpreter over every token so far (the cache keeps the raw inputs)."""
    from pedsl.compiler.reference import reference_stream

    parts = dict(k=k, v=v, x=x, tokens=tokens, positions=lay.positions, docs=lay.docs, valid=lay.valid)
    if cache is not None:
        if cache.batch_size != k.shape[0]:
            raise ShapeError(f"cache: it was made for batch size {cache.batch_size}, this call has {k.shape[0]}",
                             hint="make one cache per sequence batch: module.new_cache(batch_size)")
        if cache.raw is not None:
            old = cache.raw
            parts = {n: (None if t is None else torch.cat([old[n].to(t.dtype), t], dim=2 if n in ("k", "v") else 1))
                     for n, t in parts.items()}
        cache.raw = {n: (None if t is None else t.detach()) for n, t in parts.items()}
        cache.length += k.shape[2]
        B, L = lay.valid.shape
        any_v = lay.valid.any(1)
        idx = torch.where(lay.valid, torch.arange(L, device=q.device), -1).max(1).values.clamp(min=0)
        if cache.last_pos is None:
            cache.last_pos = torch.full((B,), -1, dtype=torch.long, device=q.device)
            cache.last_doc = torch.zeros(B, dtype=torch.long, device=q.device)
        cache.last_pos = torch.where(any_v, lay.positions.gather(1, idx[:, None])[:, 0], cache.last_pos)
        cache.last_doc = torch.where(any_v, lay.docs.gather(1, idx[:, None])[:, 0], cache.last_doc)
    valid = parts["valid"]
    if lay.key_valid_cached is not None:
        Lc = lay.key_valid_cached.shape[1]
        valid = torch.cat([valid[:, :Lc] & lay.key_valid_cached, valid[:, Lc:]], 1)
    return reference_stream(mod, q, parts["k"], parts["v"], x=parts["x"], tokens=parts["tokens"],
                            positions=parts["positions"], docs=parts["docs"], valid=valid,
                            step_valid=parts["valid"], mask4=lay.mask4).to(q.dtype)
