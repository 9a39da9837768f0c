"""The walk of run-time expressions, shared by the compiler's torch evaluator and the diff's numpy sampler.

A run-time value is a labelled array: an array whose dimensions are the named axes it varies
along, in the canonical order ``batch, head, pos, dist, pair, chan`` (:data:`ORDER`); arithmetic
aligns operands by axis name. :class:`DynamicEvaluator` does everything that does not depend on
the array library - folding static sub-expressions through :func:`pedsl.lang.fold.fold_expr`
(float64), dispatching on the expression, binding and folding call arguments, running a builtin
record's ``run`` (or, for a source with state, its ``site`` through an :class:`At`), and naming
the learned call sites - and leaves the array operations, frozen tables and learned layers to a
subclass: :class:`pedsl.runtime.torch_backend.Evaluator` (torch, trainable) and
:class:`pedsl.runtime.numpy_backend.NumpyEvaluator` (numpy, at initialisation). The walk names
no builtin: it reads their records.

Sharing the walk keeps the two in step: a learned call is named by
:func:`learned_calls` - ``"{site}__{builtin}{count}"``, numbered in the order
the walk visits the learned calls of one expression, or ``"let[name]__{builtin}{index}"`` for a call
written in a let, which is one value wherever it is used - so a compiled module's parameters can be
loaded into the numpy evaluator by name. A let's learned value is computed once per evaluation of
an expression and reused by its other uses there.
"""

from __future__ import annotations

from typing import Any

from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.fold import bind_args, derived_static, fold_expr
from pedsl.lang.typed import node_types
from pedsl.lang.values import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec
from pedsl.lang.exprs import to_source


def param_key(site: str, kind: str, count: int) -> str:
    """The name of the ``count``-th learned call (``kind``: linear, embedding, shortconv, learned) inside a site's
    expression: the key of ``learned.sites`` in the module, in generated code and in the sampler."""
    return f"{site}__{kind}{count}"


def site_name(role: str, owner: str | int | None = None) -> str:
    """The name of a graph node; for an evaluation site also the prefix of its learned parameters:
    ``phase[g]``, ``steps[g]``, ``w[g]``, ``beta[g]`` (channel group g), ``bias[i]``, ``temperature``
    (and ``transport[g]``, the group's transform node)."""
    return role if owner is None else f"{role}[{owner}]"


def learned_calls(e: ast.Expr, site: str) -> list[tuple[ast.Call, str]]:
    """The learned calls of a site's expression with the key of each, in the order the run-time walk
    visits them (post-order, a call's arguments in its record's parameter order): the one rule naming
    learned parameters, for :class:`pedsl.runtime.walk.DynamicEvaluator` (the module, the reference
    backend, the numpy sampler), codegen and :func:`pedsl.compiler.plan.learned_sites`.

    A call written in a let (``call.bound = (let, index)``, set by the resolver) is named after the
    let, ``let[name]__<kind><index>``, whichever site reads it: a name denotes one value, so every
    use of the let reads one set of parameters. Any other call is the ``count``-th of its site."""
    out: list[tuple[ast.Call, str]] = []

    def visit(node: object) -> None:  # an expression, or a parameter left at its default
        if isinstance(node, ast.Unary):
            visit(node.operand)
        elif isinstance(node, ast.Binary):
            visit(node.left)
            visit(node.right)
        elif isinstance(node, ast.ListExpr):
            for item in node.items:
                visit(item)
        elif isinstance(node, ast.Call):
            spec = FUNCTIONS[node.func]
            args = bind_args(node, spec.params)
            for p, _ in spec.params:
                visit(args[p])
            if spec.learned:
                key = param_key(site_name("let", node.bound[0]), node.func, node.bound[1]) if node.bound \
                    else param_key(site, node.func, sum(1 for _, k in out if k.startswith(site + "__")))
                out.append((node, key))

    visit(e)
    return out


ORDER = ("batch", "head", "pos", "dist", "pair", "chan")
INPUT_AXES = {"position": "pos"}  # the run-time inputs a builtin record may read (its ``inputs``)


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
    length or None), ``x`` (B, L, d_model) and ``tokens`` (B, L), either possibly None, and ``axes``
    (the scheme's declared position axes; () for one unnamed axis).
    """

    def run(self, e: ast.Expr, ctx, site: str, part: ast.Expr | None = None):
        """The value of ``e`` (``part``: of that node under ``e``, its learned calls named as in all of ``e``)."""
        self._keys = {id(call): key for call, key in learned_calls(e, site)}  # node -> its parameters' name
        self._shared: dict[str, Any] = {}  # a let's learned value, by key: computed once, read by every use
        self._types = node_types(e, ctx.values)  # the checker's type of every node (docs/semantics.md §1a)
        return self._eval(e if part is None else part, ctx)

    # ------------------------------------------------------------------ the walk
    def static(self, e: ast.Expr, ctx) -> Any:
        try:
            return fold_expr(e, StaticEnv(values=ctx.values, pairs=ctx.pairs, n=ctx.n if ctx.n is not None else ctx.L))
        except EvalIssue as issue:
            raise CompileError(str(issue), hint=issue.hint) from None

    def static_number(self, arg, ctx) -> float:
        """A call argument that must be a static number (a literal default, or an expression)."""
        if isinstance(arg, (int, float)):  # a default (a bool for a flag such as bucket's bidirectional)
            return arg
        v = self.static(arg, ctx)
        if not isinstance(v, (int, float)):
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
        static = DYNAMIC if self._types[id(e)].learned else self.static(e, ctx)  # learned sites must be visited
        if static is not DYNAMIC:
            if isinstance(static, (GroupSpec, str, list, bool)) or static is None:
                raise CompileError(f"expected a number, got {static!r}")
            value = self.constant(static, ctx)
            self.remember(e, ctx, value)
            return value
        if e.kind == "name":
            if "." in e.id:  # position.AXIS, distance.AXIS
                base, _, axis = e.id.partition(".")
                return self.axis_distance(ctx, axis) if base == "distance" else self.axis_position(ctx, axis)
            if e.id in ("position", "distance", "query_position"):
                return self.arange(ctx, "dist" if e.id == "distance" else "pos")
            if e.id == "n":
                return self.constant(float(ctx.n if ctx.n is not None else ctx.L), ctx)
            raise CompileError(f"'{e.id}' cannot be used as a number here")
        if e.kind == "unary":
            return self.negate(self._eval(e.operand, ctx))
        if e.kind == "binary":
            return self.binary(e.op, self._eval(e.left, ctx), self._eval(e.right, ctx))
        if e.kind == "call":
            return self._call(e, ctx)
        raise CompileError(f"cannot evaluate {to_source(e)} at run time")

    def _call(self, e: ast.Call, ctx):
        spec = FUNCTIONS[e.func]
        args = bind_args(e, spec.params)
        if spec.axis_select is not None:
            return self._select_axes(spec, args, ctx)
        if spec.run is None and spec.site is None:
            raise CompileError(f"{e.func}() has no run-time value here")
        static = {p: kind(self.static_number(args[p], ctx)) for p, kind in spec.static}
        if spec.derive:
            try:
                static = derived_static(e, static, lambda a: self.static_number(a, ctx))
            except EvalIssue as issue:
                raise CompileError(str(issue), hint=issue.hint) from None
        names = {p: _name_of(args[p]) for p in spec.names}
        rest = [p for p, _ in spec.params if p not in static and p not in names]
        if spec.site is not None:  # a source with state: asks this backend for it at the call site
            key = self._keys[id(e)] if spec.learned else None
            if key is not None and key in self._shared:
                return self._shared[key]
            values = [self._eval(run_time_arg(args[p]), ctx) for p in rest]
            out = spec.site(At(self, ctx, key), *values, **names, **static)
            if e.bound is not None and key is not None:  # bound: a learned call written in a let
                self._shared[key] = out
            return out
        # a record's run-time value, over this backend's array namespace
        arrays = [self.arange(ctx, INPUT_AXES[i]) for i in spec.inputs] \
            + [self._eval(run_time_arg(args[p]), ctx) for p in rest]
        return self.apply(spec, arrays, static)

    def _select_axes(self, spec, args: dict, ctx):
        """An axis selection (sections, interleave): sum over axes a of [pair k reads a] * position.a."""
        sizes = self.static(args["sizes"], ctx)
        try:
            axis_of = spec.axis_select(sizes, ctx.pairs)
        except EvalIssue as issue:
            raise CompileError(str(issue), hint=issue.hint) from None
        total = None
        for a, name in enumerate(ctx.axes):
            onehot = Vec("pair", tuple(1.0 if x == a else 0.0 for x in axis_of))
            term = self.binary("*", self.constant(onehot, ctx), self.axis_position(ctx, name))
            total = term if total is None else self.binary("+", total, term)
        return total

    def axis_position(self, ctx, axis: str):
        """The positions along one declared axis (``position.AXIS``): the call's per-axis positions, or
        the one-axis positions where the call gave none (every axis then reads the same position)."""
        return self.arange(ctx, "pos")

    def axis_distance(self, ctx, axis: str):
        """The signed distances ``i_a - j_a`` along one declared axis (``distance.AXIS``) of the (query, key)
        pairs a bias is evaluated at; a context that gives none evaluates the bias over the one-axis
        distance (text: every axis at one position, so ``i_a - j_a = i - j``)."""
        return self.arange(ctx, "dist")

    # ------------------------------------------------------------------ arithmetic, for any array library
    # A value is a labelled array with ``.t`` (the array) and ``.axes``. Subclasses give ``wrap``,
    # ``aligned`` and ``ops`` (the array namespace of pedsl.lang.builtin_defs.arrays that records'
    # ``run`` is written over); Python's operators and ``.clip`` mean the same on numpy arrays and
    # torch tensors.
    ops: Any = None
    vocab_size: int  # the tokens' range (a token lookup's rows): set by a subclass

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

    def frozen(self, key: tuple, shape: tuple[int, int], seed: tuple[int, ...]):
        """A frozen standard normal table, drawn once per key from a generator seeded by ``seed``
        ((seed,) or (seed, chunk))."""
        raise NotImplementedError

    def dense(self, site: str, n_out: int, rank: int, init_bias: float, ctx):
        """The learned map of the hidden state at ``site``, (B, L, n_out): U(+-1/sqrt(fan_in)) weights
        (rank > 0: through ``rank`` features), the output bias starting at init_bias."""
        raise NotImplementedError

    def lookup(self, site: str, tokens, n_out: int, std: float):
        """The learned table at ``site`` read at the tokens, (B, L, n_out): N(0, std^2) start values."""
        raise NotImplementedError

    def causal_conv(self, site: str, flat, width: int, ctx):
        """The learned causal depthwise convolution at ``site`` of flat (B|1, F, L) over positions,
        near the identity at the start: N(0, 0.1^2) taps plus 1 on the newest token."""
        raise NotImplementedError

    def parameter(self, site: str, start, shape: tuple[int, ...]):
        """The learned value at ``site``, of ``shape``, starting at ``start`` (float64, broadcast to
        ``shape``); read in float64."""
        raise NotImplementedError

    def indexed(self, site: str, index, rows: int, n_out: int, std: float):
        """The learned (rows, n_out) table at ``site`` read at the integer-valued ``index`` (in range),
        index.shape + (n_out,), float64: N(0, std^2) start values."""
        raise NotImplementedError

    def mlp(self, site: str, features, hidden: int, depth: int, n_out: int, relu: bool = False):
        """The learned MLP at ``site`` of ``features`` (..., 1) -> (..., n_out), float64: Linear(1, hidden),
        SiLU (ReLU), (depth - 1) x [Linear(hidden, hidden), SiLU], Linear(hidden, n_out), torch's default start."""
        raise NotImplementedError


def run_time_arg(arg: object) -> ast.Expr:
    """An argument evaluated at run time: an expression, always written (no record gives a run-time
    parameter a default, and the checker reports a missing one)."""
    assert isinstance(arg, ast.EXPR_NODES), f"a run-time argument left at its default {arg!r}"
    return arg


def _name_of(arg) -> str | None:
    """The name an argument holds (``to = pair``, ``index = token``), or its default."""
    return arg.id if isinstance(arg, ast.Name) else arg if isinstance(arg, str) else None


class At:
    """A source's call site, as its record's ``site`` sees it (:mod:`pedsl.lang.builtin_defs.sources`):
    the backend's array namespace and values, the sizes and run-time inputs of the context, and the
    backend's frozen tables and learned layers - the latter at the site the walk named."""

    def __init__(self, ev: DynamicEvaluator, ctx, site: str | None):
        self.ev, self.ctx, self.site = ev, ctx, site
        self.ops, self.wrap = ev.ops, ev.wrap
        self.heads, self.pairs, self.chans, self.vocab_size = ctx.heads, ctx.pairs, ctx.chans, ev.vocab_size

    def _learned_site(self) -> str:
        """The site's parameters' name (None for a source with state that learns nothing)."""
        assert self.site is not None, "only a learned record's source asks for learned layers"
        return self.site

    def width(self, to: str) -> tuple[str, int]:
        """The axis and per-head width of an output ``to = pair | channel | head``."""
        axis = {"channel": "chan"}.get(to, to)
        if axis == "pair":
            if self.pairs is None:
                raise CompileError("a per-pair value is only defined inside a rotation")
            return axis, self.pairs
        return axis, self.chans if axis == "chan" else 1

    def aligned_with(self, v, axes: tuple[str, ...]):
        """v's array over its axes and ``axes`` (size 1 where absent), and those axes."""
        both = union_axes(v.axes, axes)
        return self.ev.aligned([v], both)[0], both

    def tokens(self):
        if self.ctx.tokens is None:
            raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
        return self.ctx.tokens

    def position(self):
        return self.ev.arange(self.ctx, "pos")

    def frozen(self, key: tuple, shape: tuple[int, int], seed: tuple[int, ...]):
        return self.ev.frozen(key, shape, seed)

    def dense(self, n_out: int, rank: int, init_bias: float):
        return self.ev.dense(self._learned_site(), n_out, rank, init_bias, self.ctx)

    def lookup(self, n_out: int, std: float):
        return self.ev.lookup(self._learned_site(), self.tokens(), n_out, std)

    def causal_conv(self, flat, width: int):
        return self.ev.causal_conv(self._learned_site(), flat, width, self.ctx)

    def parameter(self, start, shape: tuple[int, ...]):
        return self.ev.parameter(self._learned_site(), start, shape)

    def indexed(self, index, rows: int, n_out: int, std: float):
        return self.ev.indexed(self._learned_site(), index, rows, n_out, std)

    def mlp(self, features, hidden: int, depth: int, n_out: int, relu: bool = False):
        return self.ev.mlp(self._learned_site(), features, hidden, depth, n_out, relu)
