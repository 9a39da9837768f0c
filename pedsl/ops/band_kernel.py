"""Sliding-window attention on a C++ CPU kernel (``band_kernel.cpp`` next to this file, built with pedsl's other
C++ kernels on first use: :mod:`pedsl.ops.cpu_kernels`): the kernel's autograd functions and the handle of its
ops. Which call runs on it, and the flash-kernel path of :mod:`pedsl.ops.window_kernels` wherever it cannot run,
is :mod:`pedsl.compiler.band_dispatch` (the check is the kernel's declaration in the compiler's kernel registry).

Why a kernel of its own: the flash CPU kernel skips only whole tiles of 512 keys, so the banded calls of
``window_kernels`` compute 767 keys per query for the 512 a window of 512 shows. Here each block of 64
queries is two GEMMs forward and five backward over the one contiguous run of keys the block can see
(``64 + N - 1`` keys: the window plus two masked triangles), with an exact one-pass softmax (the block
holds whole rows) and the flash identity backward (``dS = P (dP - rowsum(dO O))`` with ``P`` recomputed
from the log-sum-exp). Grouped key/value heads are read in place (no repeat). What a call holds beyond its
inputs and gradients: the output and log-sum-exp, and one block's scores per thread (two in the
backward), ``64 x (64 + N - 1)`` each. At L = 8192, N = 512 (float32, one thread) it costs about 0.6x the flash path.

With a window as wide as the call the same kernel is full causal attention, and it adds two biases inside
its rows (:func:`causal_bias_attention`): a key term of float64 coordinates, ``g_j - g_i`` (ALiBi's
``slope * (j - i)``, a forget gate's ``G_i - G_j``), the difference taken in float64 and rounded once, and a
distance table ``t[i - j]`` (T5's buckets, KERPLE), with their gradients. Its exp is a polynomial in
``cpu_kernels.h`` that vectorises, so one thread runs it faster than PyTorch's flash kernel without a bias.
After the bias it soft-caps the scores (Gemma 2, a vectorised tanh) and adds a sink logit to each row's
denominator (GPT-OSS; softmax plus one's logit 0), with the sink's gradient, inside a window or not: the general
forward sends a fresh call of one document there (``rows_attend`` in :mod:`pedsl.compiler.general.attention`).

The general forward reaches both through its kernels (``band_attention``, ``bias_attention``); a module written by
``pedsl compile`` carries the marked section (and the C++ files, built on first use like pedsl's), so it runs
the same kernels. ``PEDSL_CPU_KERNELS=0`` keeps the flash path and the blocks of queries, in process and in
generated modules.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.ops.cpu_kernels import kernel_ops

F64 = torch.float64

# <embedded>
CPP_BAND_BLOCK = 64  # queries per block (each block reads at most CPP_BAND_BLOCK + N - 1 keys); 32-128 measure alike


def band_ops():
    """``torch.ops.pedsl_band`` (``forward``, ``backward``), or None where the C++ kernels cannot be built
    (:func:`pedsl.ops.cpu_kernels.kernel_ops`): the callers then take the flash path."""
    return kernel_ops("pedsl_band")


class BandAttention(torch.autograd.Function):
    """Sliding-window causal attention of ``q (B, Hq, L, D)`` over ``k, v (B, Hk, L, D)`` (Hq a multiple of
    Hk) at positions 0..L-1, default scale, on the C++ kernel (float32 or float64, CPU)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse = band_ops().forward(q, k, v, window, CPP_BAND_BLOCK)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.window = window
        return out

    @staticmethod
    @once_differentiable  # the kernel's backward has no backward of its own
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = band_ops().backward(dout.contiguous(), q, k, v, out, lse, ctx.window, CPP_BAND_BLOCK)[:3]
        return dq, dk, dv, None


class BiasAttention(torch.autograd.Function):
    """Causal attention of ``q (B, Hq, L, D)`` over ``k, v (B, Hk, L, D)`` with the bias
    ``key_term[b, h, j] - key_term[b, h, i] + table[h, i - j]`` (either may be None), the scores then soft-capped
    at ``cap`` (None: not), one more logit ``sink[b, h, i]`` of value zero in each row's denominator (None: no
    sink), inside a sliding ``window`` (None: every earlier key), on the C++ kernel (float32 or float64, CPU).
    ``key_term (B|1, Hq|1, L)`` is read in float64; ``table (Hq|1, >= L)`` and ``sink (B|1, Hq|1, L|1)`` are
    cast to q's dtype once."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, key_term: Tensor | None, table: Tensor | None,
                sink: Tensor | None = None, cap: float | None = None, window: int | None = None):
        B, Hq, L, _ = q.shape
        q, k, v = (t.contiguous() for t in (q, k, v))
        g = None if key_term is None else key_term.detach().to(F64).expand(B, Hq, L).contiguous()
        tr = None if table is None else table.detach()[..., :L].to(q.dtype).expand(Hq, L).flip(-1).contiguous()
        sk = None if sink is None else sink.detach().to(q.dtype).expand(B, Hq, L).contiguous()
        ctx.extras = (max(min(window or L, L), 1), CPP_BAND_BLOCK, g, tr, sk, float(cap or 0.0))
        out, lse = band_ops().forward(q, k, v, *ctx.extras)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.likes = [None if t is None else (t.shape, t.dtype) for t in (key_term, table, sink)]
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        L = q.shape[2]
        want_g, want_t, want_s = ctx.needs_input_grad[3:6]
        dq, dk, dv, dg, dtr, dsk = band_ops().backward(dout.contiguous(), q, k, v, out, lse, *ctx.extras, want_g,
                                                       want_t, want_s)
        key_like, table_like, sink_like = ctx.likes
        dkey = _summed_to(dg, *key_like) if want_g else None
        dsink = _summed_to(dsk, *sink_like) if want_s else None
        dtab = None
        if want_t:
            shape, dtype = table_like
            dtab = torch.zeros(shape, dtype=dtype, device=q.device)
            dtab[..., :L] = _summed_to(dtr.sum(0).flip(-1), (shape[0], L), dtype)
        return dq, dk, dv, dkey, dtab, dsink, None, None


def _summed_to(grad: Tensor, shape, dtype) -> Tensor:
    """A gradient of an expanded tensor summed over the dimensions ``shape`` broadcast (size 1 there)."""
    dims = [d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1]
    return (grad.sum(dims, keepdim=True) if dims else grad).to(dtype)


def bias_kernel_ready() -> bool:
    """Whether the C++ kernels are built and loaded (:func:`band_ops`), so that
    :func:`causal_bias_attention` runs."""
    return band_ops() is not None


def band_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Sliding-window causal attention (:class:`BandAttention`) on the C++ kernel: the caller has checked the call
    (:func:`pedsl.compiler.kernel_support.band_call`) and that the kernels are built (:func:`bias_kernel_ready`)."""
    return BandAttention.apply(q, k, v, window)


def causal_bias_attention(q: Tensor, k: Tensor, v: Tensor, key_term: Tensor | None = None,
                          table: Tensor | None = None, sink: Tensor | None = None, cap: float | None = None,
                          window: int | None = None) -> Tensor:
    """Causal attention of one full sequence at positions 0..L-1 (grouped key/value heads allowed) with the
    biases, soft cap, sink and window of :class:`BiasAttention`, on the C++ kernel: the caller has checked the
    call (:func:`pedsl.compiler.kernel_support.bias_call`)."""
    return BiasAttention.apply(q, k, v, key_term, table, sink, cap, window)
# </embedded>
