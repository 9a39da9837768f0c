"""Where a sliding window runs in process: the C++ band kernel (:mod:`pedsl.ops.band_kernel`) where its
declaration's call check (:func:`pedsl.compiler.kernel_support.band_call`) takes the call and the kernels are
built, the flash path of :mod:`pedsl.ops.window_kernels` elsewhere. The general forward imports
:func:`banded_attention` from here; a module written by ``pedsl compile`` carries ``window_kernels``' own.

The kernel stays in ``pedsl.ops`` (which never imports the compiler); the decision, which reads the kernel
registry, is the compiler's.
"""

from __future__ import annotations

from torch import Tensor

from pedsl.compiler.kernel_support import band_call
from pedsl.ops import band_kernel, window_kernels


def runs_on_kernel(q: Tensor, k: Tensor, v: Tensor, window: int) -> bool:
    """Whether the C++ kernel takes this call (its declaration's check, :func:`band_call`: a window narrower
    than the call, CPU tensors of one of its dtypes) and it is built."""
    return band_call(q, k, v, window) and band_kernel.band_ops() is not None


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """:func:`pedsl.ops.window_kernels.sliding_window_attention` (same arguments, grouped key/value
    heads allowed) on the C++ kernel where it runs, on the flash path elsewhere."""
    if runs_on_kernel(q, k, v, window):
        return band_kernel.BandAttention.apply(q, k, v, window)
    return window_kernels.banded_attention(q, k, v, window, None)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, chunk: int | None) -> Tensor:
    """:func:`pedsl.ops.window_kernels.banded_attention`, with a sliding window on the C++ kernel
    where it runs (chunks keep their one ``is_causal`` call)."""
    if window is not None:
        return sliding_window_attention(q, k, v, window)
    return window_kernels.banded_attention(q, k, v, window, chunk)
