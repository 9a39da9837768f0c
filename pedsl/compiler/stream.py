"""SchemeAttention's general path: the call of :mod:`pedsl.compiler.general` (whose docstring says
what positions, document_ids, attn_mask and cache mean) with the module's values and fused kernels,
the one-token decoding fast path of the RoPE family, and the float64 reference backend."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pedsl.compiler.general import (
    InputError,
    Layout,
    Shape,
    advance_rows,
    angle_dtype,
    general_forward,
    layout,
    shape_of,
    trim_cache,
)
from pedsl.compiler.general.cache import stored
from pedsl.compiler.flex_lowering import flex_call, flex_forward
from pedsl.compiler.kernel_support import decode_call
from pedsl.compiler.module_values import TABLE_MAX, ModuleScheme
from pedsl.compiler.reference import reference_stream
from pedsl.errors import ShapeError
from pedsl.ops import rotary
from pedsl.ops.bias import scale_queries



# ---------------------------------------------------------------------- decoding fast path
def _fast_decode_plan(mod):
    """The static rotations of a scheme the one-token decode path takes (its declaration in
    :mod:`pedsl.compiler.kernel_support`: RoPE-family static tables, a temperature table, a window or
    chunk), as (step, channels or None, whether values turn too), else None. Cached on the module."""
    plan = mod.__dict__.get("_fast_decode")
    if plan is None:
        D = mod.head_dim
        plan = ([(t, t.channels if len(t.channels) != D else None, t.values) for t in mod.transforms]
                if "decode" in mod.plan.kernels else False)
        mod.__dict__["_fast_decode"] = plan
    return None if plan is False else plan


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
    to the cache, SDPA over the cached keys its window or chunk sees (dropping the dead ones as the
    general path does). Returns None when the general path is needed. Same result as
    :func:`stream_forward` (tested), without its per-call layout work."""
    plan = _fast_decode_plan(mod)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if plan is None or not decode_call(mod.plan.kernels, q, k, v, cache, grad):
        return None
    pos, p = _next_positions(cache)  # (B,); p: the shared position of every row, else None
    n = (p if p is not None else int(pos.max())) + 1
    if n > TABLE_MAX:
        return None
    shape = shape_of(mod.plan)
    first = 0 if shape is None else _first_visible(cache, shape, pos)
    if first is None:
        return None
    dt = q.dtype
    adt = angle_dtype(dt)
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
    K, V = stored(cache, "k", Lc + 1)[:, :, first:], stored(cache, "v", Lc + 1)[:, :, first:]
    o = F.scaled_dot_product_attention(q, K, V, enable_gqa=q.shape[1] != K.shape[1])
    for rot, c, s in reversed(undo):
        o = rot(o, c, -s)
    cache.last_pos = pos
    cache.length = Lc + 1
    if p is not None:
        cache.__dict__["_fast_pos"] = (pos, p)
    if shape is not None and first >= max(64, _span(shape)):  # as many dead keys as trim drops
        trim_cache(cache, shape)
    return o


def _span(shape: Shape) -> int:
    """The window, else the chunk (a shape has one)."""
    span = shape.window or shape.chunk
    assert span is not None
    return span


def _first_visible(cache, shape: Shape, pos: Tensor) -> int | None:
    """The first cached key the window (chunk) lets the token at ``pos (B,)`` see, the same in every row
    (the cache holds one document per row, positions never decrease, so the visible keys are a suffix),
    else None (rows that differ: the general path masks them)."""
    kpos = stored(cache, "pos", cache.length)
    low = pos - (shape.window - 1) if shape.window is not None else torch.div(pos, _span(shape),
                                                                              rounding_mode="floor") * _span(shape)
    first = torch.searchsorted(kpos.contiguous(), low[:, None].contiguous())
    lo, hi = int(first.min()), int(first.max())
    return lo if lo == hi else None


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
                   document_ids=None, cache=None, attn_mask=None, band: bool = True, span_ids=None) -> Tensor:
    if not band and attn_mask is None:
        raise ShapeError("band=False: the attn_mask must carry the window or chunk, and there is none",
                         hint="pass the mask that holds the window (chunk), or keep band=True")
    if (band and cache is not None and positions is None and document_ids is None and attn_mask is None
            and x is None and tokens is None and span_ids is None):
        o = decode_step(mod, q, k, v, cache)
        if o is not None:
            return o
    try:
        lay = layout(mod.heads, q.shape[0], k.shape[2], q.shape[2], positions, document_ids, attn_mask, cache,
                     q.device, mod.scheme.axes, ModuleScheme.of(mod), span_ids)
        if mod.backend == "reference":
            return _reference(mod, q, k, v, x, tokens, lay, cache, band)
        side = ModuleScheme.of(mod) if band else ModuleScheme.unbanded(mod)
        if mod.backend == "flex" and flex_call(side.fast_paths, q, k, cache):  # the plan's score pipeline as Flex
            return flex_forward(side, side.kernels, q, k, v, x=x, tokens=tokens, lay=lay)
        return general_forward(side, side.kernels, q, k, v, x=x, tokens=tokens, cache=cache, lay=lay)
    except InputError as exc:
        raise ShapeError(str(exc), hint=exc.hint) from None


# ---------------------------------------------------------------------- reference backend
def _reference(mod, q, k, v, x, tokens, lay: Layout, cache, band: bool = True):
    """The naive float64 interpreter over every token so far (the cache keeps the raw inputs)."""
    parts = dict(k=k, v=v, x=x, tokens=tokens, positions=lay.positions, docs=lay.docs, valid=lay.valid,
                 axes_pos=lay.axes_pos, spans=lay.spans)
    if cache is not None:
        if cache.batch_size != k.shape[0]:
            raise ShapeError(f"cache: it was made for batch size {cache.batch_size}, this call has {k.shape[0]}",
                             hint="make one cache per sequence batch: module.new_cache(batch_size)")
        if cache.raw is not None:
            old = cache.raw
            parts = {n: (None if t is None else torch.cat([old[n].to(t.dtype), t], dim=2 if n in ("k", "v") else 1))
                     for n, t in parts.items()}
        cache.raw = {n: (None if t is None else t.detach()) for n, t in parts.items()}
        advance_rows(cache, lay)
    valid = parts["valid"]
    if lay.key_valid_cached is not None:
        Lc = lay.key_valid_cached.shape[1]
        valid = torch.cat([valid[:, :Lc] & lay.key_valid_cached, valid[:, Lc:]], 1)
    return reference_stream(mod, q, parts["k"], parts["v"], x=parts["x"], tokens=parts["tokens"],
                            positions=parts["positions"], docs=parts["docs"], valid=valid,
                            step_valid=parts["valid"], mask4=lay.mask4, axes_pos=parts["axes_pos"],
                            band=band, spans=parts["spans"]).to(q.dtype)
