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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pedsl.compiler.shapes import angle_dtype as _angle_dtype, as_bhl as _as_bhl, as_bhlp as _as_bhlp
from pedsl.compiler.shapes import as_hd as _as_hd, per_head as _per_head
from pedsl.errors import ShapeError
from pedsl.ops import rotary
from pedsl.ops.accumulate import cumulative_angles

F64 = torch.float64
TWO_PI = 2.0 * math.pi
QUERY_CHUNK = 256  # queries per block of explicit masks (memory: B * H * 256 * L_keys)
TABLE_MAX = 1 << 20  # static phase tables up to this many positions; beyond, phases are evaluated per call
HARD_RESET = float("-inf")  # a log-gate that forgets everything before it (the PaTH kernel clamps it)


# ---------------------------------------------------------------------- the cache
class AttentionCache:
    """What one attention layer keeps between decoding calls (see the module docstring).

    Create it with ``module.new_cache(batch_size)``; pass it as ``cache=`` to every call of that
    module (a prefill of any length, then one token or one chunk at a time). ``len(cache)`` is the
    number of cached tokens. Buffers grow by doubling, so appending costs O(new tokens).
    """

    def __init__(self, module, batch_size: int):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ShapeError(f"new_cache: batch_size must be a positive integer, got {batch_size!r}")
        self.scheme = module.scheme.name
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
        self.one_doc = True  # every cached token of a row is in the row's current document
        self.all_valid = True  # no cached token is padding

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"AttentionCache(scheme={self.scheme!r}, batch_size={self.batch_size}, length={self.length})"

    # buffers: token axis is dim 2 for (B, H, L, D) / (B, H, L), dim 1 for (B, L)
    def get(self, name: str) -> Tensor | None:
        b = self._buf.get(name)
        if b is None:
            return None
        return b.narrow(_axis(b), 0, self.length)

    def put(self, name: str, new: Tensor, old_len: int) -> None:
        """Write ``new`` (token axis as in the buffer) after the first ``old_len`` tokens."""
        ax = _axis(new)
        n = new.shape[ax]
        b = self._buf.get(name)
        need = old_len + n
        if b is None or b.shape[ax] < need or b.dtype != new.dtype or b.device != new.device:
            cap = max(16, 1 << (need - 1).bit_length())
            shape = list(new.shape)
            shape[ax] = cap
            nb = new.new_zeros(shape) if new.dtype != torch.bool else torch.zeros(shape, dtype=torch.bool,
                                                                                   device=new.device)
            if b is not None and old_len:
                nb.narrow(ax, 0, old_len).copy_(b.narrow(ax, 0, old_len))
            self._buf[name] = b = nb
        b.narrow(ax, old_len, n).copy_(new)


def _axis(t: Tensor) -> int:
    return 1 if t.dim() == 2 else 2


# ---------------------------------------------------------------------- input layout
@dataclass
class Layout:
    positions: Tensor  # (B, L) long
    docs: Tensor  # (B, L) long
    valid: Tensor  # (B, L) bool: False for padding
    padded: bool
    key_valid_cached: Tensor | None  # (B, Lc) bool from a (B, Lc + L) mask (this call only)
    mask4: Tensor | None  # (B|1, 1|Hq, Lq, Lc + L) bool
    n: int  # the run-time length: max position + 1


def _bool_mask(m: Tensor) -> Tensor:
    if m.dtype == torch.bool:
        return m
    if not m.is_floating_point():
        return m != 0
    neg = (m == float("-inf")) | (m <= torch.finfo(m.dtype).min / 2)
    if not bool(((m == 0) | neg).all()):
        raise ShapeError("attn_mask: a float mask must hold only 0 (attend) and -inf or the dtype's minimum "
                         "(masked); other values would be a bias",
                         hint="pass a boolean mask (True = attend); biases come from the scheme")
    return ~neg


def layout(mod, B: int, L: int, Lq: int, positions, document_ids, attn_mask, cache, device) -> Layout:
    Lc = cache.length if cache is not None else 0
    total = Lc + L
    if (positions is None and document_ids is None and attn_mask is None and cache is not None
            and cache.last_pos is not None):  # decoding: the row's document and positions continue
        pos = (cache.last_pos + 1)[:, None] + torch.arange(L, device=device)
        cache._doc_view = cache.last_doc[:, None].expand(B, L)
        return Layout(pos, cache._doc_view, torch.ones(B, L, dtype=torch.bool, device=device),
                      False, None, None, int(pos.max()) + 1)
    valid = torch.ones(B, L, dtype=torch.bool, device=device)
    kv_cached = mask4 = None
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise ShapeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
        m = _bool_mask(attn_mask.to(device))
        if m.dim() == 2 and m.shape == (B, L):
            valid = m
        elif m.dim() == 2 and m.shape == (B, total):
            valid, kv_cached = m[:, Lc:], m[:, :Lc]
        elif m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, mod.heads) and m.shape[2:] == (Lq, total):
            mask4 = m
        else:
            raise ShapeError(
                f"attn_mask has shape {tuple(attn_mask.shape)}; it must be a padding mask (B, L) = ({B}, {L}) or "
                f"(B, cached + L) = ({B}, {total}), or an attention mask (B, 1|H, Lq, cached + L) = "
                f"({B}, 1|{mod.heads}, {Lq}, {total})", hint="True (or 0.0) = attend")
    has_prev = last_pos = last_doc = None
    if cache is not None and cache.last_pos is not None:
        has_prev = cache.last_pos >= 0
        last_pos, last_doc = cache.last_pos, cache.last_doc
    if document_ids is None:
        docs = (last_doc.clone() if last_doc is not None else torch.zeros(B, dtype=torch.long, device=device))
        docs = docs[:, None].expand(B, L)
    else:
        docs = _int_arg("document_ids", document_ids, B, L, device)
    # the previous unpadded token of each token (index in this call, -1: the cache's last one)
    ar = torch.arange(L, device=device)
    lv = torch.cummax(torch.where(valid, ar, -1), dim=1).values
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
        base = torch.maximum(cm, base0[:, None])
        pos = (c - 1 - base).clamp(min=0)
    else:
        pos = _int_arg("positions", positions, B, L, device)
        prev_pos = torch.gather(pos, 1, prev_c)
        if has_prev is not None:
            prev_pos = torch.where(inside, prev_pos, last_pos[:, None])
        bad = valid & same & (pos < prev_pos)
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ShapeError(
                f"positions go backwards inside a document: row {b}, token {t} is at position {int(pos[b, t])} "
                f"after {int(prev_pos[b, t])}" + (" (the cache's last token)" if not bool(inside[b, t]) else ""),
                hint="a new sequence in the same row needs a new document_ids value (packed batches), "
                     "and a new sequence needs a new cache")
    posv = pos[valid] if bool(valid.any()) else pos
    n = int(posv.max()) + 1 if posv.numel() else 1
    return Layout(pos, docs, valid, not bool(valid.all()), kv_cached, mask4, max(n, 1))


def _int_arg(name: str, t, B: int, L: int, device) -> Tensor:
    if not isinstance(t, Tensor) or t.shape != (B, L) or t.is_floating_point() or t.is_complex():
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ShapeError(f"{name} must be an integer tensor (B, L) = ({B}, {L}) for the L tokens of k and v, "
                         f"got {got}" + (f" of {t.dtype}" if isinstance(t, Tensor) else ""),
                         hint=f"one {name[:-1] if name.endswith('s') else name} per key/value token")
    return t.to(device=device, dtype=torch.long)


# ---------------------------------------------------------------------- per-token values
class Window:
    """The inputs the expressions read: the cache's last tokens (short convolutions) then this call's."""

    def __init__(self, mod, lay: Layout, x, tokens, cache, device):
        self.L = lay.positions.shape[1]
        parts = dict(x=x, tokens=tokens, positions=lay.positions, docs=lay.docs, valid=lay.valid)
        w = cache.window if cache is not None else None
        if w is not None and w["positions"].shape[1]:
            parts = {k: (None if v is None else torch.cat([w[k].to(v.dtype), v], dim=1)) for k, v in parts.items()}
        self.parts = parts
        self.Lw = parts["positions"].shape[1]
        self.n, self.device = lay.n, device
        self.segmented = lay.padded or document_ids_vary(lay.docs) or self.Lw != self.L

    def ctx(self, mod, dtype, group=None):
        c = mod._ctx(self.Lw, self.parts["x"], self.parts["tokens"], self.device, dtype, group=group)
        c.n = self.n
        c.positions = self.parts["positions"]
        if self.segmented:
            c.docs, c.valid = self.parts["docs"], self.parts["valid"]
        return c

    def keep(self, mod, cache) -> None:
        """Store the last tokens' inputs in the cache (as many as the widest short convolution needs)."""
        if cache is None:
            return
        keep = mod._conv_history
        if not keep:
            return
        cache.window = {k: (None if v is None else v[:, v.shape[1] - min(keep, v.shape[1]):].detach())
                        for k, v in self.parts.items()}


def document_ids_vary(docs: Tensor) -> bool:
    return docs.shape[1] > 1 and bool((docs[:, 1:] != docs[:, :-1]).any())


def _last(t: Tensor, L: int, dim: int = -2) -> Tensor:
    return t if t.shape[dim] == 1 else t.narrow(dim, t.shape[dim] - L, L)


def token_values(mod, win: Window, lay: Layout, dtype, cache):
    """Per-token quantities of the L new tokens: rotations per transform, bias coordinates, Householder
    inputs, and the state to carry. Returns (rots, coord, tables, hh, state)."""
    L = win.L
    B = lay.positions.shape[0]
    valid = lay.valid
    rots, new_angles, new_gates = [], {}, {}
    hh = None
    for idx, t in enumerate(mod.transforms):
        P = len(t["channels"]) // 2
        ctx = win.ctx(mod, dtype, group=t)
        if t["op"] == "rotate" and not mod._nodes[t["phase"]].get("dynamic") and lay.n <= TABLE_MAX:
            # a static phase table (float64 phase mod 2 pi, then cos/sin; grown on demand) read at the positions
            cos, sin = mod.rope_tables(t, lay.n, win.device, _angle_dtype(dtype))  # rotate's scale included
            pos = lay.positions.clamp(0, cos.shape[0] - 1)  # (padding may sit at any position)
            rots.append((t, (cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))))  # (B, 1, L, P)
        elif t["op"] == "rotate":
            ph = mod.evaluator.run(mod._nodes[t["phase"]]["expr"], ctx, t["phase"])
            ph = _last(_as_bhlp(ph, win.Lw, P).to(F64), L)  # (B|1, H|1, L, P)
            ph = torch.remainder(ph, TWO_PI)
            s = t.get("scale", 1.0)  # rotate(..., scale = m): q and k of the group times m (HF's attention factor)
            rots.append((t, ((s * torch.cos(ph)).to(_angle_dtype(dtype)), (s * torch.sin(ph)).to(_angle_dtype(dtype)))))
        elif t["op"] == "accumulate_so2":
            a = _last(_as_bhlp(mod.evaluator.run(mod._nodes[t["steps"]]["expr"], ctx, t["steps"]), win.Lw, P), L)
            a = a.to(F64) * valid[:, None, :, None]
            A = cumulative_angles(a, reduce=False)
            prev = cache.angles.get(idx) if cache is not None else None
            if prev is not None:
                A = A + prev.unsqueeze(-2)
            A = torch.remainder(A, TWO_PI)
            new_angles[idx] = A[..., -1, :]
            rots.append((t, A))
        else:
            wt = mod.evaluator.run(mod._nodes[t["w"]]["expr"], ctx, t["w"])
            bt = mod.evaluator.run(mod._nodes[t["beta"]]["expr"], ctx, t["beta"])
            H, D = mod.heads, mod.head_dim
            wv = _last(wt.align(("batch", "head", "pos", "chan")), L).to(dtype)
            wv = wv.expand(B, H, L, len(t["channels"]))
            if len(t["channels"]) == D:
                w = wv
            else:
                w = torch.zeros(B, H, L, D, dtype=dtype, device=win.device).index_copy(
                    -1, torch.tensor(t["channels"], device=win.device), wv)
            beta = _last(_as_bhl(bt, win.Lw, H), L, -1).expand(B, H, L).to(dtype) * valid[:, None, :]
            hh = (w, beta)
    coord = None
    tables = []
    for idx, b in enumerate(mod.biases):
        ctx = win.ctx(mod, dtype)
        if b["op"] == "distance_bias" and b.get("slope") is not None:
            s = _per_head(mod.evaluator.run(b["slope"], ctx, b["node"]), mod.heads).to(F64)  # (H,)
            c = s[None, :, None] * lay.positions.to(F64)[:, None, :]  # (B, H, L): b(i, j) = s (p_i - p_j)
        elif b["op"] == "distance_bias":
            tables.append(b)
            continue
        else:
            lg = _last(_as_bhl(mod.evaluator.run(b["expr"], ctx, b["node"]), win.Lw, mod.heads), L, -1)
            lg = lg.to(F64) * valid[:, None, :]
            c = torch.cumsum(lg, dim=-1)
            prev = cache.gates.get(idx) if cache is not None else None
            if prev is not None:
                c = c + prev.unsqueeze(-1)
            new_gates[idx] = c[..., -1]
            c = c.expand(B, mod.heads, L)
        coord = c if coord is None else coord + c
    return rots, coord, tables, hh, (new_angles, new_gates)


def query_scale(mod, win: Window, dtype, Lq: int) -> Tensor | None:
    if mod.temperature is None:
        return None
    tau = mod.evaluator.run(mod.temperature, win.ctx(mod, dtype), "temperature")
    t = tau.align(("batch", "head", "pos")) if tau.axes else tau.t.reshape(1, 1, 1)
    return _last(t, Lq, -1).to(F64)


# ---------------------------------------------------------------------- decoding fast path
def _fast_decode_plan(mod):
    """The static rotations of a scheme whose decode step needs nothing but them (RoPE family: static
    phase tables, no bias, no temperature, no short convolution, SDPA backend), else None. Cached on
    the module: the checks run once, not per token."""
    plan = mod.__dict__.get("_fast_decode")
    if plan is None:
        ok = (mod.backend != "reference" and not mod.biases and _static_temperature(mod)
              and not mod._conv_history and mod.transforms
              and all(t["op"] == "rotate" and not mod._nodes[t["phase"]].get("dynamic") for t in mod.transforms))
        D = mod.head_dim
        plan = [(t, t["channels"] if len(t["channels"]) != D else None, t["targets"] == "qkv")
                for t in mod.transforms] if ok else False
        mod.__dict__["_fast_decode"] = plan
    return plan or None


def _static_temperature(mod) -> bool:
    """No temperature, or one that reads nothing but the position (a table indexed per token)."""
    if mod.temperature is None:
        return True
    from pedsl.lang.types import Dep

    return mod.graph.nodes["temperature"]["ty"].dep <= Dep.POSITION


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
    got = store.get(t["phase"])
    if got is not None and got[0].shape[0] >= n and got[0].device == device and got[0].dtype == dtype:
        return got
    size = max(n, 2 ** math.ceil(math.log2(max(n, 1))))
    cos, sin = mod.rope_tables(t, size, device, dtype)  # (size, P)
    if idx is not None:
        cos = torch.ones(size, D // 2, dtype=dtype, device=device).index_copy(-1, idx, cos)
        sin = torch.zeros(size, D // 2, dtype=dtype, device=device).index_copy(-1, idx, sin)
    store[t["phase"]] = got = (torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1))
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
    pos = cache.last_pos + 1  # (B,)
    n = int(pos.max()) + 1
    if n > TABLE_MAX:
        return None
    dt = q.dtype
    adt = _angle_dtype(dt)
    undo = []
    for t, ch, qkv in plan:
        full = _full_tables(mod, t, ch, n, q.device, adt)
        if full is not None:  # x cos + roll(x, D/2) sin~ with full-width rows: three element-wise ops
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
        q = q * _temperature_rows(mod, pos, n, q.device).to(dt)
    Lc = cache.length
    ones = cache.__dict__.get("_ones1")
    if ones is None or ones.shape[0] != q.shape[0] or ones.device != q.device:
        ones = cache.__dict__["_ones1"] = torch.ones(q.shape[0], 1, dtype=torch.bool, device=q.device)
    cache.put("k", k, Lc)
    cache.put("v", v, Lc)
    cache.put("pos", pos[:, None], Lc)
    cache.put("doc", cache.last_doc[:, None], Lc)
    cache.put("valid", ones, Lc)
    K, V = _cached(cache, "k", Lc + 1), _cached(cache, "v", Lc + 1)
    o = F.scaled_dot_product_attention(q, K, V, enable_gqa=q.shape[1] != K.shape[1])
    for rot, c, s in reversed(undo):
        o = rot(o, c, -s)
    cache.last_pos = pos
    cache.length = Lc + 1
    return o


# ---------------------------------------------------------------------- the forward
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
        ch = t["channels"] if len(t["channels"]) != D else None
        if t["op"] == "rotate":
            ck, sk = ang
            cq, sq = _last(ck, Lq), _last(sk, Lq)
            q = rotary.apply_rotary_channels(q, cq, sq, ch, mod.layout)
            k = rotary.apply_rotary_channels(k, ck, sk, ch, mod.layout)
            if t["targets"] == "qkv":
                v = rotary.apply_rotary_channels(v, ck, sk, ch, mod.layout)
                undo.append(((cq, sq), ch))
        else:
            aq = _last(ang, Lq)
            ang_d = ang.to(_angle_dtype(dt))
            q = rotary.rotate_many_by_angles([q], _last(ang_d, Lq), mod.layout, ch)[0]
            if t["targets"] == "qkv":
                k, v = rotary.rotate_many_by_angles([k, v], ang_d, mod.layout, ch)
                undo.append((aq, ch))
            else:
                k = rotary.rotate_many_by_angles([k], ang_d, mod.layout, ch)[0]
    if tau is not None:
        q = q * tau.to(dt).unsqueeze(-1)
    if hh is not None:
        o = _path(mod, q, k, v, hh, coord, lay, cache, Lq)
    else:
        o = _sdpa(mod, q, k, v, coord, tables, lay, cache, Lq)
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


def _append_tokens(cache, lay: Layout, k, v, coord):
    """Append this call's keys, values and token layout."""
    if cache.heads_kv is None:
        cache.heads_kv = k.shape[1]
    cache.put("k", k.detach(), cache.length)
    _append_layout(cache, lay, v, coord)


def _append_layout(cache, lay: Layout, v, coord) -> None:
    """Append this call's values, token layout and bias coordinates after the cached tokens."""
    Lc = cache.length
    cache.put("v", v.detach(), Lc)
    cache.put("pos", lay.positions, Lc)
    cache.put("doc", lay.docs, Lc)
    cache.put("valid", lay.valid, Lc)
    if coord is not None:
        cache.put("coord", coord.detach(), Lc)


def _cached(cache, name, Lc):
    b = cache._buf.get(name)
    return None if b is None else b.narrow(_axis(b), 0, Lc)


def _keys(cache, lay, k, v, coord, Lc: int):
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
        _append_tokens(cache, lay, k, v, coord)
        return k, v, lay.positions, lay.docs, lay.valid, coord
    grad = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or
                                         (coord is not None and coord.requires_grad))
    old = [_cached(cache, n, Lc) for n in ("k", "v", "pos", "doc", "valid", "coord")] if grad else None
    _append_tokens(cache, lay, k, v, coord)
    if not grad:
        # the appended buffers already hold every key: no copy
        full = [_cached(cache, n, Lc + k.shape[2]) for n in ("k", "v", "pos", "doc", "valid", "coord")]
        return tuple(full)
    cat = lambda a, b, d: None if b is None else torch.cat([a.to(b.dtype), b], dim=d)  # noqa: E731
    return (cat(old[0], k, 2), cat(old[1], v, 2), cat(old[2], lay.positions, 1), cat(old[3], lay.docs, 1),
            cat(old[4], lay.valid, 1), cat(old[5], coord, 2))


def _allowed(lay: Layout, Lc: int, L: int, r0: int, r1: int, Lq: int, kpos, kdoc, kvalid, multi_doc: bool):
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


def _bias_rows(mod, tables, coord_q, kcoord, qpos, kpos, dtype):
    """Float64 biases (B, H, rows, Lk) of a block of queries, cast to ``dtype`` at the end."""
    bias = None
    if kcoord is not None:
        bias = coord_q.unsqueeze(-1) - kcoord.unsqueeze(-2)
    if tables:
        dist = (qpos[:, :, None] - kpos[:, None, :]).clamp(min=0)  # (B, rows, Lk)
        top = int(dist.max()) + 1 if dist.numel() else 1
        for b in tables:
            term = mod.evaluator.run(b["expr"], mod._ctx(top, device=kpos.device), b["node"])
            tab = _as_hd(term, top, mod.heads).to(F64)  # (H, top)
            full = tab[:, dist].permute(1, 0, 2, 3)  # (B, H, rows, Lk)
            bias = full if bias is None else bias + full
    return None if bias is None else bias.to(dtype)


def _attend(q, k, v, mask, bias, scale=None):
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


def _sdpa(mod, q, k, v, coord, tables, lay: Layout, cache, Lq):
    B, Hq, _, D = q.shape
    L = k.shape[2]
    Lc = cache.length if cache is not None else 0
    K, V, kpos, kdoc, kvalid, kcoord = _keys(cache, lay, k, v, coord, Lc)
    if cache is not None and Lc and cache.one_doc and lay.docs is cache._doc_view:
        multi_doc = False  # decoding inside the cached document
    else:
        multi_doc = document_ids_vary(kdoc) or bool((kdoc[:, :1] != lay.docs[:, -1:]).any())
    if cache is not None and Lc and cache.all_valid and not lay.padded:
        kvalid = None
    qpos_all = _last(lay.positions, Lq, 1)
    cq_all = None if coord is None else _last(coord, Lq, -1)
    outs = []
    for r0 in range(0, Lq, QUERY_CHUNK):
        r1 = min(Lq, r0 + QUERY_CHUNK)
        mask = _allowed(lay, Lc, L, r0, r1, Lq, kpos, kdoc, kvalid, multi_doc)
        if mask is None and r1 - r0 > 1 and Lq == Lc + L and r0 == 0 and not tables and kcoord is None:
            outs.append(F.scaled_dot_product_attention(q[:, :, r0:r1], K, V, is_causal=True,
                                                       enable_gqa=Hq != K.shape[1]))
            continue
        bias = _bias_rows(mod, tables, None if cq_all is None else cq_all[..., r0:r1], kcoord,
                          qpos_all[:, r0:r1], kpos, q.dtype)
        outs.append(_attend(q[:, :, r0:r1], K, V, mask, bias))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


# ---------------------------------------------------------------------- PaTH
def _path(mod, q, k, v, hh, coord, lay: Layout, cache, Lq):
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
            _keys(cache, lay, path_transported_keys(k.to(cdt), w.to(cdt), beta.to(cdt)), v.to(cdt), coord, 0)
        return o
    # the decode rule
    if cache is not None and (cache.batch_size != B or (cache.heads_kv is not None and cache.heads_kv != H)):
        _keys(cache, lay, k, v, coord, Lc)  # raises the error
    Kt = _cached(cache, "k", Lc) if Lc else k[:, :, :0]
    Vc = _cached(cache, "v", Lc) if Lc else v[:, :, :0]
    pos_c = _cached(cache, "pos", Lc) if Lc else lay.positions[:, :0]
    doc_c = _cached(cache, "doc", Lc) if Lc else lay.docs[:, :0]
    val_c = _cached(cache, "valid", Lc) if Lc else lay.valid[:, :0]
    co_c = (_cached(cache, "coord", Lc) if Lc else coord[..., :0]) if coord is not None else None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w, beta))
    if cache is not None and not grad and (Lc == 0 or cache._buf["k"].dtype == _angle_dtype(k.dtype)):
        cdt = _angle_dtype(k.dtype)  # half precision: the cache and the pending product in float32
        return _path_decode_inplace(*(t.to(cdt) for t in (q, k, v, w, beta)), coord, lay, cache, Lq).to(q.dtype)
    if cache is not None and cache.path_pending is not None:
        _path_flush(cache, cache.path_flushed, cache.path_pending)
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
        mask = _allowed(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc)
        mask = None if mask is None else mask[..., :n]  # keys after this query are not moved yet (causal)
        bias = None if kco is None else (kco[..., Lc + t: Lc + t + 1].unsqueeze(-1) - kco[..., :n].unsqueeze(-2)).to(q.dtype)
        outs.append(_attend(q[:, :, r: r + 1], Kt, Vall[:, :, :n], mask, bias))
    if cache is not None:
        cache.heads_kv = H
        cache.put("k", Kt.detach(), 0)  # every key moved to the newest token
        _append_layout(cache, lay, v, coord)
    return torch.cat(outs, dim=2)


PATH_FLUSH = 32  # PaTH decoding: pending Householder steps applied to the cached keys every this many tokens


def _path_flush(cache, nf: int, P) -> None:
    """Apply the pending product ``P`` of PaTH steps to the first ``nf`` keys (those cached before the
    last flush): ``K <- K P^T``. Afterwards every cached key is transported to the newest token."""
    if P is not None and nf:
        Kf = _cached(cache, "k", nf).flatten(0, 1)
        Kf.copy_(torch.bmm(Kf, P.transpose(1, 2)))
    cache.path_pending, cache.path_flushed = None, None


def _path_decode_inplace(q, k, v, w, beta, coord, lay: Layout, cache, Lq):
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
    _append_layout(cache, lay, v, coord)
    total = Lc + L
    kpos, kdoc, kvalid = (_cached(cache, n, total) for n in ("pos", "doc", "valid"))
    kco = _cached(cache, "coord", total) if coord is not None else None
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
                R = _cached(cache, "k", n).narrow(2, nf, n - nf).flatten(0, 1)  # (Z, n - nf, D)
                R.baddbmm_(torch.bmm(R, wt) * bt, wt.transpose(1, 2), alpha=-1.0)
        cache.put("k", k[:, :, t: t + 1], n)
        r = t - (L - Lq)
        if r >= 0:
            qt = q[:, :, r].reshape(Z, D, 1)
            Kall = _cached(cache, "k", n + 1).flatten(0, 1)  # (Z, n + 1, D)
            if nf and P is not None:
                s = torch.cat([torch.bmm(Kall[:, :nf], torch.bmm(P.transpose(1, 2), qt)),
                               torch.bmm(Kall[:, nf:], qt)], 1)
            else:
                s = torch.bmm(Kall, qt)
            s = s.view(B, H, 1, n + 1) * scale
            if kco is not None:
                s = s + (kco[..., n: n + 1].unsqueeze(-1) - kco[..., : n + 1].unsqueeze(-2)).to(s.dtype)
            mask = _allowed(lay, Lc, L, r, r + 1, Lq, kpos, kdoc, kvalid, multi_doc)
            ok = None
            if mask is not None:
                mask = mask[..., : n + 1]
                s = s.masked_fill(~mask, float("-inf"))
                ok = mask.any(-1, keepdim=True)
                s = s.masked_fill(~ok, 0.0)
            p = torch.softmax(s, dim=-1)
            if ok is not None:
                p = p * ok
            o = torch.bmm(p.reshape(Z, 1, n + 1), _cached(cache, "v", total).narrow(2, 0, n + 1).flatten(0, 1))
            outs.append(o.view(B, H, 1, D))
        if n + 1 - nf >= PATH_FLUSH:
            _path_flush(cache, nf, P)
            nf, P = n + 1, None
    cache.path_pending, cache.path_flushed = P, nf
    return torch.cat(outs, dim=2)


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
