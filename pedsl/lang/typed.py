"""The checker's types of every node of a resolved expression (docs/semantics.md §1a).

The resolved IR (:mod:`pedsl.lang.scheme`) stores the type of each transport, bias and
temperature expression. Evaluators that walk *into* an expression (the run-time walk,
the code generator) ask :func:`node_types` for the types of its sub-expressions - and of
expressions the compiler's passes build (``angle * position``) - which runs the same
:class:`~pedsl.lang.typecheck.Checker` over it once, parameters typed by their values.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pedsl.lang import ast
from pedsl.lang.typecheck import Checker
from pedsl.lang.types import BOOL, INT, NUM, STR, Ty
from pedsl.lang.exprs import to_source

_MAX_CACHED = 4096
_cache: dict[int, tuple[ast.Expr, dict[int, Ty]]] = {}  # id(root) -> (root, its table), root kept alive


def _constant(t: Ty) -> Callable[[], Ty]:
    return lambda: t


def _param_type(v: Any) -> Ty:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return INT
    if isinstance(v, str):
        return STR
    return NUM


def _unexpected(code: str, message: str, node=None, hint=None, **_) -> None:
    where = f" in {to_source(node)}" if node is not None else ""
    raise AssertionError(f"a resolved expression failed to type ({code}: {message}{where})")


def node_types(root: ast.Expr, values: Mapping[str, Any]) -> dict[int, Ty]:
    """``id(node) -> Ty`` for ``root`` and every node under it; ``values`` are the scheme's parameters
    (and heads, head_dim). Cached per root object."""
    hit = _cache.get(id(root))
    if hit is not None and hit[0] is root:
        return hit[1]
    seen: dict[int, Ty] = {}
    names = {k: _constant(_param_type(v)) for k, v in values.items()}
    Checker(names, _unexpected, seen=seen).infer(root)
    if len(_cache) >= _MAX_CACHED:
        _cache.clear()
    _cache[id(root)] = (root, seen)
    return seen


def type_of(e: ast.Expr, values: Mapping[str, Any]) -> Ty:
    """The type of one resolved expression."""
    return node_types(e, values)[id(e)]
