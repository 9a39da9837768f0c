"""Temperatures: log_length (per query position) and the static attention factors of Hugging Face's
YaRN and LongRoPE, yarn_mscale and longrope_mscale (one record each)."""

from __future__ import annotations

import math

from pedsl.formulas import longrope_mscale_value, yarn_mscale_value
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, scalar
from pedsl.lang.types import Ty, num
from pedsl.lang.values import EvalIssue, number


def _log_length(a: dict[str, Ty]) -> Ty:
    scalar(a, "length")
    return num("pos")


def _static_scalar(*names: str):
    def rule(a: dict[str, Ty]) -> Ty:
        scalar(a, *names)
        return num()

    return rule


def _yarn_mscale(env, node, factor, mscale, mscale_all_dim, attention_factor):
    return yarn_mscale_value(*(number(v, node, w) for v, w in (
        (factor, "factor"), (mscale, "mscale"), (mscale_all_dim, "mscale_all_dim"),
        (attention_factor, "attention_factor"))))


def _longrope_mscale(env, node, factor, original, attention_factor):
    factor, original, af = (number(v, node, w) for v, w in (
        (factor, "factor"), (original, "original"), (attention_factor, "attention_factor")))
    if original <= 1:
        raise EvalIssue("longrope_mscale(): original must exceed 1", node)
    return longrope_mscale_value(factor, original, af)


RECORDS = [
    Builtin(
        "log_length", (("length", REQUIRED),), "max(1, ln(i + 1) / ln(length)) per query position", _log_length,
        "temperature", inputs=("position",), static=(("length", float),),
        arg_rules={"length": (1, math.inf, True, "ln(length) divides: it must be > 1")},
        fold=lambda i, length: max(1.0, math.log(i + 1) / math.log(length)),
        run=lambda ops, pos, length: (ops.log(pos + 1) / math.log(length)).clip(min=1.0),
        emit=lambda pos, length: f"torch.clamp(torch.log({pos} + 1) / math.log({length}), min=1.0)",
    ),
    Builtin("yarn_mscale", (("factor", REQUIRED), ("mscale", 0.0), ("mscale_all_dim", 0.0), ("attention_factor", 0.0)),
            "Hugging Face's YaRN attention factor (0 means unset): attention_factor, else "
            "g(mscale) / g(mscale_all_dim) when both are set, else g(1); g(m) = 0.1 m ln(factor) + 1 (1 if factor <= 1)",
            _static_scalar("factor", "mscale", "mscale_all_dim", "attention_factor"), "temperature",
            fold_env=_yarn_mscale),
    Builtin("longrope_mscale", (("factor", REQUIRED), ("original", REQUIRED), ("attention_factor", 0.0)),
            "Hugging Face's LongRoPE attention factor: attention_factor if set (not 0), else "
            "sqrt(1 + ln(factor) / ln(original)) (1 if factor <= 1)",
            _static_scalar("factor", "original", "attention_factor"), "temperature", fold_env=_longrope_mscale),
]
