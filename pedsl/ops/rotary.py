"""Rotary (SO(2) pair) rotations of q/k/v: RoPE and its relatives.

Math (SEMANTICS 2a): channels are taken as pairs; pair ``k`` of a vector at
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
rotated pairs. Phases are computed in float64 and cast at the end (SEMANTICS 6).
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
    float32 table at t = 65,536 keeps ~1e-7 rad accuracy (SEMANTICS 6).
    """
    pos = torch.as_tensor(positions).to(torch.float64)
    phase = torch.outer(pos, freqs.to(device=pos.device, dtype=torch.float64))
    phase = torch.remainder(phase, 2.0 * math.pi)
    return torch.cos(phase).to(dtype), torch.sin(phase).to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "halves") -> Tensor:
    """Rotate every pair of ``x (..., L, 2P)`` by the angles whose cos/sin are given.

    ``cos``/``sin``: ``(L, P)`` or broadcastable to ``(..., L, P)``. Returns a new
    tensor of the shape of ``x``. Standard RoPE sign (see module docstring).
    """
    _check_layout(layout)
    if layout == "halves":
        x1, x2 = x.chunk(2, dim=-1)  # views, (..., L, P) each
        # torch.addcmul(a, b, c, value=v) = a + v*b*c: 2 kernels per half instead of 3.
        o1 = torch.addcmul(x1 * cos, x2, sin, value=-1.0)
        o2 = torch.addcmul(x2 * cos, x1, sin)
        return torch.cat([o1, o2], dim=-1)
    xp = x.unflatten(-1, (-1, 2))  # (..., L, P, 2) view
    x1, x2 = xp[..., 0], xp[..., 1]
    o1 = torch.addcmul(x1 * cos, x2, sin, value=-1.0)
    o2 = torch.addcmul(x2 * cos, x1, sin)
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


def group_pairs(chans: Sequence[int], layout: str) -> list[tuple[int, int]]:
    """The (first, second) channel pairs of a group under a layout, in pair order."""
    m = len(chans)
    if layout == "halves":
        return [(chans[k], chans[k + m // 2]) for k in range(m // 2)]
    return [(chans[2 * k], chans[2 * k + 1]) for k in range(m // 2)]


@lru_cache(maxsize=256)
def _plan(chans: tuple[int, ...], dim: int, layout: str):
    """How to rotate a group: ('prefix', m) | ('embed', pair_idx) | ('gather', idx)."""
    m = len(chans)
    if chans == tuple(range(m)):
        return ("prefix", m)
    full = {p: k for k, p in enumerate(group_pairs(tuple(range(dim)), layout))}
    pairs = group_pairs(chans, layout)
    if all(p in full for p in pairs):
        # Every group pair is a pair of the full layout (e.g. halves "quarters"
        # {0..D/4-1} u {D/2..3D/4-1}): rotate the whole head with identity
        # (cos=1, sin=0) on the other pairs - no gather/scatter at all.
        return ("embed", tuple(full[p] for p in pairs))
    return ("gather", chans)


def apply_rotary_channels(x: Tensor, cos: Tensor, sin: Tensor, channels: Channels = None, layout: str = "halves") -> Tensor:
    """Rotate only the channel group ``channels`` of ``x (B, H, L, D)``; others unchanged.

    ``cos``/``sin``: ``(L, P)`` or broadcastable ``(..., L, P)`` with ``P = len(channels) / 2``.
    Fast paths: a contiguous prefix group (slice + cat) and groups whose pairs are
    pairs of the full layout (identity-padded tables); otherwise index_select /
    index_copy.
    """
    _check_layout(layout)
    dim = x.shape[-1]
    chans = _normalize_channels(channels, dim)
    if chans is None:
        return apply_rotary(x, cos, sin, layout)
    if cos.shape[-1] != len(chans) // 2:
        raise ShapeError(f"rotary tables have {cos.shape[-1]} pairs but the channel group has {len(chans) // 2}")
    kind, arg = _plan(chans, dim, layout)
    if kind == "prefix":
        return torch.cat([apply_rotary(x[..., :arg], cos, sin, layout), x[..., arg:]], dim=-1)
    if kind == "embed":
        idx = torch.tensor(arg, device=x.device)
        shape = cos.shape[:-1] + (dim // 2,)
        cos_f = torch.ones(shape, dtype=cos.dtype, device=cos.device).index_copy(-1, idx, cos)
        sin_f = torch.zeros(shape, dtype=sin.dtype, device=sin.device).index_copy(-1, idx, sin)
        return apply_rotary(x, cos_f, sin_f, layout)
    idx = torch.tensor(arg, device=x.device)
    g = apply_rotary(x.index_select(-1, idx), cos, sin, layout)
    return x.index_copy(-1, idx, g)


def rotate_by_angles(x: Tensor, angles: Tensor, layout: str = "halves", channels: Channels = None) -> Tensor:
    """Rotate pairs of ``x (B, H, L, D)`` by per-position angles ``(B|1, H|1, L, P)``.

    For accumulated or data-dependent angles. cos/sin are taken in the angles'
    dtype (pass float64 angles for long contexts) and cast to ``x.dtype``;
    gradients flow to ``angles``.
    """
    cos = torch.cos(angles).to(x.dtype)
    sin = torch.sin(angles).to(x.dtype)
    return apply_rotary_channels(x, cos, sin, channels, layout)
