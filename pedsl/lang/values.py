"""The values of compile-time evaluation: numbers, vectors along one axis, channel-group specs, DYNAMIC.

Also the environment an expression is folded in and the small checks the builtins share
(a number, a finite float32 value, the rotary pairs of the group being evaluated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pedsl import limits
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
    n: float | None = None  # run-time sequence length, when known (longrope's code folds at original + 1.0)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # let name -> value
    axes: tuple[str, ...] = ()  # the scheme's position axes: an axis selection folds where each position.AXIS is given

    def child(self, **kw) -> "StaticEnv":
        return StaticEnv(values=self.values, lets=self.lets, pairs=kw.get("pairs", self.pairs), n=kw.get("n", self.n),
                         axes=self.axes)


def map_values(fn, v: Any, node) -> Any:
    """fn over a number, or elementwise over a vector or list (EvalIssue for anything else)."""
    if isinstance(v, Vec):
        return Vec(v.axis, tuple(fn(x) for x in v.values))
    if isinstance(v, list):
        return [map_values(fn, x, node) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalIssue(f"expected a number, got {show(v)}", node)
    return fn(v)


def show(v: Any) -> str:
    """A value as a diagnostic names it."""
    if isinstance(v, Vec):
        return f"a vector over {v.axis}s"
    if isinstance(v, str):
        return f'the string "{v}"'
    return repr(v)

def finite(v: Any, node, what: str = "this gives") -> Any:
    """v, or an EvalIssue when it is infinite, NaN or beyond float32 (it would overflow in a tensor)."""
    if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= limits.FLOAT32_MAX):
        shown = "NaN" if math.isnan(v) else f"{v:g}"
        raise EvalIssue(f"{what} {shown}: not a finite number in float32 (overflow)", node,
                        hint="static values must stay within +-3.4e38; rescale the constants")
    return v


def pairs_of(env: StaticEnv, node) -> int:
    if env.pairs is None:
        raise EvalIssue("a frequency grid is only defined inside a transport (it needs the group's size)", node)
    return env.pairs


def number(v: Any, node, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalIssue(f"{what} must be a number, got {show(v)}", node)
    return float(v)
