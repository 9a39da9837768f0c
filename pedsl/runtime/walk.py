"""The walk of run-time expressions, shared by the compiler's torch evaluator and the diff's numpy sampler.

A run-time value is a labelled array: an array whose dimensions are the named axes it varies
along, in the canonical order ``batch, head, pos, dist, pair, chan`` (:data:`ORDER`); arithmetic
aligns operands by axis name. :class:`DynamicEvaluator` does everything that does not depend on
the array library - folding static sub-expressions through :func:`pedsl.lang.fold.fold_expr`
(float64), dispatching on the expression and builtin, binding and folding call arguments, and
naming the learned call sites - and leaves the array operations to a subclass:
:class:`pedsl.runtime.torch_backend.Evaluator` (torch, trainable) and
:class:`pedsl.diffing.sample.NumpyEvaluator` (numpy, at initialisation).

Sharing the walk keeps the two in step: a site is ``"{site}__{kind}{count}"``, numbered in the
order the walk visits the learned calls of one expression, so a compiled module's parameters can
be loaded into the numpy evaluator by name.
"""

from __future__ import annotations

from typing import Any

from pedsl.compiler.plan import param_key
from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS, LEARNED
from pedsl.lang.fold import bind_args, fold_expr
from pedsl.lang.exprs import calls_in
from pedsl.lang.values import DYNAMIC, EvalIssue, GroupSpec, StaticEnv

ORDER = ("batch", "head", "pos", "dist", "pair", "chan")
INPUT_AXES = {"position": "pos"}  # the run-time inputs a builtin record may read (its ``inputs``)
FROZEN_CHUNK = 1024  # frozen_random(position) is drawn in chunks of positions, so any prefix is stable


def union_axes(*axes_lists) -> tuple[str, ...]:
    """The axes of a result: every operand's axes, in canonical order."""
    s = set().union(*axes_lists)
    return tuple(a for a in ORDER if a in s)


def permuted_shape(axes: tuple[str, ...], shape, want: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """(permutation, shape) that view an array over ``axes`` with a dimension for every axis of
    ``want`` (size 1 where absent)."""
    src = list(axes)
    return [src.index(a) for a in want if a in src], [shape[src.index(a)] if a in src else 1 for a in want]


class DynamicEvaluator:
    """Evaluates an expression at run time; subclasses implement the array operations.

    The context ``ctx`` must provide ``values`` (params, heads, head_dim), ``heads``, ``pairs`` and
    ``chans`` of the current channel group (or None), ``L`` (sequence length), ``n`` (run-time
    length or None), ``x`` (B, L, d_model) and ``tokens`` (B, L), either possibly None.
    """

    def run(self, e: ast.Expr, ctx, site: str):
        self._site, self._count = site, 0
        return self._eval(e, ctx)

    # ------------------------------------------------------------------ the walk
    def static(self, e: ast.Expr, ctx) -> Any:
        try:
            return fold_expr(e, StaticEnv(values=ctx.values, pairs=ctx.pairs, n=ctx.n if ctx.n is not None else ctx.L))
        except EvalIssue as issue:
            raise CompileError(str(issue), hint=issue.hint) from None

    def static_number(self, arg, ctx) -> float:
        """A call argument that must be a static number (a literal default, or an expression)."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return arg
        v = self.static(arg, ctx)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CompileError(f"expected a static number, got {v!r}")
        return v

    def folded(self, e: ast.Expr, ctx):
        """A static value folded earlier (subclasses may cache them), or None."""
        return None

    def remember(self, e: ast.Expr, ctx, value) -> None:
        """Called with every static value folded (subclasses may cache it)."""

    def _eval(self, e: ast.Expr, ctx):
        hit = self.folded(e, ctx)
        if hit is not None:
            return hit
        static = DYNAMIC if calls_in(e) & LEARNED else self.static(e, ctx)  # learned sites must be visited
        if static is not DYNAMIC:
            if isinstance(static, (GroupSpec, str, list, bool)) or static is None:
                raise CompileError(f"expected a number, got {static!r}")
            value = self.constant(static, ctx)
            self.remember(e, ctx, value)
            return value
        k = e.kind
        if k == "name":
            if e.id in ("position", "distance"):
                return self.arange(ctx, "pos" if e.id == "position" else "dist")
            if e.id == "n":
                return self.constant(float(ctx.n if ctx.n is not None else ctx.L), ctx)
            raise CompileError(f"'{e.id}' cannot be used as a number here")
        if k == "unary":
            return self.negate(self._eval(e.operand, ctx))
        if k == "binary":
            return self.binary(e.op, self._eval(e.left, ctx), self._eval(e.right, ctx))
        if k == "call":
            return self._call(e, ctx)
        from pedsl.lang.exprs import to_source

        raise CompileError(f"cannot evaluate {to_source(e)} at run time")

    def _call(self, e: ast.Call, ctx):
        spec = FUNCTIONS[e.func]
        args = bind_args(e, spec.params)
        f = e.func
        if spec.run is not None:  # a record's run-time value, over this backend's array namespace
            static = {p: kind(self.static_number(args[p], ctx)) for p, kind in spec.static}
            arrays = [self.arange(ctx, INPUT_AXES[i]) for i in spec.inputs]
            arrays += [self._eval(args[p], ctx) for p, _ in spec.params if p not in static]
            return self.apply(spec, arrays, static)
        if f == "frozen_random":
            index = args["index"]
            by_token = isinstance(index, ast.Name) and index.id == "token"
            if by_token and ctx.tokens is None:
                raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
            return self.frozen_random(int(self.static_number(args["seed"], ctx)), by_token, ctx)
        if f == "normalize":
            return self.normalize(self._eval(args["v"], ctx))
        if f == "embedding":
            axis, width = self._width(args["to"], ctx)
            site = self._next_site("embedding")
            if ctx.tokens is None:
                raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
            return self.embedding(site, axis, width, float(self.static_number(args["init"], ctx)), ctx)
        if f == "linear":
            axis, width = self._width(args["to"], ctx)
            site = self._next_site("linear")
            return self.linear(site, axis, width, int(self.static_number(args["rank"], ctx)),
                               float(self.static_number(args["init_bias"], ctx)), ctx)
        if f == "shortconv":
            v = self._eval(args["v"], ctx)
            return self.shortconv(self._next_site("shortconv"), v, int(self.static_number(args["width"], ctx)), ctx)
        raise CompileError(f"{f}() has no run-time value here")

    def _width(self, arg, ctx) -> tuple[str, int]:
        """The axis and per-head width of a learned output (``to = pair | channel | head``)."""
        name = arg.id if isinstance(arg, ast.Name) else str(arg)
        axis = {"channel": "chan"}.get(name, name)
        if axis == "pair":
            if ctx.pairs is None:
                raise CompileError("a per-pair value is only defined inside a rotation")
            return axis, ctx.pairs
        return axis, ctx.chans if axis == "chan" else 1

    def _next_site(self, kind: str) -> str:
        key = param_key(self._site, kind, self._count)
        self._count += 1
        return key

    # ------------------------------------------------------------------ arithmetic, for any array library
    # A value is a labelled array with ``.t`` (the array) and ``.axes``. Subclasses give ``wrap``,
    # ``aligned`` and ``ops`` (the array namespace of pedsl.lang.builtin_defs.arrays that records'
    # ``run`` is written over); Python's operators and ``.clip`` mean the same on numpy arrays and
    # torch tensors.
    ops: Any = None

    def wrap(self, array, axes: tuple[str, ...]):
        raise NotImplementedError

    def aligned(self, values: list, axes: tuple[str, ...]) -> list:
        """The arrays of ``values`` with one dimension per axis of ``axes`` (size 1 where absent)."""
        raise NotImplementedError

    def negate(self, v):
        return self.wrap(-v.t, v.axes)

    def binary(self, op: str, a, b):
        axes = union_axes(a.axes, b.axes)
        x, y = self.aligned([a, b], axes)
        return self.wrap(x + y if op == "+" else x - y if op == "-" else x * y if op == "*" else x / y if op == "/"
                         else x ** y, axes)

    def apply(self, spec, vals: list, static: dict):
        """A builtin record's run-time value: its ``run`` over the arguments, aligned by axis name."""
        if len(vals) == 1:
            return self.wrap(spec.run(self.ops, vals[0].t, **static), vals[0].axes)
        axes = union_axes(*[v.axes for v in vals])
        return self.wrap(spec.run(self.ops, *self.aligned(vals, axes), **static), axes)

    # ------------------------------------------------------------------ run-time sources (subclasses)
    def constant(self, value, ctx):  # a number or a pedsl.lang.values.Vec
        raise NotImplementedError

    def arange(self, ctx, axis: str):
        raise NotImplementedError

    def frozen_random(self, seed: int, by_token: bool, ctx):
        raise NotImplementedError

    def normalize(self, v):
        raise NotImplementedError

    def embedding(self, site: str, axis: str, width: int, init: float, ctx):
        raise NotImplementedError

    def linear(self, site: str, axis: str, width: int, rank: int, init_bias: float, ctx):
        raise NotImplementedError

    def shortconv(self, site: str, v, width: int, ctx):
        raise NotImplementedError
