"""The Python side of the C++ MLP-bias kernel ``mlp_kernel.cpp`` (:mod:`pedsl.ops.mlp_bias` is the torch kernel it
falls back to): FIRE's causal MLP-bias attention (:func:`pedsl.ops.mlp_bias.mlp_bias_attention`, same arguments and result) on
a C++ CPU kernel (``mlp_kernel.cpp`` next to this file, built with pedsl's other C++ kernels on first use:
:mod:`pedsl.ops.cpu_kernels`), with the torch kernel of :mod:`pedsl.ops.mlp_bias` wherever it cannot run.

Where ``u`` is monotone over the distances (FIRE's ``log(c d + 1)``), ``x = u[i - j] w[i]`` is monotone along
each row, so each of the MLP's units switches on or off at most once per row: the kernel finds the switches by
bisection and adds the bias per segment of a row as ``A_h + B_h u[d]``, one multiply-add per score, inside a
blockwise causal attention with an exact one-pass softmax; its backward returns every input's gradient (q, k, v,
u, w and the MLP's). At L = 2048 and 8192 (B = 1, H = 8, D = 64, float32, one thread) FIRE's attention costs
about 0.85-0.9x and 1.0-1.1x causal SDPA's, forward and backward. Other inputs (a ``u`` that is not monotone, values
that are not finite, bfloat16, another device) and a missing build take the torch kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.ops.cpu_kernels import kernel_ops
from pedsl.ops.mlp_bias import mlp_bias_attention

# <embedded>
MLP_BLOCK = 128  # queries per block (each block reads the keys 0 .. its last query); 64 measures alike at 2048,
# ~5% slower at 8192
MLP_DTYPES = (torch.float32, torch.float64)


def mlp_ops():
    """``torch.ops.pedsl_mlp`` (``forward``, ``backward``), or None where the C++ kernels cannot be built."""
    return kernel_ops("pedsl_mlp")


class MlpAttention(torch.autograd.Function):
    """:func:`mlp_attention` on the C++ kernel: the MLP's inputs in q's dtype, u cut to L entries."""

    @staticmethod
    def forward(ctx, q, k, v, u, w, w1, b1, w2, b2, scale: float):
        L = q.shape[2]
        mlp = [t.detach().to(q.dtype).contiguous() for t in (u[:L], w, w1.reshape(-1), b1, w2, b2)]
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse = mlp_ops().forward(q, k, v, *mlp, scale, MLP_BLOCK)
        ctx.save_for_backward(q, k, v, out, lse, *mlp)
        ctx.scale, ctx.block, ctx.like = scale, MLP_BLOCK, [(t.shape, t.dtype) for t in (u, w, w1, b1, w2, b2)]
        return out

    @staticmethod
    @once_differentiable  # the kernel's backward has no backward of its own
    def backward(ctx, dout):
        q, k, v, out, lse, *mlp = ctx.saved_tensors
        dq, dk, dv, *dmlp = mlp_ops().backward(dout.contiguous(), q, k, v, out, lse, *mlp, ctx.scale, ctx.block)
        (u_shape, u_dtype), *rest = ctx.like
        du = dmlp[0].new_zeros(u_shape)
        du[:dmlp[0].shape[0]] = dmlp[0]  # u past L reaches no pair
        grads = [du.to(u_dtype)] + [g.reshape(shape).to(dtype) for g, (shape, dtype) in zip(dmlp[1:], rest)]
        return (dq, dk, dv, *grads, None)


def runs_on_kernel(q: Tensor, k: Tensor, v: Tensor, u: Tensor, w: Tensor, mlp: tuple) -> bool:
    """Whether the C++ kernel takes these inputs: CPU tensors, q, k, v of one of its dtypes and one shape, ``u``
    monotone over the first L distances (each unit then switches at most once along a row), u and w finite, and
    the kernel built."""
    L = q.shape[2]
    tensors = (q, k, v, u, w, *mlp)
    if not (q.dtype == k.dtype == v.dtype and q.dtype in MLP_DTYPES and q.shape == k.shape == v.shape
            and all(t.device.type == "cpu" and t.is_floating_point() for t in tensors) and L > 0):
        return False
    ul, wl = u[:L].detach().to(q.dtype), w.detach().to(q.dtype)
    step = ul[1:] - ul[:-1]
    monotone = bool((step >= 0).all()) or bool((step <= 0).all())
    return monotone and bool(torch.isfinite(ul).all() and torch.isfinite(wl).all()) and mlp_ops() is not None


def mlp_kernel_attention(q: Tensor, k: Tensor, v: Tensor, u: Tensor, w: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                         b2: Tensor, *, scale: float | None = None) -> Tensor | None:
    """:func:`mlp_attention` on the C++ kernel where it runs (:func:`runs_on_kernel`); None elsewhere (the caller
    takes a torch path: pedsl's torch kernel, or a generated module's blocks of queries)."""
    mlp = (w1, b1, w2, b2)
    H, L = q.shape[1], q.shape[2]
    K = w1.numel()
    shapes_ok = (q.dim() == 4 and u.dim() == 1 and u.shape[0] >= L and w.shape == (L,) and b1.shape == (K,)
                 and w2.shape == (H, K) and b2.shape == (H,))
    if not (shapes_ok and runs_on_kernel(q, k, v, u, w, mlp)):
        return None
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return MlpAttention.apply(q, k, v, u, w, *mlp, scale)
# </embedded>


def mlp_attention(q: Tensor, k: Tensor, v: Tensor, u: Tensor, w: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                  b2: Tensor, *, scale: float | None = None) -> Tensor:
    """:func:`pedsl.ops.mlp_bias.mlp_bias_attention` (same arguments, the same checks and result) on the C++
    kernel where it runs (:func:`runs_on_kernel`), on the torch kernel elsewhere."""
    out = mlp_kernel_attention(q, k, v, u, w, w1, b1, w2, b2, scale=scale)
    return mlp_bias_attention(q, k, v, u, w, w1, b1, w2, b2, scale=scale) if out is None else out  # its own checks
