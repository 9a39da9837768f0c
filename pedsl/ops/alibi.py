"""ALiBi head slopes (Press et al., "Train Short, Test Long", ICLR 2022).

``b(i, j) = -m_h (i - j)`` with slopes ``m_h = 2^(-8h/H)``, ``h = 1..H`` when
``H`` is a power of two; otherwise the slopes of the closest lower power of two
``c``, followed by every other slope of the ``2c`` sequence (indices 0, 2, 4, ...)
for the remaining ``H - c`` heads. This is exactly ``get_slopes`` of
ofirpress/attention_with_linear_biases (fairseq/models/transformer.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pedsl.errors import ShapeError
from pedsl.formulas import alibi_slopes as slope_values  # the one implementation (pure Python)


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi slopes ``(H,)`` float64, head ``h`` (0-based) first; see module docstring."""
    if int(num_heads) != num_heads or num_heads < 1:
        raise ShapeError(f"ALiBi needs a positive number of heads, got {num_heads!r}")
    return torch.tensor(slope_values(int(num_heads)), dtype=torch.float64)
