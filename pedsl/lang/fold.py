"""Compile-time evaluation of `.pe` expressions in plain Python floats (float64).

Static values (:mod:`pedsl.lang.values`) are numbers, strings, booleans, lists
(for eval lengths) and vectors along one axis (:class:`Vec` over rotary pairs or
heads). This module walks an expression and folds arithmetic and every builtin call through
its record (:mod:`pedsl.lang.builtin_defs`: ``fold`` mapped over vectors, or ``fold_env``),
checking the records' ``arg_rules``. All without torch, so
`pedsl check` stays fast; the compiler turns the vectors into
float64 tensors. Anything that varies with position, distance or the data is
:data:`DYNAMIC`: the compiler evaluates it at run time.
"""

from __future__ import annotations

import math
from typing import Any

from pedsl import limits
from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.values import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec, number, finite, map_values, pairs_of, show
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS


def fold_expr(node: ast.Expr, env: StaticEnv, _depth: int = 0) -> Any:
    """The static value of ``node``, or DYNAMIC. Raises EvalIssue on math errors."""
    if _depth > 200:
        raise EvalIssue("definitions nested too deeply (a 'let' that refers to itself?)", node)
    ev = lambda e: fold_expr(e, env, _depth + 1)  # noqa: E731
    if node.kind == "num":
        return node.value
    if node.kind == "str" or node.kind == "bool":
        return node.value
    if node.kind == "list":
        if len(node.items) > limits.MAX_LIST:
            raise EvalIssue(f"a list of {len(node.items):,} items; the limit is {limits.MAX_LIST:,}", node)
        items = [ev(i) for i in node.items]
        return DYNAMIC if any(i is DYNAMIC for i in items) else items
    if node.kind == "name":
        return _name(node, env, _depth)
    if node.kind == "unary":
        v = ev(node.operand)
        return DYNAMIC if v is DYNAMIC else map_values(lambda a: -a, v, node)
    if node.kind == "binary":
        a, b = ev(node.left), ev(node.right)
        if a is DYNAMIC or b is DYNAMIC:
            return DYNAMIC
        return _arith(node.op, a, b, node)
    if node.kind == "call":
        return _call(node, env, _depth)
    raise EvalIssue(f"cannot evaluate {node.kind}", node)  # pragma: no cover


def _name(node: ast.Name, env: StaticEnv, depth: int) -> Any:
    name = node.id
    if name in env.values:
        return env.values[name]
    if name in env.lets:
        # Memoised per environment: lets that use each other twice would otherwise cost 2^depth.
        if name not in env.memo:
            env.memo[name] = fold_expr(env.lets[name], env, depth + 1)
        return env.memo[name]
    if name == "pi":
        return math.pi
    if name == "e":
        return math.e
    if name == "n":
        return env.n if env.n is not None else DYNAMIC
    if name in CONSTANTS and CONSTANTS[name].reads:  # reads a run-time input (docs/semantics.md §1a)
        return DYNAMIC
    if name.partition(".")[0] in CONSTANTS and CONSTANTS[name.partition(".")[0]].reads:  # position.AXIS
        return DYNAMIC
    if name in ("none", "all", "rest"):
        return GroupSpec(name) if name != "none" else None
    if name in ("head", "pair", "channel"):
        return name
    raise EvalIssue(f"unknown name '{name}'", node)


def _op(op: str, a: float, b: float, node) -> float:
    try:
        if op == "+":
            return finite(a + b, node)
        if op == "-":
            return finite(a - b, node)
        if op == "*":
            return finite(a * b, node)
        if op == "/":
            if b == 0:
                raise EvalIssue("division by zero", node)
            r = finite(a / b, node)
            return int(r) if isinstance(a, int) and isinstance(b, int) and r.is_integer() else r
        if op == "**":
            if isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b * math.log2(abs(a)) > 1024:
                a = float(a)  # an exact int power this large takes unbounded time and memory: overflow instead
            r = a**b
            if isinstance(r, complex):
                raise EvalIssue("a negative number to a fractional power", node)
            return finite(r, node)
    except OverflowError:
        raise EvalIssue("number too large", node) from None
    raise EvalIssue(f"unknown operator {op}", node)  # pragma: no cover


def _arith(op: str, a: Any, b: Any, node) -> Any:
    for v in (a, b):
        if isinstance(v, (str, bool, GroupSpec)) or v is None:
            raise EvalIssue(f"arithmetic '{op}' on {show(v)}", node)
    if isinstance(a, Vec) and isinstance(b, Vec):
        if a.axis != b.axis:  # a (head, pair) field: the checker typed it; the run-time walk computes it
            return DYNAMIC
        if len(a.values) != len(b.values):
            raise EvalIssue(f"vectors of different lengths ({len(a.values)} and {len(b.values)})", node)
        return Vec(a.axis, tuple(_op(op, x, y, node) for x, y in zip(a.values, b.values)))
    if isinstance(a, Vec) and isinstance(b, list):
        return _arith(op, a, _list_along(a, b, node), node)
    if isinstance(a, list) and isinstance(b, Vec):
        return _arith(op, _list_along(b, a, node), b, node)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise EvalIssue(f"lists of different lengths ({len(a)} and {len(b)})", node)
        return [_arith(op, x, y, node) for x, y in zip(a, b)]
    if isinstance(a, (Vec, list)):
        return map_values(lambda x: _op(op, x, b, node), a, node)
    if isinstance(b, (Vec, list)):
        return map_values(lambda y: _op(op, a, y, node), b, node)
    return _op(op, a, b, node)


def _list_along(vec: Vec, lst: list, node) -> Vec:
    """A list combined with a vector: the vector of its numbers along the vector's axis."""
    if len(lst) != len(vec.values):
        raise EvalIssue(
            f"a list of {len(lst)} numbers combined with {len(vec.values)} {vec.axis}s", node,
            hint=f"give exactly one number per {vec.axis}",
        )
    return Vec(vec.axis, tuple(float(x) for x in lst))


class SignatureIssue(EvalIssue):
    """A call whose arguments its builtin's signature does not take: the type checker reports it (E203),
    so the value checks that fold before it skip the call."""


def bind_args(node: ast.Call, names: tuple[tuple[str, object], ...]) -> dict[str, ast.Expr | object]:
    """Positional and keyword arguments of a call -> {param: expr or default}; an argument the signature
    does not have is a :class:`SignatureIssue`."""
    out: dict[str, Any] = {}
    if len(node.args) > len(names):
        raise SignatureIssue(f"{node.func}() takes at most {len(names)} arguments, got {len(node.args)}", node)
    for (pname, _), arg in zip(names, node.args):
        out[pname] = arg
    for kw in node.kwargs:
        if kw.name in out:
            raise SignatureIssue(f"{node.func}() got '{kw.name}' twice", kw)
        if kw.name not in (p for p, _ in names):
            raise SignatureIssue(f"{node.func}() has no parameter '{kw.name}'", kw,
                                 hint=did_you_mean(kw.name, [p for p, _ in names]))
        out[kw.name] = kw.value
    for pname, default in names:
        out.setdefault(pname, default)
    return out


def _call(node: ast.Call, env: StaticEnv, depth: int) -> Any:
    spec = FUNCTIONS.get(node.func)
    if spec is None:
        raise EvalIssue(f"unknown function '{node.func}'", node)
    bound = bind_args(node, spec.params)
    if spec.axis_select is not None:
        return _axis_selection(node, spec, bound, env, depth)
    if node.func in ARG_RULES:  # the static arguments of a run-time builtin: checked now, not at run time
        checked = _check_args(node, bound, env, depth)
        probe = [env.values.get(i) for i in spec.inputs]  # the checker's probe at one query position
        if spec.fold is not None and probe and all(isinstance(v, int) for v in probe) \
                and all(p in checked for p, _ in spec.static):
            return spec.fold(*probe, *(checked[p] for p, _ in spec.static))
        return DYNAMIC
    if spec.fold is None and spec.fold_env is None:  # a run-time value, or a transport: never static
        for p in spec.checked_args:  # a learned value's start: static, and its errors surface here
            arg = bound[p]
            if isinstance(arg, ast.EXPR_NODES):
                _checked_value(fold_expr(arg, env, depth + 1), arg, node.func, p)
        return DYNAMIC
    vals = {}
    for k, v in bound.items():
        if isinstance(v, (ast.Num, ast.Str, ast.Bool, ast.Name, ast.Unary, ast.Binary, ast.Call, ast.ListExpr)):
            vals[k] = fold_expr(v, env, depth + 1)
        else:
            vals[k] = v
    if any(v is DYNAMIC for v in vals.values()):
        return DYNAMIC
    fn = spec.fold_env or (_folder(spec) if spec.fold is not None else None)
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
            finite(v, node, f"{node.func}() gives")
    elif isinstance(out, float):
        finite(out, node, f"{node.func}() gives")
    return out


def _axis_selection(node: ast.Call, spec, bound: dict, env: StaticEnv, depth: int) -> Any:
    """sections()/interleave() where every position.AXIS has a value (the frequency probes): per pair, the
    position of its axis; DYNAMIC otherwise."""
    at = [env.values.get(f"position.{a}") for a in env.axes]
    if not at or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in at):
        return DYNAMIC
    sizes = fold_expr(bound["sizes"], env, depth + 1)
    if not isinstance(sizes, list):
        return DYNAMIC
    return Vec("pair", tuple(float(at[a]) for a in spec.axis_select(sizes, pairs_of(env, node))))


def _checked_value(v: Any, arg, func: str, name: str) -> None:
    """A checked argument's value must be a finite number or per-axis vector (a learned value's start)."""
    if v is DYNAMIC or isinstance(v, (bool, str, list, GroupSpec)) or v is None:
        raise EvalIssue(f"{func}(): '{name}' must be a number known at compile time, not {show(v)}", arg)
    for x in (v.values if isinstance(v, Vec) else (v,)):
        finite(x, arg, f"{func}(): '{name}' is")


# Static arguments of builtins, checked wherever the call is evaluated (the checker evaluates every
# transport, bias and temperature): (lowest, highest, lowest is exclusive, what it means).
ARG_RULES: dict[str, dict[str, tuple[float, float, bool, str]]] = {
    name: spec.arg_rules for name, spec in RECORDS.items() if spec.arg_rules}
# Builtins with arguments that must fold (``checked_args``): folded, like ARG_RULES', wherever checked.
CHECKED_ARGS = frozenset(name for name, spec in RECORDS.items() if spec.checked_args)


def index_rows(arg, number) -> int | None:
    """The number of values of an integer index ``arg`` (a call whose record has ``index_rows``, its static
    arguments folded by ``number``), or None when unknown."""
    if not isinstance(arg, ast.Call) or arg.func not in FUNCTIONS:
        return None
    spec = FUNCTIONS[arg.func]
    if spec.index_rows is None:
        return None
    bound = bind_args(arg, spec.params)
    return spec.index_rows(**{p: kind(number(bound[p])) for p, kind in spec.static})


def derived_static(node: ast.Call, static: dict, number) -> dict:
    """A call's static arguments with its record's ``derive`` filled in: a parameter left at 0 takes the
    ``index_rows`` of the call in its source argument (the walk, codegen and the checker agree on it)."""
    spec = FUNCTIONS[node.func]
    if not spec.derive:
        return static
    bound = bind_args(node, spec.params)
    out = dict(static)
    for p, src in spec.derive.items():
        if not out.get(p):
            rows = index_rows(bound[src], number)
            if rows is None:
                raise EvalIssue(f"{node.func}(): give {p} = N: its {src} is not a call with a known range "
                                "(such as bucket(...))", node, hint=f"e.g. {node.func}(min(distance, 63), {p} = 64)")
            out[p] = rows
    return out


def _check_args(node: ast.Call, bound: dict, env: StaticEnv, depth: int) -> dict[str, float]:
    out = _checked_ranges(node, bound, env, depth)
    spec = FUNCTIONS[node.func]
    if spec.check is not None or spec.derive:
        def number(a):
            return a if not isinstance(a, ast.EXPR_NODES) else fold_expr(a, env, depth + 1)
        static = {p: number(bound[p]) for p, _ in spec.static}
        if any(v is DYNAMIC for v in static.values()):
            return out
        static = derived_static(node, static, number)
        why = spec.check(**static) if spec.check is not None else None
        if why:
            raise EvalIssue(f"{node.func}(): {why}", node)
    return out


def _checked_ranges(node: ast.Call, bound: dict, env: StaticEnv, depth: int) -> dict[str, float]:
    out = {}
    for name, (lo, hi, open_lo, meaning) in ARG_RULES[node.func].items():
        arg = bound.get(name)
        if not isinstance(arg, ast.EXPR_NODES):
            continue  # the default
        v = fold_expr(arg, env, depth + 1)
        if v is DYNAMIC or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # the type checker reports non-numbers
        if v < lo or (open_lo and v == lo) or v > hi:
            rng = f"> {lo:g}" if open_lo and hi == math.inf else f"{lo:g} .. {hi:g}" if hi < 1e30 else f">= {lo:g}"
            raise EvalIssue(f"{node.func}(): {name} = {v:g} is out of range ({rng}; {meaning})", arg)
        out[name] = v
    return out


# ------------------------------------------------------------------ folding a record's scalar function


def _unary(fn):
    def impl(env, node, x):
        def safe(v):
            try:
                return fn(v)
            except (ValueError, OverflowError):
                raise EvalIssue(f"{node.func}({v:g}) is undefined", node) from None

        return map_values(safe, x, node)

    return impl


def _folder(spec):
    """A record's fold over scalars, mapped over per-axis vectors."""
    if len(spec.params) == 1:
        return _unary(spec.fold)

    def impl(env, node, **vals):
        return _combine(spec.fold, [vals[p] for p, _ in spec.params], node)

    return impl


def _combine(fn, vals: list, node) -> Any:
    """Apply fn elementwise over scalars/vectors of one axis."""
    vec = next((v for v in vals if isinstance(v, Vec)), None)
    if vec is None:
        return fn(*[number(v, node, "argument") for v in vals])
    n = len(vec.values)
    cols = []
    for v in vals:
        if isinstance(v, Vec):
            if v.axis != vec.axis or len(v.values) != n:
                raise EvalIssue("vectors along different axes or of different lengths", node)
            cols.append(v.values)
        else:
            cols.append((number(v, node, "argument"),) * n)
    return Vec(vec.axis, tuple(fn(*xs) for xs in zip(*cols)))

