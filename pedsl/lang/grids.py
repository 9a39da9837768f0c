"""Frequency grids (geometric, NTK, YaRN, LongRoPE, Llama 3, span, ...), folded statically (ALiBi slopes: builtin_defs/bias.py).

Each builtin takes ``(env, node, **arguments)`` and returns a :class:`~pedsl.lang.values.Vec`;
:data:`GRIDS` maps builtin names to them for :mod:`pedsl.lang.fold`. The ``*_values``
functions are the closed forms, in plain floats.
"""

from __future__ import annotations

import math

from pedsl.lang.values import EvalIssue, Vec, number, pairs_of, show


def geometric_values(base: float, pairs: int, rot_dim: int | None = None) -> tuple[float, ...]:
    rot_dim = rot_dim or 2 * pairs
    return tuple(base ** (-2.0 * k / rot_dim) for k in range(pairs))


def _geometric(env, node, base):
    base = number(base, node, "base")
    if base <= 1:
        raise EvalIssue(f"the base must be > 1, got {base:g}", node)
    return Vec("pair", geometric_values(base, pairs_of(env, node)))


def _ntk_base(base: float, factor: float, rot_dim: int) -> float:
    if rot_dim <= 2:
        return base
    return base * factor ** (rot_dim / (rot_dim - 2))


def _scaling(node, base, factor, original=1.0) -> tuple[float, float, float]:
    """The shared arguments of the context-extension grids: base > 1, factor > 0, original > 0."""
    base, factor, original = (number(v, node, w) for v, w in ((base, "base"), (factor, "factor"), (original, "original")))
    if base <= 1:
        raise EvalIssue(f"{node.func}(): the base must be > 1, got {base:g}", node)
    if factor <= 0:
        raise EvalIssue(f"{node.func}(): the factor must be > 0, got {factor:g}", node)
    if original <= 0:
        raise EvalIssue(f"{node.func}(): the original length must be > 0, got {original:g}", node,
                        hint="original is the training length the grid was made for")
    return base, factor, original


def _ntk(env, node, base, factor):
    p = pairs_of(env, node)
    base, factor, _ = _scaling(node, base, factor)
    return Vec("pair", geometric_values(_ntk_base(base, factor, 2 * p), p))


def _dynamic_ntk(env, node, base, factor, original):
    p = pairs_of(env, node)
    base, factor, original = _scaling(node, base, factor, original)
    n = env.n if env.n is not None else original
    if n > original:
        s = factor * n / original - (factor - 1)
        base = _ntk_base(base, s, 2 * p)
    return Vec("pair", geometric_values(base, p))


def _yarn_wavelength(env, node, base, factor, original, alpha, beta):
    p = pairs_of(env, node)
    base, s, orig = _scaling(node, base, factor, original)
    alpha, beta = number(alpha, node, "alpha"), number(beta, node, "beta")
    if beta <= alpha:
        raise EvalIssue(f"yarn_wavelength(): beta ({beta:g}) must exceed alpha ({alpha:g})", node)
    out = []
    for w in geometric_values(base, p):
        r = orig * w / (2 * math.pi)
        g = min(1.0, max(0.0, (r - alpha) / (beta - alpha)))
        out.append((1 - g) * w / s + g * w)
    return Vec("pair", tuple(out))


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


def _yarn(env, node, base, factor, original, beta_fast, beta_slow, truncate):
    p = pairs_of(env, node)
    base, s, orig, fast, slow = (number(v, node, w) for v, w in (
        (base, "base"), (factor, "factor"), (original, "original"), (beta_fast, "beta_fast"), (beta_slow, "beta_slow")))
    if not isinstance(truncate, bool):
        raise EvalIssue(f"yarn(): truncate must be true or false, got {show(truncate)}", node)
    if base <= 1 or s <= 0 or orig <= 0 or fast <= 0 or slow <= 0:
        raise EvalIssue("yarn(): base must exceed 1; factor, original, beta_fast and beta_slow must be positive", node)
    return Vec("pair", yarn_values(base, s, orig, p, fast, slow, truncate))


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


def _yarn_mscale(env, node, factor, mscale, mscale_all_dim, attention_factor):
    return yarn_mscale_value(*(number(v, node, w) for v, w in (
        (factor, "factor"), (mscale, "mscale"), (mscale_all_dim, "mscale_all_dim"),
        (attention_factor, "attention_factor"))))


def longrope_mscale_value(factor: float, original: float, attention_factor: float = 0.0) -> float:
    """Hugging Face's LongRoPE attention factor; 0 stands for HF's unset (None)."""
    if attention_factor:
        return attention_factor
    if factor <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _longrope_mscale(env, node, factor, original, attention_factor):
    factor, original, af = (number(v, node, w) for v, w in (
        (factor, "factor"), (original, "original"), (attention_factor, "attention_factor")))
    if original <= 1:
        raise EvalIssue("longrope_mscale(): original must exceed 1", node)
    return longrope_mscale_value(factor, original, af)


def _longrope(env, node, base, short_factor, long_factor, original):
    p = pairs_of(env, node)
    base, orig = number(base, node, "base"), number(original, node, "original")
    for name, lst in (("short_factor", short_factor), ("long_factor", long_factor)):
        if not isinstance(lst, list) or len(lst) != p:
            got = f"{len(lst)} values" if isinstance(lst, list) else show(lst)
            raise EvalIssue(f"longrope(): {name} has {got} for {p} rotary pairs", node,
                            hint=f"the channel group rotates {2 * p} channels: give {p} numbers")
    n = env.n
    factors = long_factor if n is not None and n > orig else short_factor  # HF: seq_len > original -> long
    dim = 2 * p
    return Vec("pair", tuple(1.0 / (number(f, node, "each factor") * base ** (2 * k / dim)) for k, f in enumerate(factors)))


def _llama3(env, node, base, factor, original, low_freq_factor, high_freq_factor):
    p = pairs_of(env, node)
    base, factor, orig = _scaling(node, base, factor, original)
    lo, hi = number(low_freq_factor, node, "low_freq_factor"), number(high_freq_factor, node, "high_freq_factor")
    if lo <= 0:
        raise EvalIssue(f"llama3(): low_freq_factor must be > 0, got {lo:g}", node)
    if hi <= lo:
        raise EvalIssue("llama3(): high_freq_factor must exceed low_freq_factor", node)
    low_wavelen, high_wavelen = orig / lo, orig / hi
    out = []
    for w in geometric_values(base, p):
        wavelen = 2 * math.pi / w
        if wavelen < high_wavelen:
            out.append(w)
        elif wavelen > low_wavelen:
            out.append(w / factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * w / factor + smooth * w)
    return Vec("pair", tuple(out))


def span_values(pairs: int, length: float, cycles: float, period: float) -> tuple[float, ...]:
    w_max = 2 * math.pi / period
    w_min = 2 * math.pi * cycles / length
    if pairs == 1:
        return (w_max,)
    return tuple(w_max * (w_min / w_max) ** (k / (pairs - 1)) for k in range(pairs))


def _span(env, node, length, cycles, period):
    length, cycles, period = (number(v, node, w) for v, w in ((length, "length"), (cycles, "cycles"), (period, "period")))
    if length <= 0 or period <= 0 or cycles <= 0:
        raise EvalIssue("span(): length, cycles and period must be positive", node)
    if 2 * math.pi * cycles / length > 2 * math.pi / period:
        raise EvalIssue(
            f"span(): {cycles:g} cycles in {length:g} tokens is faster than the period {period:g}", node,
            hint="the lowest frequency must not exceed the highest: lengthen 'length' or the period",
        )
    return Vec("pair", span_values(pairs_of(env, node), length, cycles, period))


def _logspace(env, node, first, last):
    p = pairs_of(env, node)
    first, last = number(first, node, "first"), number(last, node, "last")
    if first <= 0 or last <= 0:
        raise EvalIssue("logspace(): first and last must be positive", node)
    if p == 1:
        return Vec("pair", (first,))
    return Vec("pair", tuple(first * (last / first) ** (k / (p - 1)) for k in range(p)))


def _per_pair(env, node, values):
    p = pairs_of(env, node)
    if len(values) != p:
        raise EvalIssue(
            f"per_pair() got {len(values)} values for {p} rotary pairs", node,
            hint=f"the channel group rotates {2 * p} channels: give {p} numbers",
        )
    return Vec("pair", tuple(number(v, node, "each value") for v in values))


GRIDS = {
    "geometric": _geometric,
    "ntk": _ntk,
    "dynamic_ntk": _dynamic_ntk,
    "yarn": _yarn,
    "yarn_wavelength": _yarn_wavelength,
    "yarn_mscale": _yarn_mscale,
    "longrope": _longrope,
    "longrope_mscale": _longrope_mscale,
    "llama3": _llama3,
    "span": _span,
    "logspace": _logspace,
    "per_pair": _per_pair,
}
