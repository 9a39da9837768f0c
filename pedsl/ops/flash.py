"""Torch's CPU flash-attention kernel as the blockwise kernels call it: the forward and backward ops (which
take a float mask and return the log-sum-exp the backward needs), the dtypes they implement, and the
blocks of queries the kernels walk.

Torch only: codegen copies the text after the ``# ----`` banner verbatim into every generated module,
ahead of the sections that use it (:mod:`pedsl.ops.window_kernels`, :mod:`pedsl.ops.distance_bias`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FLASH", "FLASH_BACKWARD", "FLASH_DTYPES", "flash_supports", "query_blocks"]

# <embedded>
# ---------------------------------------------------------------------------------------------
# Torch's CPU flash kernel (copied verbatim into every generated module).
# ---------------------------------------------------------------------------------------------
FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def flash_supports(q: Tensor) -> bool:
    """The flash CPU kernel's inputs: a CPU tensor of a floating dtype it implements."""
    return q.device.type == "cpu" and FLASH is not None and FLASH_BACKWARD is not None and q.dtype in FLASH_DTYPES


def query_blocks(L: int, block: int) -> list[tuple[int, int]]:
    """``(c0, c1)`` of the blocks of ``block`` queries that cover ``0 .. L-1`` (the last one shorter)."""
    return [(c0, min(L, c0 + block)) for c0 in range(0, L, block)]
# </embedded>
