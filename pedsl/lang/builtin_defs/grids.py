"""Frequency grids (num[pair]; rot_dim = the group's channel count): geometric, NTK, dynamic NTK,
YaRN, LongRoPE, Llama 3, span, logspace, per_pair (one record each).

Every grid is static: ``fold_env`` gives a :class:`~pedsl.lang.values.Vec` over the group's pairs.
The two that read the run-time length n (``reads_length``: dynamic_ntk, longrope) fold again at each
length in the run-time walk, and their ``emit`` is the generated module's code for any length:
``emit(fold_at, pairs, **static literals)``, ``fold_at(n)`` the code of the grid folded at length n
(None: no length). The closed forms are in :mod:`pedsl.formulas`.
"""

from __future__ import annotations

import math

from pedsl.formulas import geometric_values, ntk_base, span_values, yarn_values
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue, scalar
from pedsl.lang.types import Ty, num
from pedsl.lang.values import EvalIssue, Vec, number, pairs_of, show

# ------------------------------------------------------------------ typing rules


def _grid(*scalars: str):
    def rule(a: dict[str, Ty]) -> Ty:
        scalar(a, *scalars)
        return num("pair")

    return rule


def flag(a: dict[str, Ty], name: str) -> None:
    if a[name].kind != "bool":
        raise TypeIssue(f"'{name}' must be true or false, not {a[name].show()}", name)


def _yarn_rule(a: dict[str, Ty]) -> Ty:
    scalar(a, "base", "factor", "original", "beta_fast", "beta_slow")
    flag(a, "truncate")
    return num("pair")


def _longrope_rule(a: dict[str, Ty]) -> Ty:
    scalar(a, "base", "original")
    for name in ("short_factor", "long_factor"):
        if a[name].kind != "list":
            raise TypeIssue(f"'{name}' must be a list of numbers, one per rotary pair", name)
    return num("pair")


def _per_pair_rule(a: dict[str, Ty]) -> Ty:
    if a["values"].kind != "list":
        raise TypeIssue("per_pair() takes a list of numbers, one per rotary pair", "values")
    return num("pair")


# ------------------------------------------------------------------ folds


def _geometric(env, node, base):
    base = number(base, node, "base")
    if base <= 1:
        raise EvalIssue(f"the base must be > 1, got {base:g}", node)
    return Vec("pair", geometric_values(base, pairs_of(env, node)))


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
    return Vec("pair", geometric_values(ntk_base(base, factor, 2 * p), p))


def _dynamic_ntk(env, node, base, factor, original):
    p = pairs_of(env, node)
    base, factor, original = _scaling(node, base, factor, original)
    n = env.n if env.n is not None else original
    if n > original:
        s = factor * n / original - (factor - 1)
        base = ntk_base(base, s, 2 * p)
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


def _yarn(env, node, base, factor, original, beta_fast, beta_slow, truncate):
    p = pairs_of(env, node)
    base, s, orig, fast, slow = (number(v, node, w) for v, w in (
        (base, "base"), (factor, "factor"), (original, "original"), (beta_fast, "beta_fast"), (beta_slow, "beta_slow")))
    if not isinstance(truncate, bool):
        raise EvalIssue(f"yarn(): truncate must be true or false, got {show(truncate)}", node)
    if base <= 1 or s <= 0 or orig <= 0 or fast <= 0 or slow <= 0:
        raise EvalIssue("yarn(): base must exceed 1; factor, original, beta_fast and beta_slow must be positive", node)
    return Vec("pair", yarn_values(base, s, orig, p, fast, slow, truncate))


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
    """Hugging Face's rule, branch for branch: with equal factors the smooth band shrinks to the one
    wavelength original / low_freq_factor, where HF divides by zero (a NaN in its table): refused there."""
    p = pairs_of(env, node)
    base, factor, orig = _scaling(node, base, factor, original)
    lo, hi = number(low_freq_factor, node, "low_freq_factor"), number(high_freq_factor, node, "high_freq_factor")
    if lo <= 0:
        raise EvalIssue(f"llama3(): low_freq_factor must be > 0, got {lo:g}", node)
    if hi < lo:
        raise EvalIssue(f"llama3(): high_freq_factor ({hi:g}) is below low_freq_factor ({lo:g})", node,
                        hint="Hugging Face warns, then ignores high_freq_factor: give high >= low "
                             "(equal factors, as Llama 4 Scout's, leave no smooth band)")
    low_wavelen, high_wavelen = orig / lo, orig / hi
    out = []
    for w in geometric_values(base, p):
        wavelen = 2 * math.pi / w
        if wavelen < high_wavelen:
            out.append(w)
        elif wavelen > low_wavelen:
            out.append(w / factor)
        elif hi == lo:
            raise EvalIssue(
                f"llama3(): a pair's wavelength {wavelen!r} is exactly original / low_freq_factor with equal "
                "factors: the smooth band divides 0 by 0 there (Hugging Face's table holds NaN)", node,
                hint="move original or low/high_freq_factor off that wavelength")
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * w / factor + smooth * w)
    return Vec("pair", tuple(out))


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


# ------------------------------------------------------------------ code at any run-time length


def _emit_dynamic_ntk(fold_at, pairs, base, factor, original):
    """Past the original length the base grows with n (the largest position of the call + 1; cached
    keys keep the table they were rotated with): the NTK base of factor * n / original - (factor - 1)."""
    grown = f"{base} * ({factor} * n_run / {original} - ({factor} - 1)) ** ({2 * pairs} / {2 * pairs - 2})"
    return f"_geometric(({grown} if n_run > {original} and {pairs} > 1 else {base}), {pairs}, dev)"


def _emit_longrope(fold_at, pairs, original):
    """The short factors up to the original length, the long ones past it."""
    return f"({fold_at(float(original) + 1)} if n_run > {original} else {fold_at(None)})"


B = Builtin
RECORDS = [
    B("geometric", (("base", 10000.0),), "RoPE grid w_k = base^(-2k / rot_dim)", _grid("base"), "grid",
      fold_env=_geometric),
    B("ntk", (("base", REQUIRED), ("factor", REQUIRED)),
      "NTK-aware grid: base * factor^(rot_dim / (rot_dim - 2))", _grid("base", "factor"), "grid", fold_env=_ntk),
    B("dynamic_ntk", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED)),
      "dynamic NTK: the NTK grid with factor (factor * n / original) - (factor - 1) when n > original",
      _grid("base", "factor", "original"), "grid", fold_env=_dynamic_ntk, reads_length=True,
      static=(("base", float), ("factor", float), ("original", float)), emit=_emit_dynamic_ntk),
    B("yarn", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED), ("beta_fast", 32.0),
               ("beta_slow", 1.0), ("truncate", True)),
      "YaRN as Hugging Face and the authors compute it: blend w / factor and w by a ramp over the pair index "
      "between the correction dimensions of beta_fast and beta_slow rotations (floor/ceil when truncate)",
      _yarn_rule, "grid", fold_env=_yarn),
    B("yarn_wavelength", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED), ("alpha", 1.0),
                          ("beta", 32.0)),
      "YaRN's paper formula: blend w / factor and w by the ramp of r = original * w / (2 pi) from alpha to beta",
      _grid("base", "factor", "original", "alpha", "beta"), "grid", fold_env=_yarn_wavelength),
    B("longrope", (("base", REQUIRED), ("short_factor", REQUIRED), ("long_factor", REQUIRED), ("original", REQUIRED)),
      "LongRoPE: geometric(base) / short_factor while n <= original, / long_factor beyond (lists, one per pair)",
      _longrope_rule, "grid", fold_env=_longrope, reads_length=True, static=(("original", float),),
      emit=_emit_longrope),
    B("llama3", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED),
                 ("low_freq_factor", 1.0), ("high_freq_factor", 4.0)),
      "Llama 3 wavelength rule as Hugging Face computes it: keep high frequencies, divide low ones by factor, "
      "smooth between (no band when the two factors are equal, as Llama 4 Scout's)",
      _grid("base", "factor", "original", "low_freq_factor", "high_freq_factor"), "grid", fold_env=_llama3),
    B("span", (("length", REQUIRED), ("cycles", 2.0), ("period", 32.0)),
      "RoPE-ID grid: geometric from 2 pi cycles / length (>= cycles turns in length) to 2 pi / period",
      _grid("length", "cycles", "period"), "grid", fold_env=_span),
    B("logspace", (("first", REQUIRED), ("last", REQUIRED)),
      "one value per pair, geometrically spaced from first to last", _grid("first", "last"), "grid",
      fold_env=_logspace),
    B("per_pair", (("values", REQUIRED),), "a list with one number per rotary pair", _per_pair_rule, "grid",
      fold_env=_per_pair),
]
del B
