"""PaTH's scan rows and UT inverse on the C++ CPU kernel: the Python side of ``path_kernel.cpp`` (not to be
confused with :mod:`pedsl.ops.path_kernels`, PaTH's torch entry points, which run these rows where built).
The C++ source lies next to this file (``path_kernel.cpp`` next to this file, built with pedsl's other
C++ kernels on first use: :mod:`pedsl.ops.cpu_kernels`). :class:`pedsl.ops.path_blocks.PathTorchRows` has
the same steps in torch (where the C++ kernels are not built), with the same arguments and results up to rounding.
A module written by ``pedsl compile`` for a PaTH scheme carries the marked section (its kernels call
:func:`path_forward_rows` and :func:`path_local_forward_rows`).

The scan's loops over the pairs of blocks run one head per task with BLAS GEMMs on operands that stay in cache
and one pass per row for the online softmax, the recomputed probabilities and dS (torch's loops batch every
product over all heads, operands out of cache, with five to eight elementwise passes between them); the UT
transform's inverse is a forward substitution of a third of LAPACK's triangular solve's multiply-adds.
"""

from __future__ import annotations

import torch

from pedsl.ops.cpu_kernels import kernel_ops
from pedsl.ops.path_blocks import PathTorchRows
from pedsl.ops.path_kernels import path_forward, path_local_forward

# <embedded>
PATH_KERNEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # PaTH's kernels upcast half


class PathCppRows:
    """:class:`PathTorchRows`' scan loops and inverse on ``torch.ops.pedsl_path`` (CPU float32 / float64; the scan
    never calls the per-block row steps when it has its loops)."""

    def __init__(self, ops):
        self.unit_lower_inverse = ops.unit_lower_inverse
        self.scan_forward, self.scan_backward = ops.scan_forward, ops.scan_backward


_path_rows_cached: list = []


def path_rows(x: torch.Tensor):
    """The steps for tensors like ``x``: the C++ ones on CPU (half precision runs PaTH in float32) where the kernels
    build, else :class:`PathTorchRows`."""
    if x.device.type != "cpu" or x.dtype not in PATH_KERNEL_DTYPES:
        return PathTorchRows
    if not _path_rows_cached:
        ops = kernel_ops("pedsl_path")
        _path_rows_cached.append(PathTorchRows if ops is None else PathCppRows(ops))
    return _path_rows_cached[0]


def path_forward_rows(q, *args, **kwargs):
    """PaTH's blockwise forward (:func:`pedsl.ops.path_kernels.path_forward`, unchecked) on :func:`path_rows`."""
    return path_forward(q, *args, rows=path_rows(q), **kwargs)


def path_local_forward_rows(q, *args, **kwargs):
    """PaTH inside a window (:func:`pedsl.ops.path_kernels.path_local_forward`, unchecked) on :func:`path_rows`."""
    return path_local_forward(q, *args, rows=path_rows(q), **kwargs)
# </embedded>
