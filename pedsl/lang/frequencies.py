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
    return StaticEnv(values={**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}, axes=scheme.axes)


def along(expr: ast.Expr, env: StaticEnv, pairs: int, moving: tuple[str, ...]) -> tuple[float, ...] | None:
    """Per pair, the rate of change of a phase as the positions along the axes ``moving`` advance together
    (the others stay at 0); None when it is not static or not linear in them."""
    def at(t: int):
        vals = {**env.values, **{f"position.{a}": (t if a in moving else 0) for a in env.axes}}
        return fold_expr(expr, StaticEnv(values=vals, lets=env.lets, pairs=pairs, n=env.n, axes=env.axes))

    try:
        at1, at0 = at(1), at(0)
    except EvalIssue:
        return None
    if isinstance(at1, (int, float)) and isinstance(at0, (int, float)):
        return (float(at1 - at0),) * pairs
    if isinstance(at1, Vec) and isinstance(at0, Vec) and at1.axis == "pair":
        return tuple(a - b for a, b in zip(at1.values, at0.values))
    if isinstance(at1, Vec) and isinstance(at0, (int, float)) and at1.axis == "pair":
        return tuple(a - at0 for a in at1.values)
    return None


def axis_frequencies(scheme: Scheme) -> dict[str, dict[str, tuple[float, ...]]]:
    """Per group of a multi-axis scheme, per declared axis: the angular frequency of each rotary pair
    along that axis (0 for a pair that does not read it); {} for a one-axis scheme."""
    if not scheme.axes:
        return {}
    env = scheme_env(scheme)
    out: dict[str, dict[str, tuple[float, ...]]] = {}
    for t in scheme.transports:
        if t.kind != "rotate":
            continue
        pairs = len(scheme.group(t.group).channels) // 2
        per = {a: along(t.phase, env, pairs, (a,)) for a in scheme.axes}
        known = {a: f for a, f in per.items() if f is not None}
        if len(known) == len(per):
            out[t.group] = {a: tuple(abs(x) for x in f) for a, f in known.items()}
    return out


def rotary_frequencies(scheme: Scheme) -> dict[str, tuple[float, ...]]:
    """Per group: the angular frequency per pair of position-indexed (or constant-step) rotations."""
    env = scheme_env(scheme)
    out = {}
    for t in scheme.transports:
        pairs = len(scheme.group(t.group).channels) // 2
        if t.kind == "rotate":  # several axes: as a text token sees it, every axis advancing together
            f = along(t.phase, env, pairs, scheme.axes) if scheme.axes else frequencies(t.phase, env, pairs)
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


def pair_axes(scheme: Scheme) -> dict[str, tuple[str, ...]]:
    """Per rotating group of a multi-axis scheme, the axis each rotary pair reads: an axis name, several
    joined by '+' (a pair that mixes axes), or '-' (a pair that reads none); {} for a one-axis scheme."""
    return {group: tuple("+".join(a for a in scheme.axes if per[a][k] != 0) or "-"
                         for k in range(len(next(iter(per.values())))))
            for group, per in axis_frequencies(scheme).items()}


def axis_runs(labels: tuple[str, ...]) -> str:
    """``t: pairs 0-3; h: 4-9, 12; w: ...`` - the pairs of each axis label, as ranges, in order of appearance."""
    by: dict[str, list[int]] = {}
    for k, a in enumerate(labels):
        by.setdefault(a, []).append(k)
    parts = []
    for a, ks in by.items():
        runs, start = [], ks[0]
        for prev, cur in zip(ks, ks[1:] + [-1]):  # -1: never prev + 1, so the last run closes
            if cur != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = cur
        parts.append(f"{a}: " + ", ".join(runs))
    return "pairs " + "; ".join(parts)
