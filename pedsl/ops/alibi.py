"""ALiBi head slopes (Press et al., "Train Short, Test Long", ICLR 2022).

``b(i, j) = -m_h (i - j)`` with slopes ``m_h = 2^(-8h/H)``, ``h = 1..H`` when
``H`` is a power of two; otherwise the slopes of the closest lower power of two
``c``, followed by every other slope of the ``2c`` sequence (indices 0, 2, 4, ...)
for the remaining ``H - c`` heads. This is exactly ``get_slopes`` of
ofirpress/attention_with_linear_biases (fairseq/models/transformer.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pedsl.errors import ShapeError


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))  # = 2^(-8/n)
    return [start * start**i for i in range(n)]


def _slopes(n: int) -> list[float]:
    if math.log2(n).is_integer():
        return _power_of_two_slopes(n)
    closest = 2 ** math.floor(math.log2(n))
    return _power_of_two_slopes(closest) + _slopes(2 * closest)[0::2][: n - closest]


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi slopes ``(H,)`` float64, head ``h`` (0-based) first; see module docstring."""
    if int(num_heads) != num_heads or num_heads < 1:
        raise ShapeError(f"ALiBi needs a positive number of heads, got {num_heads!r}")
    return torch.tensor(_slopes(int(num_heads)), dtype=torch.float64)
