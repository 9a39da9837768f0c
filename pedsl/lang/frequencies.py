"""The angular frequencies of a scheme's rotations: per pair, the phase's rate of change in the position
(read by lint W101, the rendered spectrum, `pedsl diff` and SchemeAttention.rotary_groups)."""

from __future__ import annotations

from pedsl.lang import ast
from pedsl.lang.fold import fold_expr
from pedsl.lang.scheme import Scheme
from pedsl.lang.types import Dep
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv, Vec


def frequencies(expr: ast.Expr, env: StaticEnv, pairs: int, var: str = "position") -> tuple[float, ...] | None:
    """d(expr)/d(var) per pair for an expression linear in ``var`` (None if not static)."""
    try:
        at1 = fold_expr(expr, StaticEnv(values={**env.values, var: 1}, lets=env.lets, pairs=pairs, n=env.n))
        at0 = fold_expr(expr, StaticEnv(values={**env.values, var: 0}, lets=env.lets, pairs=pairs, n=env.n))
    except EvalIssue:
        return None
    if at1 is DYNAMIC or at0 is DYNAMIC:
        return None
    if isinstance(at1, (int, float)):
        return (float(at1 - at0),) * pairs
    if isinstance(at1, Vec) and at1.axis == "pair":
        return tuple(a - b for a, b in zip(at1.values, at0.values))
    return None


def scheme_env(scheme: Scheme) -> StaticEnv:
    return StaticEnv(values={**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim})


def rotary_frequencies(scheme: Scheme) -> dict[str, tuple[float, ...]]:
    """Per group: the angular frequency per pair of position-indexed (or constant-step) rotations."""
    env = scheme_env(scheme)
    out = {}
    for t in scheme.transports:
        pairs = len(scheme.group(t.group).channels) // 2
        if t.kind == "rotate":
            f = frequencies(t.phase, env, pairs)
        elif t.kind == "accumulate_rotation" and t.angle_ty.reads <= {Dep.LENGTH}:  # the same step everywhere
            try:
                v = fold_expr(t.angle, env.child(pairs=pairs))
            except EvalIssue:
                v = None
            f = v.values if isinstance(v, Vec) else ((float(v),) * pairs if isinstance(v, (int, float)) else None)
        else:
            f = None
        if f is not None:
            out[t.group] = tuple(abs(x) for x in f)
    return out
