"""Static bias tables: slopes (one record)."""

from __future__ import annotations

from pedsl import limits
from pedsl.formulas import alibi_slopes
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, scalar
from pedsl.lang.types import Ty, num
from pedsl.lang.values import EvalIssue, Vec, number


def _rule(a: dict[str, Ty]) -> Ty:
    scalar(a, "heads", integer=True)
    return num("head")


def _fold(env, node, heads):
    h = number(heads, node, "heads")
    if not 1 <= h <= limits.MAX_HEADS:
        raise EvalIssue(f"slopes(): {h:g} heads is out of range (1 .. {limits.MAX_HEADS})", node,
                        hint="slopes(heads) gives one slope per attention head")
    model_heads = env.values.get("heads")
    if isinstance(model_heads, int) and not isinstance(model_heads, bool) and h != model_heads:
        raise EvalIssue(f"slopes({h:g}) gives {h:g} slopes, but the model has {model_heads} heads", node,
                        hint="write slopes(heads): one slope per attention head")
    return Vec("head", alibi_slopes(int(h)))


RECORDS = [
    Builtin("slopes", (("heads", REQUIRED),), "ALiBi slopes 2^(-8h/H) (interleaved rule for other head counts)",
            _rule, "bias", fold_env=_fold),
]
