"""Rotary (SO(2) pair) rotations of q/k/v: RoPE and its relatives.

Math (docs/semantics.md §2a): channels are taken as pairs; pair ``k`` of a vector at
position ``t`` is rotated by ``R(theta_k(t))`` with ``R(t) = [[cos t, -sin t],
[sin t, cos t]]`` acting on ``(first, second)`` of the pair. This is the
standard RoPE sign (Su et al., RoFormer; HF ``apply_rotary_pos_emb``:
``x * cos + rotate_half(x) * sin``), so ``<R(a) q, R(b) k> = <q, R(b - a) k>``.

Pairing layouts (a scheme names one explicitly):

- ``"halves"``: pair ``k`` is ``(k, k + D/2)`` (GPT-NeoX, HF ``rotate_half``);
- ``"interleaved"``: pair ``k`` is ``(2k, 2k + 1)`` (GPT-J, Meta LLaMA).

A *channel group* (a subset of a head's channels) is paired the same way inside
the group: for ``halves`` its channels ``c_0..c_{m-1}`` pair as
``(c_k, c_{k+m/2})``; for ``interleaved`` as ``(c_{2k}, c_{2k+1})``; channels
outside the group are left unchanged (NoPE channels).

Shapes: ``x`` is ``(..., L, D)`` (usually ``(B, H, L, D)``); cos/sin tables are
``(L, P)`` or broadcastable to ``(..., L, P)`` where ``P`` is the number of
rotated pairs. Phases are computed in float64 and cast at the end (docs/semantics.md §6).
Everything here is plain autograd: gradients flow to ``x`` and to the tables
(hence to learned or data-dependent angles).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import torch
from torch import Tensor

from pedsl.errors import ShapeError
from pedsl.formulas import channel_pairs

LAYOUTS = ("halves", "interleaved")
Channels = Sequence[int] | slice | None


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ShapeError(
            f"unknown rotary pairing layout {layout!r}",
            hint="use 'halves' (pairs (k, k+D/2), GPT-NeoX/HF) or 'interleaved' (pairs (2k, 2k+1), GPT-J).",
        )


def geometric_freqs(num_pairs: int, base: float = 10000.0, rot_dim: int | None = None) -> Tensor:
    """RoPE frequencies ``w_k = base^(-2k / rot_dim)``, ``k = 0..num_pairs-1``, float64 ``(P,)``.

    ``rot_dim`` defaults to ``2 * num_pairs`` (Su et al.; HF ``inv_freq``).
    """
    rot_dim = 2 * num_pairs if rot_dim is None else rot_dim
    k = torch.arange(num_pairs, dtype=torch.float64)
    return torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * k / rot_dim)


def rotary_cos_sin(freqs: Tensor, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos/sin tables ``(L, P)`` in ``dtype`` for phases ``positions[t] * freqs[k]``.

    The phase is formed in float64 and reduced mod 2 pi before the cast, so a
    float32 table at t = 65,536 keeps ~1e-7 rad accuracy (docs/semantics.md §6).
    """
    pos = torch.as_tensor(positions).to(torch.float64)
    phase = torch.outer(pos, freqs.to(device=pos.device, dtype=torch.float64))
    phase = torch.remainder(phase, 2.0 * math.pi)
    return torch.cos(phase).to(dtype), torch.sin(phase).to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Raw pair rotation into a fresh tensor (uses ``out=``: not for autograd, see the Functions below).

    ``halves``: one full multiply and two in-place ``addcmul_`` on the halves (no
    concatenation; ~25% faster than mul/addcmul per half, ~40% faster than the
    cat-based form on a 2-core CPU).
    ``interleaved``: one complex multiplication when ``x`` can be viewed as complex.
    """
    if x.dtype in (torch.float16, torch.bfloat16):  # one rounding at the end instead of three
        return _rotate(x.float(), cos.float(), sin.float(), layout).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    pair_shape = x.shape[:-1] + (x.shape[-1] // 2,)
    if not (_fits(cos.shape, pair_shape) and _fits(sin.shape, pair_shape)):
        full = torch.broadcast_shapes(pair_shape, cos.shape, sin.shape)
        if full != pair_shape:  # tables with more leading dims than x: expand x
            x = x.expand(full[:-1] + (x.shape[-1],))
    if layout == "halves":
        xv = x.unflatten(-1, (2, -1))  # (..., L, 2, P) view
        out = xv * cos.unsqueeze(-2)  # one full pass: [x1 c, x2 c]
        o1, o2 = out.unbind(-2)
        x1, x2 = xv.unbind(-2)
        o1.addcmul_(x2, sin, value=-1.0)  # x1 c - x2 s
        o2.addcmul_(x1, sin)  # x2 c + x1 s
        return out.flatten(-2)
    xp = x.unflatten(-1, (-1, 2))  # (..., L, P, 2)
    if x.dtype in (torch.float32, torch.float64) and xp.stride(-1) == 1 and x.is_contiguous():
        z = torch.view_as_complex(xp) * torch.complex(cos, sin)
        return torch.view_as_real(z).flatten(-2)
    x1, x2 = xp[..., 0], xp[..., 1]
    return torch.stack([torch.addcmul(x1 * cos, x2, sin, value=-1.0), torch.addcmul(x2 * cos, x1, sin)], -1).flatten(-2)


def _fits(small, big) -> bool:
    """``small`` broadcasts to ``big`` without growing it (cheaper than torch.broadcast_shapes)."""
    return len(small) <= len(big) and all(a == 1 or a == b for a, b in zip(reversed(small), reversed(big)))


class _RotateByTable(torch.autograd.Function):
    """``R(theta) x`` with constant cos/sin tables; backward is ``R(-theta) g``."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout):
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.x_shape = layout, x.shape
        return _rotate(x, cos, sin, layout)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return _rotate(g, cos, -sin, ctx.layout).sum_to_size(ctx.x_shape), None, None, None


def _pair_halves(t: Tensor, layout: str) -> tuple[Tensor, Tensor]:
    if layout == "halves":
        first, second = t.chunk(2, dim=-1)
        return first, second
    tp = t.unflatten(-1, (-1, 2))
    return tp[..., 0], tp[..., 1]


class _RotateByAngles(torch.autograd.Function):
    """Rotate several tensors ``(B, H, L, 2P)`` by the same angles ``(B|1, H|1, L, P)``.

    cos/sin are computed once. Backward: ``grad_x = R(-theta) g`` and, with
    ``o = R(theta) x`` (so ``d o / d theta = (-o2, o1)``), ``grad_theta = sum over
    tensors of g2 o1 - g1 o2``, reduced to the angles' broadcast shape.
    """

    @staticmethod
    def forward(ctx, angles, layout, *xs):
        # half-precision tensors rotate in float32 (_rotate): cos/sin stay float32, not rounded first
        dtype = torch.promote_types(xs[0].dtype, torch.float32)
        cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)
        outs = tuple(_rotate(x, cos, sin, layout) for x in xs)
        ctx.layout, ctx.angle_shape, ctx.angle_dtype = layout, angles.shape, angles.dtype
        ctx.x_shapes = [x.shape for x in xs]
        # the outputs are needed only for the angle gradient: frozen angles save just cos/sin
        ctx.save_for_backward(cos, sin, *(outs if ctx.needs_input_grad[0] else ()))
        return outs

    @staticmethod
    def backward(ctx, *gs):
        cos, sin, *outs = ctx.saved_tensors
        layout = ctx.layout
        neg_sin = -sin
        grads: list[Tensor | None] = []
        g_theta = None
        outs = outs or [None] * len(gs)
        for g, o, shape in zip(gs, outs, ctx.x_shapes):
            if g is None:
                grads.append(None)
                continue
            grads.append(_rotate(g, cos, neg_sin, layout).sum_to_size(shape))
            if ctx.needs_input_grad[0]:
                g1, g2 = _pair_halves(g, layout)
                o1, o2 = _pair_halves(o, layout)
                if g_theta is None:
                    g_theta = g2 * o1
                else:
                    g_theta.addcmul_(g2, o1)
                g_theta.addcmul_(g1, o2, value=-1.0)
        if g_theta is not None:
            g_theta = g_theta.sum_to_size(ctx.angle_shape).to(ctx.angle_dtype)
        return (g_theta, None, *grads)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "halves") -> Tensor:
    """Rotate every pair of ``x (..., L, 2P)`` by the angles whose cos/sin are given.

    ``cos``/``sin``: ``(L, P)`` or broadcastable to ``(..., L, P)``. Returns a new
    tensor of the shape of ``x``. Standard RoPE sign (see module docstring).
    Constant tables take a custom autograd Function (backward = inverse rotation,
    nothing but the tables saved); tables that require grad take plain autograd.
    """
    _check_layout(layout)
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)):
        return _rotate_autograd(x, cos, sin, layout)
    if not (torch.is_grad_enabled() and x.requires_grad):  # inference (decoding): no Function overhead
        return _rotate(x, cos, sin, layout)
    return _RotateByTable.apply(x, cos, sin, layout)


def _rotate_autograd(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """The pair rotation in plain differentiable ops: for tables that require grad, and under
    torch.compile, where inductor fuses it anyway and a custom autograd Function would keep AOT
    autograd from caching the compiled graph (every cached compile re-ran it)."""
    if x.dtype in (torch.float16, torch.bfloat16):  # one rounding at the end instead of three
        return _rotate_autograd(x.float(), cos.float(), sin.float(), layout).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = _pair_halves(x, layout)
    o1 = torch.addcmul(x1 * cos, x2, sin, value=-1.0)
    o2 = torch.addcmul(x2 * cos, x1, sin)
    if layout == "halves":
        return torch.cat([o1, o2], dim=-1)
    return torch.stack([o1, o2], dim=-1).flatten(-2)


def _normalize_channels(channels: Channels, dim: int) -> tuple[int, ...] | None:
    """A tuple of channel indices, or None for 'all channels in order'."""
    if channels is None:
        return None
    if isinstance(channels, slice):
        chans = tuple(range(*channels.indices(dim)))
    else:
        chans = tuple(int(c) for c in channels)
    if len(chans) % 2 or len(set(chans)) != len(chans) or any(c < 0 or c >= dim for c in chans):
        raise ShapeError(
            f"rotary channel group {list(chans)[:8]}... is not an even-sized set of distinct channels < {dim}",
            hint="a rotated group needs an even number of distinct channel indices inside the head dimension.",
        )
    return None if chans == tuple(range(dim)) else chans


@lru_cache(maxsize=256)
def _plan(chans: tuple[int, ...], dim: int, layout: str):
    """How to rotate a group: ('prefix', m) | ('embed', pair_idx) | ('gather', idx)."""
    m = len(chans)
    if chans == tuple(range(m)):
        return ("prefix", m)
    full = {p: k for k, p in enumerate(channel_pairs(range(dim), layout))}
    pairs = channel_pairs(chans, layout)
    if all(p in full for p in pairs):
        # Every group pair is a pair of the full layout (e.g. halves "quarters"
        # {0..D/4-1} u {D/2..3D/4-1}): rotate the whole head with identity
        # (cos=1, sin=0) on the other pairs - no gather/scatter at all.
        return ("embed", tuple(full[p] for p in pairs))
    return ("gather", chans)


def _on_group(xs, params, pads, channels, layout, core):
    """Apply ``core(xs, params)`` (a full-head rotation) to the channel group of each x.

    ``params``: per-pair tensors ``(..., L, P_group)`` (cos/sin tables or angles);
    ``pads``: their identity values (1/0 for cos/sin, 0 for angles) used when the
    group is embedded into the full layout.
    """
    _check_layout(layout)
    dim = xs[0].shape[-1]
    chans = _normalize_channels(channels, dim)
    if chans is None:
        return core(xs, params)
    if params[0].shape[-1] != len(chans) // 2:
        raise ShapeError(f"rotary tables/angles have {params[0].shape[-1]} pairs but the channel group has {len(chans) // 2}")
    # eager: the memoised plan; under torch.compile the plain function (dynamo traces through, and warns on, lru_cache)
    kind, arg = (_plan.__wrapped__ if torch.compiler.is_compiling() else _plan)(chans, dim, layout)
    if kind == "prefix":
        outs = core([x[..., :arg] for x in xs], params)
        return [torch.cat([o, x[..., arg:]], dim=-1) for o, x in zip(outs, xs)]
    idx = torch.tensor(arg, device=xs[0].device)
    if kind == "embed":
        full = [torch.full(p.shape[:-1] + (dim // 2,), pad, dtype=p.dtype, device=p.device).index_copy(-1, idx, p)
                for p, pad in zip(params, pads)]
        return core(xs, full)
    outs = core([x.index_select(-1, idx) for x in xs], params)
    return [x.index_copy(-1, idx, o) for o, x in zip(outs, xs)]


def apply_rotary_channels(x: Tensor, cos: Tensor, sin: Tensor, channels: Channels = None, layout: str = "halves") -> Tensor:
    """Rotate only the channel group ``channels`` of ``x (B, H, L, D)``; others unchanged.

    ``cos``/``sin``: ``(L, P)`` or broadcastable ``(..., L, P)`` with ``P = len(channels) / 2``.
    Fast paths: a contiguous prefix group (slice + cat) and groups whose pairs are
    pairs of the full layout, e.g. halves quarters ``{0..D/4-1} u {D/2..3D/4-1}``
    (identity-padded tables, no gather); otherwise index_select / index_copy.
    """
    core = lambda xs, p: [apply_rotary(xs[0], p[0], p[1], layout)]  # noqa: E731
    return _on_group([x], [cos, sin], [1.0, 0.0], channels, layout, core)[0]


def rotate_by_angles(x: Tensor, angles: Tensor, layout: str = "halves", channels: Channels = None) -> Tensor:
    """Rotate pairs of ``x (B, H, L, D)`` by per-position angles ``(B|1, H|1, L, P)``.

    For accumulated or data-dependent angles. cos/sin are taken in the angles'
    dtype (pass float64 angles, reduced mod 2 pi, for long contexts) and cast to
    ``x.dtype``; gradients flow to ``angles`` and ``x``.
    """
    return rotate_many_by_angles([x], angles, layout, channels)[0]


def rotate_many_by_angles(xs: Sequence[Tensor], angles: Tensor, layout: str = "halves",
                          channels: Channels = None) -> list[Tensor]:
    """:func:`rotate_by_angles` for several tensors sharing the angles (cos/sin computed once)."""
    if torch.compiler.is_compiling():  # plain ops: inductor fuses them, and AOT autograd can cache the graph
        def core(ys, p):
            cos, sin = torch.cos(p[0]), torch.sin(p[0])
            return [_rotate_autograd(y, cos, sin, layout) for y in ys]
    else:
        core = lambda ys, p: list(_RotateByAngles.apply(p[0], layout, *ys))  # noqa: E731
    return _on_group(list(xs), [angles], [0.0], channels, layout, core)
