"""Compile-time evaluation of `.pe` expressions in plain Python floats (float64).

Static values are numbers, strings, booleans, lists (for eval lengths) and
vectors along one axis (:class:`Vec` over rotary pairs or heads). Frequency
grids, ALiBi slopes and parameter constraints are evaluated here, without
torch, so `pedsl check` stays fast; the compiler turns the vectors into
float64 tensors. Anything that varies with position, distance or the data is
:data:`DYNAMIC`: the compiler evaluates it at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pedsl import limits
from pedsl.formulas import alibi_slopes
from pedsl.lang import ast


class EvalIssue(Exception):
    def __init__(self, message: str, node: Any = None, hint: str | None = None):
        super().__init__(message)
        self.node = node
        self.hint = hint


@dataclass(frozen=True)
class Vec:
    axis: str  # "pair" | "head"
    values: tuple[float, ...]


class _Dynamic:
    def __repr__(self) -> str:
        return "DYNAMIC"


DYNAMIC = _Dynamic()


@dataclass(frozen=True)
class GroupSpec:
    kind: str  # all | rest | fraction | quarters | range
    args: tuple = ()


@dataclass
class StaticEnv:
    values: dict[str, Any] = field(default_factory=dict)  # params (and structural names)
    lets: dict[str, ast.Expr] = field(default_factory=dict)
    pairs: int | None = None  # rotary pairs of the group being evaluated
    n: int | None = None  # run-time sequence length, when known
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # let name -> value

    def child(self, **kw) -> "StaticEnv":
        return StaticEnv(values=self.values, lets=self.lets, pairs=kw.get("pairs", self.pairs), n=kw.get("n", self.n))


_DYNAMIC_NAMES = {"position", "distance", "x", "token"}


def evaluate(node: ast.Expr, env: StaticEnv, _depth: int = 0) -> Any:
    """The static value of ``node``, or DYNAMIC. Raises EvalIssue on math errors."""
    if _depth > 200:
        raise EvalIssue("definitions nested too deeply (a 'let' that refers to itself?)", node)
    ev = lambda e: evaluate(e, env, _depth + 1)  # noqa: E731
    k = node.kind
    if k == "num":
        return node.value
    if k in ("str", "bool"):
        return node.value
    if k == "list":
        if len(node.items) > limits.MAX_LIST:
            raise EvalIssue(f"a list of {len(node.items):,} items; the limit is {limits.MAX_LIST:,}", node)
        items = [ev(i) for i in node.items]
        return DYNAMIC if any(i is DYNAMIC for i in items) else items
    if k == "name":
        return _name(node, env, _depth)
    if k == "unary":
        v = ev(node.operand)
        return DYNAMIC if v is DYNAMIC else _map(lambda a: -a, v, node)
    if k == "binary":
        a, b = ev(node.left), ev(node.right)
        if a is DYNAMIC or b is DYNAMIC:
            return DYNAMIC
        return _arith(node.op, a, b, node)
    if k == "call":
        return _call(node, env, _depth)
    raise EvalIssue(f"cannot evaluate {k}", node)  # pragma: no cover


def _name(node: ast.Name, env: StaticEnv, depth: int) -> Any:
    name = node.id
    if name in env.values:
        return env.values[name]
    if name in env.lets:
        # Memoised per environment: lets that use each other twice would otherwise cost 2^depth.
        if name not in env.memo:
            env.memo[name] = evaluate(env.lets[name], env, depth + 1)
        return env.memo[name]
    if name == "pi":
        return math.pi
    if name == "e":
        return math.e
    if name == "n":
        return env.n if env.n is not None else DYNAMIC
    if name in _DYNAMIC_NAMES:
        return DYNAMIC
    if name in ("none", "all", "rest"):
        return GroupSpec(name) if name != "none" else None
    if name in ("head", "pair", "channel"):
        return name
    raise EvalIssue(f"unknown name '{name}'", node)


def _map(fn, v: Any, node) -> Any:
    if isinstance(v, Vec):
        return Vec(v.axis, tuple(fn(x) for x in v.values))
    if isinstance(v, list):
        return [_map(fn, x, node) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalIssue(f"expected a number, got {_show(v)}", node)
    return fn(v)


def _show(v: Any) -> str:
    if isinstance(v, Vec):
        return f"a vector over {v.axis}s"
    if isinstance(v, str):
        return f'the string "{v}"'
    return repr(v)


def _op(op: str, a: float, b: float, node) -> float:
    try:
        if op == "+":
            return _finite(a + b, node)
        if op == "-":
            return _finite(a - b, node)
        if op == "*":
            return _finite(a * b, node)
        if op == "/":
            if b == 0:
                raise EvalIssue("division by zero", node)
            r = _finite(a / b, node)
            return int(r) if isinstance(a, int) and isinstance(b, int) and r.is_integer() else r
        if op == "**":
            if isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b * math.log2(abs(a)) > 1024:
                a = float(a)  # an exact int power this large takes unbounded time and memory: overflow instead
            r = a**b
            if isinstance(r, complex):
                raise EvalIssue("a negative number to a fractional power", node)
            return _finite(r, node)
    except OverflowError:
        raise EvalIssue("number too large", node) from None
    raise EvalIssue(f"unknown operator {op}", node)  # pragma: no cover


def _arith(op: str, a: Any, b: Any, node) -> Any:
    for v in (a, b):
        if isinstance(v, (str, bool, GroupSpec)) or v is None:
            raise EvalIssue(f"arithmetic '{op}' on {_show(v)}", node)
    if isinstance(a, Vec) and isinstance(b, Vec):
        if a.axis != b.axis:
            raise EvalIssue(
                f"cannot combine a vector over {a.axis}s with one over {b.axis}s here", node,
                hint="a per-head vector cannot stand where a per-pair one is needed",
            )
        if len(a.values) != len(b.values):
            raise EvalIssue(f"vectors of different lengths ({len(a.values)} and {len(b.values)})", node)
        return Vec(a.axis, tuple(_op(op, x, y, node) for x, y in zip(a.values, b.values)))
    if isinstance(a, list) and isinstance(b, Vec) or isinstance(a, Vec) and isinstance(b, list):
        vec, lst = (a, b) if isinstance(a, Vec) else (b, a)
        if len(lst) != len(vec.values):
            raise EvalIssue(
                f"a list of {len(lst)} numbers combined with {len(vec.values)} {vec.axis}s", node,
                hint=f"give exactly one number per {vec.axis}",
            )
        other = Vec(vec.axis, tuple(float(x) for x in lst))
        return _arith(op, a if isinstance(a, Vec) else other, b if isinstance(b, Vec) else other, node)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise EvalIssue(f"lists of different lengths ({len(a)} and {len(b)})", node)
        return [_arith(op, x, y, node) for x, y in zip(a, b)]
    if isinstance(a, (Vec, list)):
        return _map(lambda x: _op(op, x, b, node), a, node)
    if isinstance(b, (Vec, list)):
        return _map(lambda y: _op(op, a, y, node), b, node)
    return _op(op, a, b, node)


def bind_args(node: ast.Call, names: tuple[tuple[str, object], ...]) -> dict[str, ast.Expr | object]:
    """Positional and keyword arguments of a call -> {param: expr or default}."""
    out: dict[str, Any] = {}
    for (pname, _), arg in zip(names, node.args):
        out[pname] = arg
    for kw in node.kwargs:
        out[kw.name] = kw.value
    for pname, default in names:
        out.setdefault(pname, default)
    return out


def _call(node: ast.Call, env: StaticEnv, depth: int) -> Any:
    from pedsl.lang.builtins import FUNCTIONS

    spec = FUNCTIONS.get(node.func)
    if spec is None:
        raise EvalIssue(f"unknown function '{node.func}'", node)
    bound = bind_args(node, spec.params)
    if node.func in _ARG_RULES:  # the static arguments of a run-time builtin: checked now, not at run time
        checked = _check_args(node, bound, env, depth)
        if node.func == "log_length" and isinstance(env.values.get("position"), int) and "length" in checked:
            i = env.values["position"]  # a probe at one query position (the checker's)
            return max(1.0, math.log(i + 1) / math.log(checked["length"]))
        return DYNAMIC
    if node.func in ("normalize", "rotate", "accumulate", "rotation", "householder"):
        return DYNAMIC
    vals = {}
    for k, v in bound.items():
        if isinstance(v, (ast.Num, ast.Str, ast.Bool, ast.Name, ast.Unary, ast.Binary, ast.Call, ast.ListExpr)):
            vals[k] = evaluate(v, env, depth + 1)
        else:
            vals[k] = v
    if any(v is DYNAMIC for v in vals.values()):
        return DYNAMIC
    fn = _IMPL.get(node.func)
    if fn is None:  # pragma: no cover - every static builtin has an implementation
        raise EvalIssue(f"'{node.func}' has no compile-time value", node)
    try:
        out = fn(env, node, **vals)
    except OverflowError:
        raise EvalIssue(f"{node.func}(): a number too large (overflow)", node) from None
    except (ValueError, ZeroDivisionError) as exc:
        raise EvalIssue(f"{node.func}(): {exc}", node) from None
    if isinstance(out, Vec):
        for v in out.values:
            _finite(v, node, f"{node.func}() gives")
    elif isinstance(out, float):
        _finite(out, node, f"{node.func}() gives")
    return out


def _finite(v: Any, node, what: str = "this gives") -> Any:
    """v, or an EvalIssue when it is infinite, NaN or beyond float32 (it would overflow in a tensor)."""
    if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= limits.FLOAT32_MAX):
        shown = "NaN" if math.isnan(v) else f"{v:g}"
        raise EvalIssue(f"{what} {shown}: not a finite number in float32 (overflow)", node,
                        hint="static values must stay within +-3.4e38; rescale the constants")
    return v


# Static arguments of builtins, checked wherever the call is evaluated (the checker evaluates every
# transport, bias and temperature): (lowest, highest, lowest is exclusive, what it means).
_ARG_RULES: dict[str, dict[str, tuple[float, float, bool, str]]] = {
    "log_length": {"length": (1, math.inf, True, "ln(length) divides: it must be > 1")},
    "linear": {"rank": (0, limits.MAX_RANK, False, "0 (full rank) or a rank up to the cap"),
               "init_bias": (-limits.MAX_INIT, limits.MAX_INIT, False, "the start value of the bias")},
    "shortconv": {"width": (1, limits.MAX_RANK, False, "taps of the convolution")},
    "frozen_random": {"seed": (0, limits.MAX_SEED, False, "a torch seed")},
    "embedding": {"init": (0, limits.MAX_INIT, False, "a standard deviation")},
}


def _check_args(node: ast.Call, bound: dict, env: StaticEnv, depth: int) -> dict[str, float]:
    out = {}
    for name, (lo, hi, open_lo, meaning) in _ARG_RULES[node.func].items():
        arg = bound.get(name)
        if not isinstance(arg, ast.Node):
            continue  # the default
        v = evaluate(arg, env, depth + 1)
        if v is DYNAMIC or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # the type checker reports non-numbers
        if v < lo or (open_lo and v == lo) or v > hi:
            rng = f"> {lo:g}" if open_lo and hi == math.inf else f"{lo:g} .. {hi:g}" if hi < 1e30 else f">= {lo:g}"
            raise EvalIssue(f"{node.func}(): {name} = {v:g} is out of range ({rng}; {meaning})", arg)
        out[name] = v
    return out


# ------------------------------------------------------------------ implementations


def _pairs(env: StaticEnv, node) -> int:
    if env.pairs is None:
        raise EvalIssue("a frequency grid is only defined inside a transport (it needs the group's size)", node)
    return env.pairs


def _num(v: Any, node, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalIssue(f"{what} must be a number, got {_show(v)}", node)
    return float(v)


def geometric_values(base: float, pairs: int, rot_dim: int | None = None) -> tuple[float, ...]:
    rot_dim = rot_dim or 2 * pairs
    return tuple(base ** (-2.0 * k / rot_dim) for k in range(pairs))


def _geometric(env, node, base):
    base = _num(base, node, "base")
    if base <= 1:
        raise EvalIssue(f"the base must be > 1, got {base:g}", node)
    return Vec("pair", geometric_values(base, _pairs(env, node)))


def _ntk_base(base: float, factor: float, rot_dim: int) -> float:
    if rot_dim <= 2:
        return base
    return base * factor ** (rot_dim / (rot_dim - 2))


def _scaling(node, base, factor, original=1.0) -> tuple[float, float, float]:
    """The shared arguments of the context-extension grids: base > 1, factor > 0, original > 0."""
    base, factor, original = (_num(v, node, w) for v, w in ((base, "base"), (factor, "factor"), (original, "original")))
    if base <= 1:
        raise EvalIssue(f"{node.func}(): the base must be > 1, got {base:g}", node)
    if factor <= 0:
        raise EvalIssue(f"{node.func}(): the factor must be > 0, got {factor:g}", node)
    if original <= 0:
        raise EvalIssue(f"{node.func}(): the original length must be > 0, got {original:g}", node,
                        hint="original is the training length the grid was made for")
    return base, factor, original


def _ntk(env, node, base, factor):
    p = _pairs(env, node)
    base, factor, _ = _scaling(node, base, factor)
    return Vec("pair", geometric_values(_ntk_base(base, factor, 2 * p), p))


def _dynamic_ntk(env, node, base, factor, original):
    p = _pairs(env, node)
    base, factor, original = _scaling(node, base, factor, original)
    n = env.n if env.n is not None else original
    if n > original:
        s = factor * n / original - (factor - 1)
        base = _ntk_base(base, s, 2 * p)
    return Vec("pair", geometric_values(base, p))


def _yarn_wavelength(env, node, base, factor, original, alpha, beta):
    p = _pairs(env, node)
    base, s, orig = _scaling(node, base, factor, original)
    alpha, beta = _num(alpha, node, "alpha"), _num(beta, node, "beta")
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
    p = _pairs(env, node)
    base, s, orig, fast, slow = (_num(v, node, w) for v, w in (
        (base, "base"), (factor, "factor"), (original, "original"), (beta_fast, "beta_fast"), (beta_slow, "beta_slow")))
    if not isinstance(truncate, bool):
        raise EvalIssue(f"yarn(): truncate must be true or false, got {_show(truncate)}", node)
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
    return yarn_mscale_value(*(_num(v, node, w) for v, w in (
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
    factor, original, af = (_num(v, node, w) for v, w in (
        (factor, "factor"), (original, "original"), (attention_factor, "attention_factor")))
    if original <= 1:
        raise EvalIssue("longrope_mscale(): original must exceed 1", node)
    return longrope_mscale_value(factor, original, af)


def _longrope(env, node, base, short_factor, long_factor, original):
    p = _pairs(env, node)
    base, orig = _num(base, node, "base"), _num(original, node, "original")
    for name, lst in (("short_factor", short_factor), ("long_factor", long_factor)):
        if not isinstance(lst, list) or len(lst) != p:
            got = f"{len(lst)} values" if isinstance(lst, list) else _show(lst)
            raise EvalIssue(f"longrope(): {name} has {got} for {p} rotary pairs", node,
                            hint=f"the channel group rotates {2 * p} channels: give {p} numbers")
    n = env.n
    factors = long_factor if n is not None and n > orig else short_factor  # HF: seq_len > original -> long
    dim = 2 * p
    return Vec("pair", tuple(1.0 / (_num(f, node, "each factor") * base ** (2 * k / dim)) for k, f in enumerate(factors)))


def _llama3(env, node, base, factor, original, low_freq_factor, high_freq_factor):
    p = _pairs(env, node)
    base, factor, orig = _scaling(node, base, factor, original)
    lo, hi = _num(low_freq_factor, node, "low_freq_factor"), _num(high_freq_factor, node, "high_freq_factor")
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
    length, cycles, period = (_num(v, node, w) for v, w in ((length, "length"), (cycles, "cycles"), (period, "period")))
    if length <= 0 or period <= 0 or cycles <= 0:
        raise EvalIssue("span(): length, cycles and period must be positive", node)
    if 2 * math.pi * cycles / length > 2 * math.pi / period:
        raise EvalIssue(
            f"span(): {cycles:g} cycles in {length:g} tokens is faster than the period {period:g}", node,
            hint="the lowest frequency must not exceed the highest: lengthen 'length' or the period",
        )
    return Vec("pair", span_values(_pairs(env, node), length, cycles, period))


def _logspace(env, node, first, last):
    p = _pairs(env, node)
    first, last = _num(first, node, "first"), _num(last, node, "last")
    if first <= 0 or last <= 0:
        raise EvalIssue("logspace(): first and last must be positive", node)
    if p == 1:
        return Vec("pair", (first,))
    return Vec("pair", tuple(first * (last / first) ** (k / (p - 1)) for k in range(p)))


def _per_pair(env, node, values):
    p = _pairs(env, node)
    if len(values) != p:
        raise EvalIssue(
            f"per_pair() got {len(values)} values for {p} rotary pairs", node,
            hint=f"the channel group rotates {2 * p} channels: give {p} numbers",
        )
    return Vec("pair", tuple(_num(v, node, "each value") for v in values))


def _slopes(env, node, heads):
    h = _num(heads, node, "heads")
    if not 1 <= h <= limits.MAX_HEADS:
        raise EvalIssue(f"slopes(): {h:g} heads is out of range (1 .. {limits.MAX_HEADS})", node,
                        hint="slopes(heads) gives one slope per attention head")
    model_heads = env.values.get("heads")
    if isinstance(model_heads, int) and not isinstance(model_heads, bool) and h != model_heads:
        raise EvalIssue(f"slopes({h:g}) gives {h:g} slopes, but the model has {model_heads} heads", node,
                        hint="write slopes(heads): one slope per attention head")
    return Vec("head", alibi_slopes(int(h)))


def _unary(fn):
    def impl(env, node, x):
        def safe(v):
            try:
                return fn(v)
            except (ValueError, OverflowError):
                raise EvalIssue(f"{node.func}({v:g}) is undefined", node) from None

        return _map(safe, x, node)

    return impl


def _sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


def _log_sigmoid(v: float) -> float:
    return -math.log1p(math.exp(-v)) if v >= 0 else v - math.log1p(math.exp(v))


def _zip2(fn):
    def impl(env, node, a, b):
        return _combine(fn, [a, b], node)

    return impl


def _combine(fn, vals: list, node) -> Any:
    """Apply fn elementwise over scalars/vectors of one axis."""
    vec = next((v for v in vals if isinstance(v, Vec)), None)
    if vec is None:
        return fn(*[_num(v, node, "argument") for v in vals])
    n = len(vec.values)
    cols = []
    for v in vals:
        if isinstance(v, Vec):
            if v.axis != vec.axis or len(v.values) != n:
                raise EvalIssue("vectors along different axes or of different lengths", node)
            cols.append(v.values)
        else:
            cols.append((_num(v, node, "argument"),) * n)
    return Vec(vec.axis, tuple(fn(*xs) for xs in zip(*cols)))


def _clamp(env, node, x, lo, hi):
    return _combine(lambda a, b, c: min(max(a, b), c), [x, lo, hi], node)


def _ramp(env, node, x, lo, hi):
    def r(a, b, c):
        if c == b:
            raise EvalIssue("ramp(): lo and hi are equal", node)
        return min(1.0, max(0.0, (a - b) / (c - b)))

    return _combine(r, [x, lo, hi], node)


def _group(kind):
    def impl(env, node, **kw):
        return GroupSpec(kind, tuple(v for v in kw.values() if v is not None))

    return impl


_IMPL = {
    "log": _unary(math.log),
    "exp": _unary(math.exp),
    "sqrt": _unary(math.sqrt),
    "sin": _unary(math.sin),
    "cos": _unary(math.cos),
    "tanh": _unary(math.tanh),
    "abs": _unary(abs),
    "floor": _unary(lambda v: float(math.floor(v))),
    "ceil": _unary(lambda v: float(math.ceil(v))),
    "sigmoid": _unary(_sigmoid),
    "log_sigmoid": _unary(_log_sigmoid),
    "min": _zip2(min),
    "max": _zip2(max),
    "clamp": _clamp,
    "ramp": _ramp,
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
    "slopes": _slopes,
    "fraction": _group("fraction"),
    "quarters": _group("quarters"),
    "range": _group("range"),
}


def group_channels(spec: GroupSpec, head_dim: int, taken: set[int]) -> list[int]:
    """Channel indices of a group spec; raises EvalIssue when it does not fit head_dim."""
    if spec.kind == "all":
        return list(range(head_dim))
    if spec.kind == "rest":
        return [c for c in range(head_dim) if c not in taken]
    if spec.kind == "fraction":
        (f,) = spec.args
        size = f * head_dim
        if not 0 < f <= 1:
            raise EvalIssue(f"fraction({f:g}) must be in (0, 1]")
        if abs(size - round(size)) > 1e-9 or round(size) % 2:
            raise EvalIssue(
                f"fraction({f:g}) of head_dim {head_dim} is {size:g} channels, not an even whole number",
                hint=f"rotary channels come in pairs: use a fraction f with f * {head_dim} even, "
                f"e.g. {_nice_fractions(head_dim)}",
            )
        return list(range(int(round(size))))
    if spec.kind == "quarters":
        if head_dim % 8:
            raise EvalIssue(
                f"quarters need head_dim divisible by 8 (each quarter an even number of channels); "
                f"head_dim is {head_dim}"
            )
        q = head_dim // 4
        out: list[int] = []
        for a in spec.args:
            a = int(a)
            if not 1 <= a <= 4:
                raise EvalIssue(f"quarter {a} does not exist: quarters are numbered 1 to 4")
            out.extend(range((a - 1) * q, a * q))
        if len(set(out)) != len(out):
            raise EvalIssue("a quarter is listed twice")
        return sorted(out)
    if spec.kind == "range":
        a, b = (int(v) for v in spec.args)
        if not 0 <= a < b <= head_dim:
            raise EvalIssue(f"range({a}, {b}) does not fit head_dim {head_dim} (channels 0 .. {head_dim - 1})")
        if (b - a) % 2:
            raise EvalIssue(f"range({a}, {b}) has {b - a} channels; rotary channels come in pairs")
        return list(range(a, b))
    raise EvalIssue(f"unknown channel group '{spec.kind}'")  # pragma: no cover


def channel_ranges(chans) -> str:
    """Channel indices as compact ranges: (0, 1, 2, 3, 8, 9) -> '0-3, 8-9' ('none' when empty)."""
    chans = sorted(chans)
    out, i = [], 0
    while i < len(chans):
        j = i
        while j + 1 < len(chans) and chans[j + 1] == chans[j] + 1:
            j += 1
        out.append(str(chans[i]) if i == j else f"{chans[i]}-{chans[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def _nice_fractions(head_dim: int) -> str:
    fr = [f for f in (0.25, 0.5, 0.75, 1.0) if (f * head_dim) % 2 == 0]
    return ", ".join(f"{f:g}" for f in fr) or "1"
