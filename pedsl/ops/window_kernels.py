"""Sliding-window and chunked causal attention in O(L·N) time and memory, without a band mask on the
bulk of the work (layout ``(B, H, L, D)``, one head of keys per query head, positions 0..L-1).

SDPA's CPU kernel computes every entry of a masked call, and computes it more slowly than its
``is_causal`` kernel; a window written as a band mask over blocks of queries therefore pays the
whole rectangle of each block's keys at the masked rate. Here the queries are cut into blocks of
``Bq`` (``Bq <= N - 1``) and block ``b`` (queries ``r0 .. r0 + Bq - 1``) sees its keys in three runs:

* the *diagonal* tile, keys ``r0 .. r0 + Bq - 1``: causal (``is_causal``, the kernel skips the upper half);
* the *edge* tile, keys ``r0 - N + 1 .. r0 - N + Bq``: key ``c`` of the tile is visible to query ``a``
  iff ``c >= a`` (one ``(Bq, Bq)`` mask shared by every block);
* the *middle* run, keys ``r0 - N + Bq + 1 .. r0 - 1``: visible to every query of the block, no mask.

Each kind is one call of the flash CPU kernel over every block at once (the blocks as the kernel's
heads, the key runs as overlapping ``as_strided`` views of the keys: no copy), and the three partial
softmaxes are merged by their log-sum-exps. The first ``ceil((N - 1) / Bq)`` blocks, whose windows
reach before position 0, are one causal (masked if it must) call of their own. The backward pass
uses the flash identity: with the merged output ``O`` and log-sum-exp, each part's gradients are
exact on their own (``dS = P (dP - rowsum(dO O))`` with ``P = exp(S - lse)``), so the kernel's own
backward runs once per part and the key gradients of the overlapping runs are added back into place.

Chunked attention (``chunk = C``) is block-diagonal causal: one ``is_causal`` SDPA call with the
chunks as heads.

Torch only, and kept as a real module so it is linted and importable: the general forward
(:mod:`pedsl.compiler.general`: ``window_attend``) dispatches here, and codegen copies the text between the
``# <embedded>`` markers verbatim into every generated module, next to the general forward. A sliding window
of float32 or float64 first tries the C++ kernel of :mod:`pedsl.ops.band_kernel` (about 0.6x this path's time
at L = 8192, N = 512), in process and in generated modules; this path is its fallback where it is not built.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from pedsl.ops.flash import FLASH, FLASH_BACKWARD

# <embedded>
# ---------------------------------------------------------------------------------------------
# Banded attention (copied verbatim into every generated module, after the general forward):
# sliding windows and chunks over consecutive positions in O(L N) on the flash CPU kernel.
# ---------------------------------------------------------------------------------------------
BAND_BLOCK = 256  # queries per block (each block reads at most BAND_BLOCK + N - 1 keys)


class WindowGeometry(NamedTuple):
    """Blocks of a windowed call: ``L`` queries, window ``N``, ``Bq`` queries per block, the first
    ``head`` queries (the blocks whose windows reach before 0) in one call, ``Lp`` the padded length."""

    L: int
    N: int
    Bq: int
    head: int
    Lp: int

    @property
    def body_blocks(self) -> int:
        return (self.Lp - self.head) // self.Bq

    @property
    def edge(self) -> int:  # keys of the edge tile
        return min(self.Bq, self.N - 1)

    @property
    def middle(self) -> int:  # keys of the middle run
        return self.N - 1 - self.edge


def window_geometry(L: int, N: int) -> WindowGeometry:
    Bq = min(BAND_BLOCK, max(1, N - 1))
    Lp = -(-L // Bq) * Bq
    head = min(Lp, -(-(N - 1) // Bq) * Bq)
    return WindowGeometry(L, N, Bq, head, Lp)


def key_runs(x: Tensor, start: int, size: int, count: int, step: int) -> Tensor:
    """(BH, count, size, D): run ``t`` is ``x[:, start + t * step : start + t * step + size]`` of the
    contiguous ``x (BH, Lp, D)``, as a view (runs may overlap)."""
    BH, Lp, D = x.shape
    return x.as_strided((BH, count, size, D), (Lp * D, step * D, D, 1), x.storage_offset() + start * D)


def band_mask(rows: int, cols: int, N: int, dtype, device, col0: int = 0) -> Tensor:
    """Additive ``(rows, cols)`` mask: 0 where ``0 <= i - (col0 + j) < N``, -inf elsewhere."""
    i = torch.arange(rows, device=device)[:, None]
    j = torch.arange(col0, col0 + cols, device=device)[None, :]
    ok = (j <= i) & (i - j < N)
    return torch.zeros(rows, cols, dtype=dtype, device=device).masked_fill(~ok, float("-inf"))


class WindowPart(NamedTuple):
    """One kernel call of the body: its keys start at ``start`` (a run of ``size`` per block)."""

    start: int
    size: int
    causal: bool
    mask: Tensor | None


def window_parts(g: WindowGeometry, dtype, device) -> list[WindowPart]:
    parts = [WindowPart(g.head, g.Bq, True, None)]
    if g.edge:
        i = torch.arange(g.Bq, device=device)[:, None]
        c = torch.arange(g.edge, device=device)[None, :]
        # key c of the edge tile sits at r0 - N + 1 + c: query a sees it iff c >= a
        mask = torch.zeros(g.Bq, g.edge, dtype=dtype, device=device).masked_fill(c < i, float("-inf"))
        parts.append(WindowPart(g.head - g.N + 1, g.edge, False, mask))
    if g.middle:
        parts.append(WindowPart(g.head - g.N + 1 + g.edge, g.middle, False, None))
    return parts


def window_head_call(g: WindowGeometry, dtype, device) -> tuple[bool, Tensor | None]:
    """(is_causal, mask) of the first ``head`` queries over the first ``head`` keys."""
    if g.head <= g.N:
        return True, None
    return False, band_mask(g.head, g.head, g.N, dtype, device)


def merge_softmaxes(outs: list[Tensor], lses: list[Tensor], out: Tensor, lse: Tensor) -> None:
    """Softmaxes over disjoint key sets merged into one, written into ``out`` (the parts' shape and dtype)
    and ``lse`` (their log-sum-exp's): in place where the parts are in the log-sum-exp's precision,
    through a float32 (float64) sum otherwise (bfloat16, float16)."""
    torch.logsumexp(torch.stack(lses), dim=0, out=lse)
    weights = [torch.exp(l - lse).unsqueeze(-1) for l in lses]
    if outs[0].dtype != lse.dtype:
        acc = sum((w * o.to(lse.dtype) for w, o in zip(weights[1:], outs[1:])), weights[0] * outs[0].to(lse.dtype))
        out.copy_(acc)
        return
    torch.mul(outs[0], weights[0], out=out)
    for w, o in zip(weights[1:], outs[1:]):
        out.addcmul_(o, w)


def padded_tokens(x: Tensor, Lp: int) -> Tensor:
    """(BH, Lp, D) contiguous: ``x (B, H, L, D)`` with zero tokens appended."""
    B, H, L, D = x.shape
    x = x.reshape(B * H, L, D)
    return F.pad(x, (0, 0, 0, Lp - L)).contiguous() if Lp > L else x.contiguous()


class SlidingWindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, N: int):
        assert FLASH is not None  # the flash path is taken only where torch has the kernel
        B, H, L, D = q.shape
        g = window_geometry(L, N)
        qp, kp, vp = (padded_tokens(t, g.Lp) for t in (q, k, v))
        out = torch.empty_like(qp)
        lse = qp.new_empty(B * H, g.Lp, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        causal, mask = window_head_call(g, q.dtype, q.device)
        if g.head:
            h = slice(0, g.head)
            o, l = FLASH(qp[:, None, h], kp[:, None, h], vp[:, None, h], 0.0, causal, attn_mask=mask)
            out[:, h], lse[:, h] = o[:, 0], l[:, 0]
        nb = g.body_blocks
        if nb:
            qb = key_runs(qp, g.head, g.Bq, nb, g.Bq)
            outs, lses = [], []
            for p in window_parts(g, q.dtype, q.device):
                o, l = FLASH(qb, key_runs(kp, p.start, p.size, nb, g.Bq), key_runs(vp, p.start, p.size, nb, g.Bq), 0.0,
                             p.causal, attn_mask=p.mask)
                outs.append(o)
                lses.append(l)
            merge_softmaxes(outs, lses, key_runs(out, g.head, g.Bq, nb, g.Bq), lse[:, g.head:].view(B * H, nb, g.Bq))
        ctx.save_for_backward(qp, kp, vp, out, lse)
        ctx.shape, ctx.N = (B, H, L, D), N
        return out[:, :L].view(B, H, L, D)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel's backward has no backward of its own
    def backward(ctx, dout: Tensor):
        assert FLASH_BACKWARD is not None  # the flash path is taken only where torch has the kernel
        qp, kp, vp, out, lse = ctx.saved_tensors
        B, H, L, D = ctx.shape
        g = window_geometry(L, ctx.N)
        dop = padded_tokens(dout.to(qp.dtype), g.Lp)
        # every token's gradient is first written (the head's call, then the body's diagonal tiles), then added to
        dq, dk, dv = torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(vp)
        if g.head:
            h = slice(0, g.head)
            causal, mask = window_head_call(g, qp.dtype, qp.device)
            grads = FLASH_BACKWARD(dop[:, None, h], qp[:, None, h], kp[:, None, h], vp[:, None, h],
                                   out[:, None, h], lse[:, None, h], 0.0, causal, attn_mask=mask)
            for dst, grad in zip((dq, dk, dv), grads):
                dst[:, h] = grad[:, 0]
        nb = g.body_blocks
        if nb:
            sub = lambda x: key_runs(x, g.head, g.Bq, nb, g.Bq)  # noqa: E731
            qb, ob, dob = sub(qp), sub(out), sub(dop)
            lb = lse[:, g.head:].view(B * H, nb, g.Bq)
            for first, p in enumerate(window_parts(g, qp.dtype, qp.device)):
                kr, vr = key_runs(kp, p.start, p.size, nb, g.Bq), key_runs(vp, p.start, p.size, nb, g.Bq)
                gq, gk, gv = FLASH_BACKWARD(dob, qb, kr, vr, ob, lb, 0.0, p.causal, attn_mask=p.mask)
                if first == 0:  # the diagonal tiles: the body's queries and keys, once each
                    sub(dq).copy_(gq)
                    sub(dk).copy_(gk)
                    sub(dv).copy_(gv)
                    continue
                sub(dq).add_(gq)
                add_key_runs(dk, gk, p.start, g.Bq)
                add_key_runs(dv, gv, p.start, g.Bq)
        grads = [t[:, :L].reshape(B, H, L, D) for t in (dq, dk, dv)]
        return grads[0], grads[1], grads[2], None


def add_key_runs(dst: Tensor, grad: Tensor, start: int, step: int) -> None:
    """Add the gradient ``grad (BH, count, size, D)`` of the runs ``key_runs(x, start, size, count, step)``
    into ``dst (BH, Lp, D)`` (overlapping runs add up)."""
    BH, count, size, D = grad.shape
    if size == step:  # disjoint runs: one strided add
        key_runs(dst, start, size, count, step).add_(grad)
        return
    for s in range(0, size, step):  # piece s of every run: disjoint across runs
        w = min(step, size - s)
        key_runs(dst, start + s, w, count, step).add_(grad[:, :, s:s + w])


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Causal attention where query ``i`` sees keys ``i - window + 1 .. i``: ``(B, H, L, D)`` each
    (expand grouped key/value heads first), default scale, exact gradients."""
    L = q.shape[2]
    if window >= L:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return SlidingWindowAttention.apply(q, k, v, window)


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, chunk: int) -> Tensor:
    """Causal attention inside consecutive chunks of ``chunk`` tokens (Llama 4): the chunks as heads of
    one ``is_causal`` call. ``(B, H, L, D)`` each, one key/value head per query head."""
    B, H, L, D = q.shape
    if chunk >= L:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    n = math.ceil(L / chunk)
    Lp = n * chunk
    pad = (lambda t: F.pad(t, (0, 0, 0, Lp - L))) if Lp > L else (lambda t: t)  # noqa: E731
    qc, kc, vc = (pad(t).reshape(B, H * n, chunk, D) for t in (q, k, v))
    o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    return o.reshape(B, H, Lp, D)[:, :, :L]


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, chunk: int | None) -> Tensor:
    """Sliding-window (``window``) or chunked (``chunk``) causal attention of ``q (B, Hq, L, D)`` over
    ``k, v (B, Hkv, L, D)`` at consecutive positions (a chunk starting at token 0); grouped key/value
    heads are repeated per query head (O(L) memory, gradients summed back by autograd)."""
    Hq, Hk = q.shape[1], k.shape[1]
    if Hk != Hq:
        k, v = k.repeat_interleave(Hq // Hk, dim=1), v.repeat_interleave(Hq // Hk, dim=1)
    if window is not None:
        return sliding_window_attention(q, k, v, window)
    assert chunk is not None  # a band is a window or a chunk
    return chunked_attention(q, k, v, chunk)
# </embedded>
