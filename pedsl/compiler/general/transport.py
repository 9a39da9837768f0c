"""Transports in the general forward: the records of the transforms, the rotations of channel pairs, the
angles of the new tokens continuing the cache's, xPos scales, and moving q, k and v (and undoing v)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from pedsl.compiler.general.inputs import DENSE, F64, InputError, Layout, ROPE, SO2, angle_dtype, last_tokens
from pedsl.compiler.general.dense import dense_positions, dense_rotate
from pedsl.compiler.general.cache import stored
from pedsl.compiler.general.values import TokenValues

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

# <embedded>
# ---------------------------------------------------------------------- transport
TWO_PI = 2.0 * math.pi


class Transports(NamedTuple):
    # (transform, (cos, sin)) for ROPE, (transform, float64 angles) for SO2, (transform, (blocks, basis)) for DENSE,
    # over the L new tokens
    rots: list
    householder: tuple | None  # (w (B, H, L, D), beta (B, H, L)) in the compute dtype, or None
    angles: dict  # transform index -> the running cumulative angles to keep in the cache
    per_head: bool  # a transport differs per query head: k and v need one copy per query head


def transports(scheme: SchemeSide, kernels: Kernels, vals: TokenValues, lay: Layout, cache, dtype) -> Transports:
    """Rotations of the L new tokens (cumulative angles continue the cache's) and PaTH's steps."""
    B, L = lay.valid.shape
    adt = angle_dtype(dtype)
    valid = lay.valid
    rots: list[tuple[Any, tuple[Tensor, ...] | Tensor]] = []  # (transform, its cos and sin, or its angles)
    angles: dict[int, Tensor] = {}
    hh: tuple[Tensor, Tensor] | None = None
    for i, (t, raw) in enumerate(zip(scheme.transforms, vals.transports)):
        if t.kind == ROPE:
            if isinstance(raw, tuple):
                cs = tuple(last_tokens(c, L) for c in raw)
            else:
                ph = torch.remainder(last_tokens(raw, L).to(F64), TWO_PI)
                cs = ((t.scale * torch.cos(ph)).to(adt), (t.scale * torch.sin(ph)).to(adt))
            if t.xpos_gamma:
                up = xpos_scale(t, lay.positions, xpos_centre(kernels, t, i, lay, cache))
                cs = cs + (up.unsqueeze(1).to(adt),)
            rots.append((t, cs))
        elif t.kind == SO2:
            a = last_tokens(raw, L).to(F64) * valid[:, None, :, None]
            A = kernels.cumulative_angles(a)
            prev = cache.angles.get(i) if cache is not None else None
            if prev is not None:
                A = A + prev.unsqueeze(-2)
            A = torch.remainder(A, TWO_PI)
            angles[i] = A[..., -1, :]
            rots.append((t, A))
        elif t.kind == DENSE:  # each token's own rotation: exact for the cache's keys, rotated once as they enter
            gens = scheme.dense[str(i)]
            rots.append((t, (gens.rotations(dense_positions(lay, gens.axes)), gens.basis_matrix())))
        else:
            w_g, beta = raw
            H, D = scheme.heads, scheme.head_dim
            wv = last_tokens(w_g, L).to(dtype).expand(B, H, L, len(t.channels))
            if len(t.channels) == D:
                w = wv
            else:
                w = torch.zeros(B, H, L, D, dtype=dtype, device=valid.device).index_copy(
                    -1, torch.tensor(t.channels, device=valid.device), wv)
            hh = (w, last_tokens(beta, L, -1).expand(B, H, L).to(dtype) * valid[:, None, :])
    per_head = hh is not None or any((a[0] if isinstance(a, tuple) else a).shape[1] > 1 for _, a in rots)
    return Transports(rots, hh, angles, per_head)


def full_layout_pairs(t: Transform, D: int, layout: str | None):
    """The pairs of the whole head's layout (``layout``: the kernels' own, None for kernels that rotate
    any pairs they are given) that a transform's pairs are: (first, second) of the whole head and the
    indices k of the transform's pairs among them - interleaved (2k, 2k + 1) or halves (k, k + D/2) - or None."""
    if isinstance(t, Transform):
        first, second = t.first, t.second
    else:  # a plan's step: its pairs in the kernels' layout, within its channels
        n = len(t.channels)
        first, second = ((t.channels[0::2], t.channels[1::2]) if layout == "interleaved"
                         else (t.channels[: n // 2], t.channels[n // 2:]))
    if layout != "halves" and all(a % 2 == 0 and b == a + 1 for a, b in zip(first, second)):
        return tuple(range(0, D, 2)), tuple(range(1, D, 2)), tuple(a // 2 for a in first)
    if layout != "interleaved" and all(a < D // 2 and b == a + D // 2 for a, b in zip(first, second)):
        return tuple(range(D // 2)), tuple(range(D // 2, D)), tuple(first)
    return None


def merged_rotations(rots: list, D: int, layout: str | None = None) -> list:
    """Several RoPE-table rotations of q and k only (axial schemes: one group per axis) whose pairs are pairs
    of one whole-head layout, as one rotation of the whole head (identity on the other pairs): one pass over
    q and k instead of one per group. Anything else is returned as it is."""
    table = [(t, ang) for t, ang in rots if t.kind == ROPE and not t.values]
    if len(table) < 2:
        return rots
    full = [full_layout_pairs(t, D, layout) for t, _ in table]
    if any(f is None for f in full) or len({f[0] for f in full}) != 1:
        return rots
    lead = torch.broadcast_shapes(*(ang[0].shape[:-1] for _, ang in table))
    like = table[0][1][0]
    cos = torch.ones(*lead, D // 2, dtype=like.dtype, device=like.device)
    sin = torch.zeros(*lead, D // 2, dtype=like.dtype, device=like.device)
    for (t, (c, s)), (_, _, ks) in zip(table, full):
        idx = torch.tensor(ks, device=like.device)
        cos = cos.index_copy(-1, idx, c.expand(*lead, c.shape[-1]))
        sin = sin.index_copy(-1, idx, s.expand(*lead, s.shape[-1]))
    whole = Transform(ROPE, False, tuple(range(D)), full[0][0], full[0][1])
    return [(whole, (cos, sin))] + [r for r in rots if not (r[0].kind == ROPE and not r[0].values)]


def xpos_scale(t, positions: Tensor, centre: int) -> Tensor:
    """xPos's scale of q's pairs at ``positions`` (B, L): ``zeta_k ** ((p - centre) / gamma)``, (B, L, P)
    float64; k's pairs take its inverse (docs/semantics.md §2c). InputError where a scale passes 2^+-63:
    a score matrix multiplies a query's scale by any key's inverse one (masked keys too), and past 2^126
    that product overflows float32, so the scores would be inf - inf or 0 * inf."""
    z = torch.tensor(t.xpos_zeta, dtype=F64, device=positions.device)
    e = (positions.to(F64) - centre) / t.xpos_gamma
    bits = float(e.abs().max()) * math.log2(1 / min(t.xpos_zeta)) if e.numel() else 0.0
    if bits > 63:
        raise InputError(f"xpos(gamma = {t.xpos_gamma:g}): positions up to {int(positions.max())} (centre {centre}) "
                         f"need q and k scaled by 2^+-{bits:.1f}, beyond what float32 scores hold (2^+-63)",
                         "raise gamma or use shorter sequences (docs/semantics.md §2c: about 70 gamma tokens)")
    return z ** e.unsqueeze(-1)


def xpos_centre(kernels: Kernels, t, i: int, lay: Layout, cache) -> int:
    """The centre c of xPos's exponents (p - c) / gamma in this call. Without a cache, n // 2 (as
    rotary-embedding-torch and x-transformers), so the scales stay within zeta^(+-n / (2 gamma)). With a
    cache, the centre its keys were stored at, as long as it is within gamma of n // 2; past that the
    cached keys are rescaled once to the new centre (``zeta^((c_new - c_old) / gamma)`` per pair), so a
    long decode stays as far from overflow as one full forward. The logits read only c's differences,
    so every centre gives the same attention."""
    c = lay.n // 2
    if cache is None:
        return c
    old = cache.centres.get(i)
    if old is None or cache.length == 0:
        cache.centres[i] = c
        return c
    if abs(c - old) <= t.xpos_gamma:
        return old
    K = stored(cache, "k", cache.length)
    f = torch.tensor(t.xpos_zeta, dtype=F64, device=K.device) ** ((c - old) / t.xpos_gamma)
    f = f.to(angle_dtype(K.dtype)).expand(1, 1, K.shape[2], len(t.xpos_zeta))
    ch = t.channels if len(t.channels) != K.shape[-1] else None
    K.copy_(kernels.rotate(K, f, torch.zeros_like(f), t, ch))  # angle 0: a scale of each pair
    cache.centres[i] = c
    return c


def transport_qkv(kernels: Kernels, tr: Transports, q, k, v):
    """q (its last Lq tokens), k and v rotated by their absolute angles; what undoes the value rotation."""
    Lq, D, adt = q.shape[2], q.shape[3], angle_dtype(q.dtype)
    undo: list[tuple[Any, tuple | None, tuple[Tensor, Tensor] | Tensor]] = []  # (transform, channels, angles)
    for t, ang in merged_rotations(tr.rots, D, kernels.layout):
        ch = t.channels if len(t.channels) != D else None
        if t.kind == DENSE:  # q and k only (the checker's E235)
            rot, basis = ang
            q = dense_rotate(q, last_tokens(rot, Lq, 2), basis, ch)
            k = dense_rotate(k, rot, basis, ch)
        elif t.kind == ROPE:
            ck, sk = ang[:2]
            cq, sq = last_tokens(ck, Lq), last_tokens(sk, Lq)
            if len(ang) == 3:  # xPos: q's pairs times zeta^((i - c) / gamma), k's divided by zeta^((j - c) / gamma)
                up = ang[2]
                cq, sq, ck, sk = cq * last_tokens(up, Lq), sq * last_tokens(up, Lq), ck / up, sk / up
            q = kernels.rotate(q, cq, sq, t, ch)
            k = kernels.rotate(k, ck, sk, t, ch)
            if t.values:
                v = kernels.rotate(v, ck, sk, t, ch)
                undo.append((t, ch, (cq, sq)))
        else:
            ang_d = ang.to(adt)
            q = kernels.rotate_by_angles([q], last_tokens(ang_d, Lq), t, ch)[0]
            if t.values:
                k, v = kernels.rotate_by_angles([k, v], ang_d, t, ch)
                undo.append((t, ch, last_tokens(ang, Lq)))
            else:
                k = kernels.rotate_by_angles([k], ang_d, t, ch)[0]
    return q, k, v, undo


def undo_values(kernels: Kernels, undo, o):
    """R(A_i)^T = R(-A_i) at the query's angle, for every transport that rotated the values."""
    for t, ch, a in reversed(undo):
        if isinstance(a, tuple):
            o = kernels.rotate(o, a[0], -a[1], t, ch)
        else:
            o = kernels.rotate_by_angles([o], (-a).to(angle_dtype(o.dtype)), t, ch)[0]
    return o


class Transform(NamedTuple):
    """A transport as the general forward reads it: its kind, whether it also turns the values, its
    channels, the pairs (first[k], second[k]) its rotations turn, rotate's scale of q and k, and xPos's
    gamma and per-pair decays."""

    kind: str
    values: bool
    channels: tuple
    first: tuple
    second: tuple
    scale: float = 1.0
    xpos_gamma: float = 0.0  # xpos(...): gamma and each pair's decay zeta_k; 0 and () for other transports
    xpos_zeta: tuple = ()


def channel_run(idx) -> slice | tuple:
    """Channel indices as a slice where they step evenly (a view of x, not a gather), else as given."""
    idx = tuple(idx)
    step = idx[1] - idx[0] if len(idx) > 1 else 1
    if idx and step > 0 and all(b - a == step for a, b in zip(idx, idx[1:])):
        return slice(idx[0], idx[-1] + 1, step)
    return idx


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, first, second) -> Tensor:
    """x (B, H, L, D) with its channel pairs (first[k], second[k]) rotated by the angles behind cos, sin
    (..., L, P); computed in cos's dtype and rounded once. Pairs of evenly stepping channels (the halves and the
    interleaved layouts) are read as views; pairs that are the two halves of every channel are written by one
    concatenation."""
    dt = x.dtype
    x = x.to(cos.dtype)
    first, second = channel_run(first), channel_run(second)
    xa, xb = x[..., first], x[..., second]
    ra, rb = xa * cos - xb * sin, xb * cos + xa * sin
    D = x.shape[-1]
    if first == slice(0, D // 2, 1) and second == slice(D // 2, D, 1):
        return torch.cat([ra, rb], dim=-1).to(dt)
    out = x.clone()
    out[..., first] = ra
    out[..., second] = rb
    return out.to(dt)
# </embedded>
