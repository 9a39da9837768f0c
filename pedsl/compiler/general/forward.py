"""The general forward itself (:func:`general_forward`, the call of :mod:`pedsl.compiler.general`'s
docstring), its input checks and :class:`TorchKernels`, its primitives in plain torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pedsl.compiler.scores import differential_heads, differential_lambda, paired_values, scale_by_temperature, sink_column
from pedsl.compiler.general.inputs import InputError, Layout, last_tokens, layout
from pedsl.compiler.general.cache import AttentionCache, update_cache
from pedsl.compiler.general.windows import shape_of, trim_cache
from pedsl.compiler.general.values import Window
from pedsl.compiler.general.transport import rotate_pairs, transport_qkv, transports, undo_values
from pedsl.compiler.general.bias import biases
from pedsl.compiler.general.attention import attend_blocks, distance_attend
from pedsl.compiler.general.path import path_attend

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

# <embedded>
# ---------------------------------------------------------------------- forward
class TorchKernels:
    """The primitives of the general forward in plain torch: rotations of a transform's channel pairs
    (``t.first``, ``t.second``), a float64 cumulative sum of step angles, no blockwise PaTH kernels
    (PaTH runs by its decode rule), no Toeplitz distance-bias kernel and no C++ kernel (distance tables and
    biases by blocks of queries, windows on the flash path). A generated module subclasses this with its copies
    of the kernels its plan allows (``embedded.Carried.kernels_class``)."""

    layout = None  # rotates whatever pairs a transform names
    path_attention = path_local_attention = path_transported_keys = distance_attention = mlp_attention = None
    distance_supported = band_attention = bias_attention = bias_ready = None

    @staticmethod
    def rotate(x, cos, sin, t, channels):
        return rotate_pairs(x, cos, sin, t.first, t.second)

    @staticmethod
    def rotate_by_angles(xs, angles, t, channels):
        cos, sin = torch.cos(angles), torch.sin(angles)
        return [rotate_pairs(x, cos, sin, t.first, t.second) for x in xs]

    @staticmethod
    def cumulative_angles(a):
        return torch.cumsum(a, dim=-2)


def check_call(scheme: SchemeSide, q, k, v, cache) -> None:
    """q (B, heads, Lq, head_dim) and k, v (B, Hkv, L, head_dim) with Hkv dividing the heads and Lq <= L;
    a cache made by this module for this batch."""
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if (Hq, D) != (scheme.heads, scheme.head_dim) or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise InputError(f"expected q (B, {scheme.heads}, Lq, {scheme.head_dim}) and k, v (B, Hkv, L, "
                         f"{scheme.head_dim}); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if Hq % Hkv or Lq > L:
        raise InputError(f"k and v need a divisor of {Hq} heads and at least Lq = {Lq} tokens, got {tuple(k.shape)}")
    if cache is not None and (not isinstance(cache, AttentionCache) or cache.owner != id(scheme)
                              or cache.batch_size != B):
        raise InputError("cache was made by another module or for another batch size: use module.new_cache(B)")


def general_forward(scheme: SchemeSide, kernels: Kernels, q, k, v, *, x=None, tokens=None, positions=None,
                    document_ids=None, cache=None, attn_mask=None, lay: Layout | None = None, span_ids=None) -> Tensor:
    """The call of the module docstring: q (B, Hq, Lq, D), k, v (B, Hkv, L, D) -> (B, Hq, Lq, D)."""
    B, Hq, Lq, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    if lay is None:
        lay = layout(scheme.heads, B, L, Lq, positions, document_ids, attn_mask, cache, q.device, scheme.axes, scheme,
                     span_ids)
    win = Window(lay, x, tokens, cache, q.device)
    vals = scheme.token_values(win, q.dtype)
    tr = transports(scheme, kernels, vals, lay, cache, q.dtype)
    if scheme.remap_bounds:  # rotated per regime, block by block (general.remap)
        tr = tr._replace(rots=[])
    bi = biases(scheme, vals, lay, cache)
    if tr.per_head and Hkv != Hq:  # transports differ per query head: one transported key per query head
        k, v = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    tau = None if vals.tau is None else last_tokens(vals.tau, Lq, -1)
    sink = sink_column(scheme, q, tau)
    qc = q if scheme.cope_max_pos is not None else None  # CoPE reads the query as given
    q, k, v, undo = transport_qkv(kernels, tr, q, k, v)
    q = scale_by_temperature(q, tau)
    lam = None
    if scheme.normalize == "differential":  # one softmax per head over its values and its partner's
        rows = scheme.differential_lambda
        if rows is None:
            raise ValueError("normalize = differential learns its lambda rows")
        lam = differential_lambda(rows, scheme.lambda_init)
        v = paired_values(v, Hq)
    if tr.householder is not None:
        o = path_attend(scheme, kernels, q, k, v, tr.householder, bi.coord, lay, cache, sink)
    else:
        o = distance_attend(scheme, kernels, q, k, v, bi, lay, cache)
        if o is None:
            o = attend_blocks(scheme, q, k, v, bi, lay, cache, sink, qc, kernels)
    o = undo_values(kernels, undo, o)  # no value transport beside differential attention (the checker's E264)
    if lam is not None:
        o = differential_heads(o, lam)
    if cache is not None:
        update_cache(cache, lay, tr, bi, win, scheme.conv_history)
        shape = shape_of(scheme)
        if shape is not None:
            trim_cache(cache, shape)
    return o
# </embedded>
