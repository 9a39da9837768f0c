"""Closed forms shared by the language's constant folding and the torch kernels, in pure Python.

A leaf module (no torch, no language): :mod:`pedsl.lang.grids` folds ``slopes(heads)`` with it
and :mod:`pedsl.ops.alibi` builds its tensors from it, so neither layer imports the other.
"""

from __future__ import annotations

import math


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi slopes (Press et al.; ofirpress/attention_with_linear_biases get_slopes)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if heads <= 0:
        raise ValueError("the number of heads must be positive")
    if math.log2(heads).is_integer():
        return tuple(power_of_two(heads))
    closest = 2 ** math.floor(math.log2(heads))
    return tuple(power_of_two(closest) + power_of_two(2 * closest)[0::2][: heads - closest])


def channel_pairs(channels, layout: str) -> list[tuple[int, int]]:
    """The (first, second) channels of each rotary pair of a channel group, in pair order
    (docs/semantics.md §2a): ``halves`` pairs ``c_k`` with ``c_{k + m/2}`` (GPT-NeoX, HF
    ``rotate_half``), ``interleaved`` pairs ``c_{2k}`` with ``c_{2k+1}`` (GPT-J)."""
    ch = list(channels)
    m = len(ch)
    if layout == "halves":
        return [(ch[k], ch[k + m // 2]) for k in range(m // 2)]
    if layout == "interleaved":
        return [(ch[2 * k], ch[2 * k + 1]) for k in range(m // 2)]
    raise ValueError(f"unknown rotary pairing layout {layout!r}")
