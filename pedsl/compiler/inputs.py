"""The inputs of one general forward call, laid out once: positions, documents, validity and
masks (:class:`Layout`), and the per-token values the scheme computes from them - rotation
angles, bias coordinates, Householder steps, temperatures (:func:`token_values`, :func:`query_scale`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from pedsl.compiler import plan as PL
from pedsl.compiler.kernels_template import _bool_mask
from pedsl.compiler.shapes import angle_dtype as _angle_dtype
from pedsl.compiler.shapes import as_bhl as _as_bhl
from pedsl.compiler.shapes import as_bhlp as _as_bhlp
from pedsl.compiler.shapes import per_head as _per_head
from pedsl.errors import ShapeError
from pedsl.ops.accumulate import cumulative_angles

F64 = torch.float64
TWO_PI = 2.0 * math.pi
TABLE_MAX = 1 << 20  # static phase tables up to this many positions; beyond, phases are evaluated per call


@dataclass
class Layout:
    positions: Tensor  # (B, L) long
    docs: Tensor  # (B, L) long
    valid: Tensor  # (B, L) bool: False for padding
    padded: bool
    key_valid_cached: Tensor | None  # (B, Lc) bool from a (B, Lc + L) mask (this call only)
    mask4: Tensor | None  # (B|1, 1|Hq, Lq, Lc + L) bool
    n: int  # the run-time length: max position + 1


def bool_mask(m: Tensor) -> Tensor:
    """The boolean form of a mask (True = attend), read as the generated modules read it."""
    try:
        return _bool_mask(m)
    except ValueError as exc:
        raise ShapeError(f"{exc}; other values would be a bias",
                         hint="pass a boolean mask (True = attend); biases come from the scheme") from None


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
        m = bool_mask(attn_mask.to(device))
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
        docs = int_arg("document_ids", document_ids, B, L, device)
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
        pos = int_arg("positions", positions, B, L, device)
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


def int_arg(name: str, t, B: int, L: int, device) -> Tensor:
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


def last_tokens(t: Tensor, L: int, dim: int = -2) -> Tensor:
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
        P = len(t.channels) // 2
        ctx = win.ctx(mod, dtype, group=t)
        if t.static_table and lay.n <= TABLE_MAX:
            # a static phase table (float64 phase mod 2 pi, then cos/sin; grown on demand) read at the positions
            cos, sin = mod.rope_tables(t, lay.n, win.device, _angle_dtype(dtype))  # rotate's scale included
            pos = lay.positions.clamp(0, cos.shape[0] - 1)  # (padding may sit at any position)
            rots.append((t, (cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))))  # (B, 1, L, P)
        elif t.kind == PL.ROPE:
            ph = mod.evaluator.run(t.expr, ctx, t.site)
            ph = last_tokens(_as_bhlp(ph, win.Lw, P).to(F64), L)  # (B|1, H|1, L, P)
            ph = torch.remainder(ph, TWO_PI)
            s = t.scale  # rotate(..., scale = m): q and k of the group times m (HF's attention factor)
            rots.append((t, ((s * torch.cos(ph)).to(_angle_dtype(dtype)), (s * torch.sin(ph)).to(_angle_dtype(dtype)))))
        elif t.kind == PL.SO2:
            a = last_tokens(_as_bhlp(mod.evaluator.run(t.expr, ctx, t.site), win.Lw, P), L)
            a = a.to(F64) * valid[:, None, :, None]
            A = cumulative_angles(a, reduce=False)
            prev = cache.angles.get(idx) if cache is not None else None
            if prev is not None:
                A = A + prev.unsqueeze(-2)
            A = torch.remainder(A, TWO_PI)
            new_angles[idx] = A[..., -1, :]
            rots.append((t, A))
        else:
            wt, bt = (mod.evaluator.run(s.expr, ctx, s.name) for s in t.sites)
            H, D = mod.heads, mod.head_dim
            wv = last_tokens(wt.align(("batch", "head", "pos", "chan")), L).to(dtype)
            wv = wv.expand(B, H, L, len(t.channels))
            if len(t.channels) == D:
                w = wv
            else:
                w = torch.zeros(B, H, L, D, dtype=dtype, device=win.device).index_copy(
                    -1, torch.tensor(t.channels, device=win.device), wv)
            beta = last_tokens(_as_bhl(bt, win.Lw, H), L, -1).expand(B, H, L).to(dtype) * valid[:, None, :]
            hh = (w, beta)
    coord = None
    tables = []
    for idx, b in enumerate(mod.biases):
        ctx = win.ctx(mod, dtype)
        if b.log_gate is None and b.kind == PL.LINEAR_BIAS:
            s = _per_head(mod.evaluator.run(b.slope, ctx, b.site.name), mod.heads).to(F64)  # (H,)
            c = s[None, :, None] * lay.positions.to(F64)[:, None, :]  # (B, H, L): b(i, j) = s (p_i - p_j)
        elif b.kind == PL.TABLE_BIAS:
            tables.append(b)
            continue
        else:
            lg = last_tokens(_as_bhl(mod.evaluator.run(b.log_gate, ctx, b.site.name), win.Lw, mod.heads), L, -1)
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
    tau = mod.evaluator.run(mod.temperature.site.expr, win.ctx(mod, dtype), mod.temperature.site.name)
    t = tau.align(("batch", "head", "pos")) if tau.axes else tau.t.reshape(1, 1, 1)
    return last_tokens(t, Lq, -1).to(F64)
