"""Closed forms shared by the language's constant folding and the torch kernels, in pure Python.

A leaf module (no torch, no language): :mod:`pedsl.lang.builtin_defs` folds ``slopes(heads)`` and the frequency grids with it,
:mod:`pedsl.ops.alibi` builds its tensors from it and :mod:`pedsl.hf` translates Hugging Face's
configurations with it, so none of those layers imports another. :func:`channel_pairs` is the one
rotary pairing (kernels, code generator, ``explain``, instruments).
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


def geometric_values(base: float, pairs: int, rot_dim: int | None = None) -> tuple[float, ...]:
    rot_dim = rot_dim or 2 * pairs
    return tuple(base ** (-2.0 * k / rot_dim) for k in range(pairs))


def ntk_base(base: float, factor: float, rot_dim: int) -> float:
    if rot_dim <= 2:
        return base
    return base * factor ** (rot_dim / (rot_dim - 2))


def yarn_values(base: float, factor: float, original: float, pairs: int, beta_fast: float = 32.0,
                beta_slow: float = 1.0, truncate: bool = True) -> tuple[float, ...]:
    """YaRN frequencies as Hugging Face's ``_compute_yarn_parameters`` (and the authors' code) compute
    them: a linear ramp over the pair index k between the correction dimensions of ``beta_fast`` and
    ``beta_slow`` rotations in ``original`` tokens, floored/ceiled when ``truncate``."""
    dim = 2 * pairs

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    out = []
    for k in range(pairs):
        extrapolated = 1.0 / base ** (2 * k / dim)
        ramp = min(1.0, max(0.0, (k - low) / (high - low)))  # 0: keep the frequency, 1: interpolate
        out.append(extrapolated / factor * ramp + extrapolated * (1 - ramp))
    return tuple(out)


def yarn_mscale_value(factor: float, mscale: float = 0.0, mscale_all_dim: float = 0.0,
                      attention_factor: float = 0.0) -> float:
    """Hugging Face's YaRN attention factor; 0 stands for HF's unset (None)."""
    if attention_factor:
        return attention_factor

    def g(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return g(mscale) / g(mscale_all_dim)
    return g(1.0)


def longrope_mscale_value(factor: float, original: float, attention_factor: float = 0.0) -> float:
    """Hugging Face's LongRoPE attention factor; 0 stands for HF's unset (None)."""
    if attention_factor:
        return attention_factor
    if factor <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def span_values(pairs: int, length: float, cycles: float, period: float) -> tuple[float, ...]:
    w_max = 2 * math.pi / period
    w_min = 2 * math.pi * cycles / length
    if pairs == 1:
        return (w_max,)
    return tuple(w_max * (w_min / w_max) ** (k / (pairs - 1)) for k in range(pairs))


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


def xpos_decays(zeta: float, pairs: int) -> tuple[float, ...]:
    """xPos's per-pair decay zeta_k = (2k / d + zeta) / (1 + zeta), d = 2 * pairs the group's width
    (Sun et al. 2022; rotary-embedding-torch and x-transformers: ``(arange(0, d, 2) + 0.4 d) / (1.4 d)``)."""
    d = 2 * pairs
    return tuple((2 * k / d + zeta) / (1 + zeta) for k in range(pairs))
