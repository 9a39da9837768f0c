"""The elementwise math builtins: log, exp, ..., the activations silu, gelu, softplus, min, max, clamp, ramp
(one record each)."""

from __future__ import annotations

import math

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, need_num
from pedsl.lang.types import Ty, join

X = (("x", REQUIRED),)
AB = (("a", REQUIRED), ("b", REQUIRED))
XLH = (("x", REQUIRED), ("lo", REQUIRED), ("hi", REQUIRED))


def _elementwise(a: dict[str, Ty]) -> Ty:
    need_num(a["x"], "x")
    return join(a["x"]).with_(integer=False)


def _binary_math(a: dict[str, Ty]) -> Ty:
    for k, t in a.items():
        need_num(t, k)
    return join(*a.values()).with_(integer=all(t.integer for t in a.values()))


def _sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


def _log_sigmoid(v: float) -> float:
    return -math.log1p(math.exp(-v)) if v >= 0 else v - math.log1p(math.exp(v))


def _softplus(v: float) -> float:
    return -_log_sigmoid(-v)  # log(1 + exp(v)), stable at both ends


def _gelu(v: float) -> float:
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _ramp(x: float, lo: float, hi: float) -> float:
    if hi == lo:
        raise ValueError("lo and hi are equal")
    return min(1.0, max(0.0, (x - lo) / (hi - lo)))


def _unary(name: str, doc: str, fold, torch_fn: str) -> Builtin:
    return Builtin(name, X, doc, _elementwise, fold=fold, run=lambda ops, x: getattr(ops, name)(x),
                   emit=lambda x: f"{torch_fn}(_t({x}, dev))")


RECORDS = [
    _unary("log", "natural logarithm", math.log, "torch.log"),
    _unary("exp", "exponential", math.exp, "torch.exp"),
    _unary("sqrt", "square root", math.sqrt, "torch.sqrt"),
    _unary("sin", "sine", math.sin, "torch.sin"),
    _unary("cos", "cosine", math.cos, "torch.cos"),
    _unary("tanh", "hyperbolic tangent", math.tanh, "torch.tanh"),
    _unary("abs", "absolute value", abs, "torch.abs"),
    _unary("sigmoid", "logistic function 1 / (1 + exp(-x))", _sigmoid, "torch.sigmoid"),
    _unary("log_sigmoid", "log(sigmoid(x)), computed stably", _log_sigmoid, "F.logsigmoid"),
    # the activations, with the meanings of torch.nn.functional's: gelu is the exact (erf) form, not the tanh
    # approximation; softplus is exact at every x (torch's F.softplus returns x itself above x = 20)
    Builtin("silu", X, "x * sigmoid(x) (also called swish)", _elementwise, fold=lambda v: v * _sigmoid(v),
            run=lambda ops, x: x * ops.sigmoid(x), emit=lambda x: f"F.silu(_t({x}, dev))"),
    Builtin("gelu", X, "x * Phi(x), Phi the standard normal CDF (the exact form, not the tanh approximation)",
            _elementwise, fold=_gelu, run=lambda ops, x: 0.5 * x * (1.0 + ops.erf(x * (0.5 ** 0.5))),
            emit=lambda x: f"F.gelu(_t({x}, dev))"),
    Builtin("softplus", X, "log(1 + exp(x)), computed stably", _elementwise, fold=_softplus,
            run=lambda ops, x: -ops.log_sigmoid(-x), emit=lambda x: f"(-F.logsigmoid(-_t({x}, dev)))"),
    _unary("floor", "largest integer <= x", lambda v: float(math.floor(v)), "torch.floor"),
    _unary("ceil", "smallest integer >= x", lambda v: float(math.ceil(v)), "torch.ceil"),
    Builtin("min", AB, "elementwise minimum", _binary_math, fold=min,
            run=lambda ops, a, b: ops.minimum(a, b),
            emit=lambda a, b: f"torch.minimum(_t({a}, dev), _t({b}, dev))"),
    Builtin("max", AB, "elementwise maximum", _binary_math, fold=max,
            run=lambda ops, a, b: ops.maximum(a, b),
            emit=lambda a, b: f"torch.maximum(_t({a}, dev), _t({b}, dev))"),
    Builtin("clamp", XLH, "clamp x into [lo, hi]", _binary_math, fold=lambda x, lo, hi: min(max(x, lo), hi),
            run=lambda ops, x, lo, hi: ops.minimum(ops.maximum(x, lo), hi),
            emit=lambda x, lo, hi: f"torch.minimum(torch.maximum(_t({x}, dev), _t({lo}, dev)), _t({hi}, dev))"),
    Builtin("ramp", XLH, "clamp((x - lo) / (hi - lo), 0, 1)", _binary_math, fold=_ramp,
            run=lambda ops, x, lo, hi: ((x - lo) / (hi - lo)).clip(0, 1),
            emit=lambda x, lo, hi: f"(((_t({x}, dev) - {lo}) / ({hi} - {lo})).clamp(0, 1))"),
]
