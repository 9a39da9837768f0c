"""Small pure functions over expression trees: walk, print, inline, analyse."""

from __future__ import annotations

import json
from typing import Callable, Iterator

from pedsl.lang import ast

# Binding strength for printing with the fewest parentheses.
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "**": 4}


def walk(e: ast.Expr) -> Iterator[ast.Expr]:
    yield e
    if e.kind == "unary":
        yield from walk(e.operand)
    elif e.kind == "binary":
        yield from walk(e.left)
        yield from walk(e.right)
    elif e.kind == "call":
        for a in e.args:
            yield from walk(a)
        for k in e.kwargs:
            yield from walk(k.value)
    elif e.kind == "list":
        for i in e.items:
            yield from walk(i)


def uses_name(e: ast.Expr, name: str) -> bool:
    return any(n.kind == "name" and n.id == name for n in walk(e))


def names_in(e: ast.Expr) -> set[str]:
    return {n.id for n in walk(e) if n.kind == "name"}


def calls_in(e: ast.Expr) -> set[str]:
    return {n.func for n in walk(e) if n.kind == "call"}


def format_number(v: int | float) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    text = repr(float(v))
    if "e" in text or "E" in text:
        mant, exp = text.split("e")
        if "." not in mant:
            mant += ".0"
        return f"{mant}e{int(exp)}"
    return text


def to_source(e: ast.Expr, parent: int = 0, right: bool = False) -> str:
    """Canonical text of an expression (used by fmt, show and diff)."""
    if e.kind == "num":
        return format_number(e.value)
    if e.kind == "str":
        return json.dumps(e.value, ensure_ascii=False)
    if e.kind == "bool":
        return "true" if e.value else "false"
    if e.kind == "name":
        return e.id
    if e.kind == "list":
        return "[" + ", ".join(to_source(i) for i in e.items) + "]"
    if e.kind == "call":
        parts = [to_source(a) for a in e.args] + [f"{kw.name} = {to_source(kw.value)}" for kw in e.kwargs]
        return f"{e.func}(" + ", ".join(parts) + ")"
    if e.kind == "unary":
        p = _PREC["neg"]
        text = "-" + to_source(e.operand, p)
        return f"({text})" if p < parent else text
    if e.kind == "binary":
        p = _PREC[e.op]
        if e.op == "**":  # right-associative
            text = f"{to_source(e.left, p + 1)} ** {to_source(e.right, p)}"
        else:
            text = f"{to_source(e.left, p)} {e.op} {to_source(e.right, p + 1)}"
        return f"({text})" if p < parent else text
    raise ValueError(e.kind)  # pragma: no cover


def transform(e: ast.Expr, fn: Callable[[ast.Expr], ast.Expr | None]) -> ast.Expr:
    """Rebuild e bottom-up; fn returns a replacement for a node or None to keep it."""
    if e.kind == "unary":
        e = e.model_copy(update={"operand": transform(e.operand, fn)})
    elif e.kind == "binary":
        e = e.model_copy(update={"left": transform(e.left, fn), "right": transform(e.right, fn)})
    elif e.kind == "call":
        e = e.model_copy(
            update={
                "args": tuple(transform(a, fn) for a in e.args),
                "kwargs": tuple(kw.model_copy(update={"value": transform(kw.value, fn)}) for kw in e.kwargs),
            }
        )
    elif e.kind == "list":
        e = e.model_copy(update={"items": tuple(transform(i, fn) for i in e.items)})
    out = fn(e)
    return e if out is None else out


def inline_lets(
    e: ast.Expr, lets: dict[str, ast.Expr], _memo: dict[str, ast.Expr] | None = None, _stack: tuple[str, ...] = ()
) -> ast.Expr:
    """Replace names bound by `let` with their (recursively inlined) definitions.

    Each let is inlined once (memoised) however deep the chain; a let that refers to itself
    (reported by the checker) is left as a name instead of recursing forever.
    """
    memo = {} if _memo is None else _memo

    def sub(node: ast.Expr) -> ast.Expr | None:
        if node.kind == "name" and node.id in lets and node.id not in _stack:
            if node.id not in memo:
                memo[node.id] = inline_lets(lets[node.id], lets, memo, _stack + (node.id,))
            return memo[node.id]
        return None

    return transform(e, sub)


def bind_calls(e: ast.Expr, let: str, learned: Callable[[str], bool]) -> ast.Expr:
    """A let's definition with each learned call it writes marked ``bound = (let, index)``, indexed in
    post-order (arguments before the call, in the order written). Inlined, the marks travel with every
    use of the let: a name denotes one value, so its learned calls are one site however often it is used.
    Calls of other lets are still names here; they get their own let's marks."""
    count = 0

    def mark(node: ast.Expr) -> ast.Expr | None:
        nonlocal count
        if node.kind != "call" or not learned(node.func):
            return None
        count += 1
        return node.model_copy(update={"bound": (let, count - 1)})

    return transform(e, mark)


def bound_lets(e: ast.Expr) -> set[str]:
    """The lets whose learned calls ``e`` uses (see :func:`bind_calls`)."""
    return {n.bound[0] for n in walk(e) if n.kind == "call" and n.bound is not None}


def neg(e: ast.Expr) -> ast.Expr:
    if e.kind == "unary":
        return e.operand
    if e.kind == "num":
        return ast.Num(value=-e.value)
    return ast.Unary(op="-", operand=e)


def split_terms(e: ast.Expr) -> list[ast.Expr]:
    """Top-level summands of e, with subtraction turned into negated terms."""
    if e.kind == "binary" and e.op == "+":
        return split_terms(e.left) + split_terms(e.right)
    if e.kind == "binary" and e.op == "-":
        return split_terms(e.left) + [neg(t) for t in split_terms(e.right)]
    return [e]


def distance_coefficient(e: ast.Expr) -> ast.Expr | None:
    """c when e == c * distance with c free of distance (a linear distance bias), else None."""
    if e.kind == "name" and e.id == "distance":
        return ast.Num(value=1)
    if not uses_name(e, "distance"):
        return None
    if e.kind == "unary":
        c = distance_coefficient(e.operand)
        return None if c is None else neg(c)
    if e.kind == "binary" and e.op == "*":
        for a, b in ((e.left, e.right), (e.right, e.left)):
            if not uses_name(a, "distance"):
                c = distance_coefficient(b)
                if c is not None:
                    return a if (c.kind == "num" and c.value == 1) else ast.Binary(op="*", left=a, right=c)
        return None
    if e.kind == "binary" and e.op == "/" and not uses_name(e.right, "distance"):
        c = distance_coefficient(e.left)
        return None if c is None else ast.Binary(op="/", left=c, right=e.right)
    return None
