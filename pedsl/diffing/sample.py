"""A scheme's data-dependent pieces at initialisation, in numpy float64 (for ``pedsl diff --numeric``).

The numeric diff of schemes whose steps, gates or temperature read the tokens, the hidden
state or learned parameters needs the step angles, Householder vectors and log gates that
the compiled module computes at initialisation. ``import torch`` alone takes 1.2-1.7 s on a
laptop CPU, most of the two seconds a diff may take, so this module evaluates the same
expressions with numpy instead:

- static sub-expressions fold through :func:`pedsl.lang.evaluate.evaluate` (float64), as in
  the compiler's evaluator;
- learned call sites are drawn from the distributions the compiled module initialises them
  with - ``linear``: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` weights and biases (torch's
  ``nn.Linear`` default) with ``init_bias`` on the output layer; ``embedding``:
  ``N(0, init^2)``; ``shortconv``: ``N(0, 0.1^2)`` taps plus 1 on the newest token - each
  from its own generator seeded by (seed, site name), so a site that two schemes share gets
  the same weights in both and a diff isolates what changed;
- ``frozen_random`` tables come from numpy's generator seeded like the module's torch table:
  the same distribution, not the same numbers.

Site names, and the order a site's calls are numbered in, follow
:mod:`pedsl.compiler.evaluator`, so a compiled module's parameters and frozen tables can be
loaded (``weights=``, ``tables=``) to reproduce it exactly: that is how the tests check this
evaluator against the compiler's. Values are :class:`NL` arrays with named axes in the
canonical order ``batch, head, pos, dist, pair, chan``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.evaluate import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec, bind_args, evaluate
from pedsl.lang.exprs import calls_in
from pedsl.lang.scheme import Scheme

ORDER = ("batch", "head", "pos", "dist", "pair", "chan")
LEARNED = {"linear", "embedding", "shortconv"}
CHUNK = 1024  # frozen_random(position): generated in chunks so any prefix is stable (as in the compiler)


@dataclass
class NL:
    """A numpy array whose dimensions are the named axes it varies along (in ``ORDER``)."""

    a: np.ndarray
    axes: tuple[str, ...]

    def align(self, axes: tuple[str, ...]) -> np.ndarray:
        """View with a dimension (size 1 where absent) for every axis in ``axes``."""
        src = list(self.axes)
        a = np.transpose(self.a, [src.index(x) for x in axes if x in src])
        return a.reshape([self.a.shape[src.index(x)] if x in src else 1 for x in axes])


def _union(*axes_lists) -> tuple[str, ...]:
    s = set().union(*axes_lists)
    return tuple(a for a in ORDER if a in s)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


_ELEMENTWISE = {
    "log": np.log, "exp": np.exp, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "abs": np.abs, "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)), "log_sigmoid": lambda x: -_softplus(-x),
}


@dataclass
class Ctx:
    L: int
    pairs: int | None = None
    chans: int | None = None
    x: np.ndarray | None = None  # (B, L, d_model)
    tokens: np.ndarray | None = None  # (B, L) integers


class Sampler:
    """Evaluates one scheme's run-time expressions in numpy, with learned sites at initialisation."""

    def __init__(self, scheme: Scheme, *, d_model: int, vocab_size: int = 256, seed: int = 0,
                 weights: dict[str, dict[str, np.ndarray]] | None = None, tables: dict | None = None):
        self.scheme = scheme
        self.heads = scheme.heads
        self.values = {**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.seed = seed
        self.weights = dict(weights or {})  # site -> {state_dict name: array}
        self.tables = dict(tables or {})  # frozen_random key -> array

    # ------------------------------------------------------------------ the scheme's pieces
    def ctx(self, L: int, x=None, tokens=None, group: str | None = None) -> Ctx:
        chans = len(self.scheme.group(group).channels) if group is not None else None
        return Ctx(L=L, pairs=None if chans is None else chans // 2, chans=chans, x=x, tokens=tokens)

    def step_angles(self, t, L: int, x=None, tokens=None) -> np.ndarray:
        """Accumulated-rotation step angles a(t, k), (B|1, H|1, L, P)."""
        c = self.ctx(L, x, tokens, t.group)
        a = self.run(t.angle, f"steps[{t.group}]", c).align(("batch", "head", "pos", "pair"))
        return np.broadcast_to(a, a.shape[:2] + (L, c.pairs))

    def householder(self, t, L: int, x=None, tokens=None) -> tuple[np.ndarray, np.ndarray]:
        """Householder vectors w (B|1, H, L, Dg) on the group's channels and beta (B|1, H, L)."""
        c = self.ctx(L, x, tokens, t.group)
        w = self.run(t.w, f"w[{t.group}]", c).align(("batch", "head", "pos", "chan"))
        beta = self.run(t.beta, f"beta[{t.group}]", c).align(("batch", "head", "pos"))
        B = max(w.shape[0], beta.shape[0])
        return (np.broadcast_to(w, (B, self.heads, L, c.chans)),
                np.broadcast_to(beta, (B, self.heads, L)))

    def log_gate(self, index: int, L: int, x=None, tokens=None) -> np.ndarray:
        """The per-step log gate of gate bias ``index``, (B|1, H, L)."""
        g = self.run(self.scheme.biases[index].log_gate, f"bias[{index}]", self.ctx(L, x, tokens))
        a = g.align(("batch", "head", "pos"))
        return np.broadcast_to(a, (a.shape[0], self.heads, L))

    def temperature(self, L: int) -> np.ndarray:
        """tau at query positions 0..L-1, (H|1, L)."""
        if self.scheme.temperature is None:
            return np.ones((1, L))
        tau = self.run(self.scheme.temperature, "temperature", self.ctx(L)).align(("head", "pos"))
        return np.broadcast_to(tau, (tau.shape[0], L))

    # ------------------------------------------------------------------ expressions
    def run(self, e: ast.Expr, site: str, ctx: Ctx) -> NL:
        self._site, self._count = site, 0
        return self._eval(e, ctx)

    def _static(self, e: ast.Expr, ctx: Ctx):
        try:
            return evaluate(e, StaticEnv(values=self.values, pairs=ctx.pairs, n=ctx.L))
        except EvalIssue as issue:
            raise CompileError(str(issue), hint=issue.hint) from None

    def _eval(self, e: ast.Expr, ctx: Ctx) -> NL:
        static = DYNAMIC if calls_in(e) & LEARNED else self._static(e, ctx)
        if static is not DYNAMIC:
            if isinstance(static, Vec):
                return NL(np.array(static.values, dtype=np.float64), (static.axis,))
            if isinstance(static, (GroupSpec, str, list, bool)) or static is None:
                raise CompileError(f"expected a number, got {static!r}")
            return NL(np.array(float(static)), ())
        k = e.kind
        if k == "name":
            if e.id in ("position", "distance"):
                return NL(np.arange(ctx.L, dtype=np.float64), ("pos" if e.id == "position" else "dist",))
            if e.id == "n":
                return NL(np.array(float(ctx.L)), ())
            raise CompileError(f"'{e.id}' cannot be used as a number here")
        if k == "unary":
            v = self._eval(e.operand, ctx)
            return NL(-v.a, v.axes)
        if k == "binary":
            a, b = self._eval(e.left, ctx), self._eval(e.right, ctx)
            axes = _union(a.axes, b.axes)
            x, y = a.align(axes), b.align(axes)
            op = e.op
            out = x + y if op == "+" else x - y if op == "-" else x * y if op == "*" else x / y if op == "/" \
                else np.power(x, y)
            return NL(out, axes)
        if k == "call":
            return self._call(e, ctx)
        raise CompileError(f"cannot evaluate a {k} expression at run time")

    def _call(self, e: ast.Call, ctx: Ctx) -> NL:
        args = bind_args(e, FUNCTIONS[e.func].params)
        f = e.func
        if f in _ELEMENTWISE:
            v = self._eval(args["x"], ctx)
            return NL(_ELEMENTWISE[f](v.a), v.axes)
        if f in ("min", "max", "clamp", "ramp"):
            names = ("a", "b") if f in ("min", "max") else ("x", "lo", "hi")
            vals = [self._eval(args[n], ctx) for n in names]
            axes = _union(*[v.axes for v in vals])
            ts = [v.align(axes) for v in vals]
            if f == "min":
                return NL(np.minimum(*ts), axes)
            if f == "max":
                return NL(np.maximum(*ts), axes)
            x, lo, hi = ts
            return NL(np.minimum(np.maximum(x, lo), hi) if f == "clamp" else np.clip((x - lo) / (hi - lo), 0, 1), axes)
        if f == "log_length":
            length = float(self._int(args["length"], ctx))
            i = np.arange(ctx.L, dtype=np.float64)
            return NL(np.maximum(np.log(i + 1) / math.log(length), 1.0), ("pos",))
        if f == "frozen_random":
            return self._frozen_random(args, ctx)
        if f == "normalize":
            v = self._eval(args["v"], ctx)
            ax = v.axes.index("chan")
            return NL(v.a / np.maximum(np.linalg.norm(v.a, axis=ax, keepdims=True), 1e-6), v.axes)
        if f == "embedding":
            return self._embedding(args, ctx)
        if f == "linear":
            return self._linear(args, ctx)
        if f == "shortconv":
            return self._shortconv(args, ctx)
        raise CompileError(f"{f}() has no run-time value here")

    def _int(self, arg, ctx: Ctx):
        return arg if isinstance(arg, (int, float)) and not isinstance(arg, bool) else self._static(arg, ctx)

    def _width(self, arg, ctx: Ctx) -> tuple[str, int]:
        name = arg.id if isinstance(arg, ast.Name) else str(arg)
        axis = {"channel": "chan"}.get(name, name)
        if axis == "pair":
            if ctx.pairs is None:
                raise CompileError("a per-pair value is only defined inside a rotation")
            return axis, ctx.pairs
        return axis, ctx.chans if axis == "chan" else 1

    def _next_site(self, kind: str) -> str:
        key = f"{self._site}__{kind}{self._count}"
        self._count += 1
        return key

    def _rng(self, *key) -> np.random.Generator:
        return np.random.default_rng([self.seed, *(zlib.crc32(str(k).encode()) for k in key)])

    def _site_weights(self, site: str, make) -> dict[str, np.ndarray]:
        if site not in self.weights:
            self.weights[site] = make(self._rng(site))
        return self.weights[site]

    def _frozen_random(self, args, ctx: Ctx) -> NL:
        seed = int(self._int(args["seed"], ctx))
        index, P = args["index"], ctx.pairs
        if isinstance(index, ast.Name) and index.id == "token":
            key = ("token", seed, P, self.vocab_size)
            if key not in self.tables:
                self.tables[key] = np.random.default_rng(seed).standard_normal((self.vocab_size, P))
            if ctx.tokens is None:
                raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
            return NL(self.tables[key][ctx.tokens], ("batch", "pos", "pair"))
        parts = []
        for c in range(0, max(ctx.L, 1), CHUNK):
            key = ("position", seed, P, c)
            if key not in self.tables:
                self.tables[key] = np.random.default_rng([seed, c // CHUNK]).standard_normal((CHUNK, P))
            parts.append(self.tables[key])
        return NL(np.concatenate(parts)[: ctx.L], ("pos", "pair"))

    def _heads_out(self, out: np.ndarray, axis: str, width: int) -> NL:
        B, L = out.shape[:2]
        out = out.reshape(B, L, self.heads, width).transpose(0, 2, 1, 3)  # (B, H, L, W)
        if axis == "head":
            return NL(out[..., 0], ("batch", "head", "pos"))
        return NL(out, ("batch", "head", "pos", axis))

    def _embedding(self, args, ctx: Ctx) -> NL:
        axis, width = self._width(args["to"], ctx)
        std = float(self._int(args["init"], ctx))
        n = self.heads * width
        p = self._site_weights(self._next_site("embedding"),
                               lambda g: {"weight": std * g.standard_normal((self.vocab_size, n))})
        if ctx.tokens is None:
            raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
        return self._heads_out(p["weight"][ctx.tokens], axis, width)

    def _linear(self, args, ctx: Ctx) -> NL:
        axis, width = self._width(args["to"], ctx)
        rank = int(self._int(args["rank"], ctx))
        bias0 = float(self._int(args["init_bias"], ctx))
        n, d = self.heads * width, self.d_model

        def make(g):  # torch nn.Linear's default: U(+-1/sqrt(fan_in)) for weight and bias
            if rank > 0:
                return {"0.weight": g.uniform(-1, 1, (rank, d)) / math.sqrt(d),
                        "1.weight": g.uniform(-1, 1, (n, rank)) / math.sqrt(rank), "1.bias": np.full(n, bias0)}
            return {"weight": g.uniform(-1, 1, (n, d)) / math.sqrt(d), "bias": np.full(n, bias0)}

        p = self._site_weights(self._next_site("linear"), make)
        if ctx.x is None:
            raise CompileError("this scheme reads the hidden state: pass x=(B, L, d_model)")
        if "0.weight" in p:
            out = (ctx.x @ p["0.weight"].T) @ p["1.weight"].T + p["1.bias"]
        else:
            out = ctx.x @ p["weight"].T + p["bias"]
        return self._heads_out(out, axis, width)

    def _shortconv(self, args, ctx: Ctx) -> NL:
        v = self._eval(args["v"], ctx)
        site = self._next_site("shortconv")
        width = int(self._int(args["width"], ctx))
        axes = _union(v.axes, ("batch", "head", "pos"))
        t = np.moveaxis(v.align(axes), axes.index("pos"), -1)  # (..., L)
        lead, L = t.shape[:-1], t.shape[-1]
        feats = int(np.prod(lead[1:])) if len(lead) > 1 else 1

        def make(g):  # near the identity: the newest token dominates
            w = 0.1 * g.standard_normal((feats, 1, width))
            w[..., -1] += 1.0
            return {"weight": w}

        w = self._site_weights(site, make)["weight"][:, 0, :]  # (feats, width)
        flat = t.reshape(lead[0], feats, L)
        out = np.zeros_like(flat)
        for k in range(width):  # causal: out[t] = sum_k w[k] x[t + k - (width - 1)]
            s = width - 1 - k
            out[..., s:] += w[None, :, k, None] * flat[..., : L - s]
        return NL(np.moveaxis(out.reshape(*lead, L), -1, axes.index("pos")), axes)
