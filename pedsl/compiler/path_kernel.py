"""PaTH's row loops on the C++ kernel (``path_kernel.cpp`` next to this file, built with pedsl's other C++
kernels on first use: :mod:`pedsl.compiler.cpu_kernels`): the elementwise steps between the batched products
of PaTH's scan and block preprocessing (:class:`pedsl.ops.path_blocks.PathTorchRows` has them in torch, with
the same arguments and results up to rounding). The products stay torch's; these replace five to eight
passes over each block of scores with one or two while it is in cache, and LAPACK's triangular solve of
the UT transform with a forward substitution of a third of its multiply-adds.
"""

from __future__ import annotations

import torch

from pedsl.compiler.cpu_kernels import kernel_ops
from pedsl.ops.path_blocks import PathTorchRows

KERNEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # PaTH's kernels upcast half


class PathCppRows:
    """:class:`PathTorchRows`' steps on ``torch.ops.pedsl_path`` (contiguous CPU float32 / float64 rows)."""

    def __init__(self, ops):
        self.online, self.probs, self.dscores = ops.online, ops.probs, ops.dscores
        self.unit_lower_inverse = ops.unit_lower_inverse
        self.scan_forward, self.scan_backward = ops.scan_forward, ops.scan_backward


_cached: list = []


def path_rows(x: torch.Tensor):
    """The row loops for tensors like ``x``: the C++ ones on CPU (half precision runs PaTH in float32) where the kernels build,
    else :class:`PathTorchRows`."""
    if x.device.type != "cpu" or x.dtype not in KERNEL_DTYPES:
        return PathTorchRows
    if not _cached:
        ops = kernel_ops("pedsl_path")
        _cached.append(PathTorchRows if ops is None else PathCppRows(ops))
    return _cached[0]
