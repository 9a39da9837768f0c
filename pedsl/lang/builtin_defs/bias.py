"""Static bias tables: slopes, head_index, and the sinusoid dot product sinusoid_dot (Sandwich)."""

from __future__ import annotations

import math

from pedsl import limits
from pedsl.formulas import alibi_slopes
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, need_num, scalar
from pedsl.lang.types import Ty, num
from pedsl.lang.values import EvalIssue, Vec, number


def _rule(a: dict[str, Ty]) -> Ty:
    scalar(a, "heads", integer=True)
    return num("head")


def _slopes_rule(a: dict[str, Ty]) -> Ty:
    scalar(a, "heads", "first", integer=True)
    return num("head")


def _heads(env, node, heads) -> int:
    h = number(heads, node, "heads")
    if not 1 <= h <= limits.MAX_HEADS:
        raise EvalIssue(f"slopes(): {h:g} heads is out of range (1 .. {limits.MAX_HEADS})", node,
                        hint="slopes(heads) gives one slope per attention head")
    model_heads = env.values.get("heads")
    if isinstance(model_heads, int) and not isinstance(model_heads, bool) and h != model_heads:
        raise EvalIssue(f"{node.func}({h:g}) gives {h:g} values, but the model has {model_heads} heads", node,
                        hint=f"write {node.func}(heads): one value per attention head")
    return int(h)


def _fold(env, node, heads, first=0):
    h = _heads(env, node, heads)
    k = number(first, node, "first")
    if not 0 <= k <= h or k != int(k):
        raise EvalIssue(f"slopes(): first = {k:g} must be a whole number of heads from 0 (all) to {h}", node,
                        hint="first = k puts ALiBi on the first k heads (x-transformers' alibi_num_heads)")
    if k == 0:
        return Vec("head", alibi_slopes(h))
    return Vec("head", alibi_slopes(int(k)) + (0.0,) * (h - int(k)))


def _head_index(env, node, heads):
    return Vec("head", tuple(float(i) for i in range(1, _heads(env, node, heads) + 1)))


def _dot_rule(a: dict[str, Ty]) -> Ty:
    need_num(a["distance"], "distance", {"dist"}, " (the distance i - j)")
    scalar(a, "dim", integer=True)
    scalar(a, "base")
    return num("dist")


def sinusoid_dot(d: float, dim: int, base: float) -> float:
    """sum_{k=1}^{dim/2} cos(d base^(-2k/dim)): the dot product of two sinusoidal embeddings d apart (Sandwich,
    Chi et al. 2023; NeMo's SandwichRelativePositionEmbedding counts k from 1)."""
    return math.fsum(math.cos(d * base ** (-2 * k / dim)) for k in range(1, dim // 2 + 1))


def _dot_run(ops, d, *, dim, base):
    return sum(ops.cos(d * base ** (-2 * k / dim)) for k in range(1, dim // 2 + 1))


RECORDS = [
    Builtin("slopes", (("heads", REQUIRED), ("first", 0)),
            "ALiBi slopes 2^(-8h/H) (interleaved rule for other head counts); first = k: the slopes of k heads on "
            "the first k heads and 0 on the rest (x-transformers' alibi_num_heads)", _slopes_rule, "bias",
            fold_env=_fold),
    Builtin("head_index", (("heads", REQUIRED),), "the head number h = 1 .. heads, one per head", _rule, "bias",
            fold_env=_head_index),
    Builtin("sinusoid_dot", (("distance", REQUIRED), ("dim", 128), ("base", 10000.0)),
            "sum_{k=1..dim/2} cos(distance * base^(-2k/dim)): the dot product of sinusoidal embeddings (Sandwich)",
            _dot_rule, "bias", static=(("dim", int), ("base", float)),
            arg_rules={"dim": (2, limits.MAX_HEAD_DIM, False, "the sinusoidal embedding's width"),
                       "base": (1, math.inf, True, "the sinusoid's base")},
            fold=lambda d, dim, base: sinusoid_dot(d, int(dim), base), run=_dot_run,
            emit=lambda d, *, dim, base: f"_sinusoid_dot(_t({d}, dev), {dim}, {base})"),
]
