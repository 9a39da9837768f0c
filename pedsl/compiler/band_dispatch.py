"""Where a sliding window runs in process, for callers outside the general forward: the C++ band kernel
(:mod:`pedsl.ops.band_kernel`) where its declaration's call check (:func:`pedsl.compiler.kernel_support.band_call`)
takes the call and the kernels are built, the flash path of :mod:`pedsl.ops.window_kernels` elsewhere. The
decision is the general forward's :func:`pedsl.compiler.general.attention.window_attend`, given pedsl's band kernel.

The kernel stays in ``pedsl.ops`` (which never imports the compiler); the decision, which reads the kernel
registry, is the compiler's.
"""

from __future__ import annotations

from torch import Tensor

from pedsl.compiler.general.attention import window_attend
from pedsl.ops import band_kernel


class BandKernels:
    """The members of the general forward's kernels that :func:`window_attend` reads: pedsl's band kernel."""

    band_attention = staticmethod(band_kernel.band_attention)
    bias_ready = staticmethod(band_kernel.bias_kernel_ready)


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """:func:`pedsl.ops.window_kernels.sliding_window_attention` (same arguments, grouped key/value
    heads allowed) on the C++ kernel where it runs, on the flash path elsewhere."""
    return window_attend(BandKernels.band_attention, BandKernels.bias_ready, q, k, v, window, None)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, chunk: int | None) -> Tensor:
    """:func:`pedsl.ops.window_kernels.banded_attention`, with a sliding window on the C++ kernel
    where it runs (chunks keep their one ``is_causal`` call)."""
    return window_attend(BandKernels.band_attention, BandKernels.bias_ready, q, k, v, window, chunk)
