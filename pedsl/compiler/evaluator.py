"""Run-time evaluation of `.pe` expressions as torch tensors with named axes.

A value is an :class:`LT` (labelled tensor): a tensor whose dimensions are the
axes it varies along, in the canonical order ``batch, head, pos, dist, pair,
chan``. Arithmetic aligns operands by axis name, so ``w * position`` is the
outer product ``(L, P)`` and ``-slopes(heads) * distance`` is ``(H, L)``.

Static sub-expressions (frequency grids, slopes, constants) are folded by
:mod:`pedsl.lang.evaluate` in float64 and enter as constants. The dynamic
builtins - ``position``, ``distance``, ``log_length``, ``frozen_random``, and the
learned ``linear``/``embedding``/``shortconv`` - are computed here. Learned
builtins own parameters in :class:`Learned`, created once per call site when the
module is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.evaluate import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec, bind_args, evaluate

ORDER = ("batch", "head", "pos", "dist", "pair", "chan")
F64 = torch.float64


@dataclass
class LT:
    t: Tensor
    axes: tuple[str, ...]

    def align(self, axes: tuple[str, ...]) -> Tensor:
        """View of t with a dimension (size 1 where absent) for every axis in ``axes``."""
        t = self.t
        shape = []
        src = list(self.axes)
        for a in axes:
            shape.append(t.shape[src.index(a)] if a in src else 1)
        return t.reshape(shape) if src == [a for a in axes if a in src] else _permute(t, src, axes).reshape(shape)


def _permute(t: Tensor, src: list[str], axes: tuple[str, ...]) -> Tensor:
    order = [src.index(a) for a in axes if a in src]
    return t.permute(order)


def _union(*axes_lists) -> tuple[str, ...]:
    s = set()
    for a in axes_lists:
        s |= set(a)
    return tuple(a for a in ORDER if a in s)


def lift(v, device=None) -> LT:
    """A static value (number, Vec) as an LT in float64."""
    if isinstance(v, LT):
        return v
    if isinstance(v, Vec):
        return LT(torch.tensor(v.values, dtype=F64, device=device), (v.axis,))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CompileError(f"expected a number, got {v!r}")
    return LT(torch.tensor(float(v), dtype=F64, device=device), ())


@dataclass
class Context:
    """What an evaluation may read: static values, sizes, inputs."""

    values: dict  # params + heads/head_dim
    heads: int
    pairs: int | None = None  # rotary pairs of the current group
    chans: int | None = None  # channels of the current group
    L: int = 0
    n: int | None = None
    x: Tensor | None = None  # (B, L, d_model)
    tokens: Tensor | None = None  # (B, L)
    device: torch.device | None = None
    dtype: torch.dtype = torch.float32  # dtype of data-dependent computations


class Learned(nn.Module):
    """The trainable parameters of every learned call site of a scheme, by site key."""

    def __init__(self) -> None:
        super().__init__()
        self.sites = nn.ModuleDict()


class Evaluator:
    """Evaluates expressions; ``build=True`` creates the learned call sites instead of reading them."""

    def __init__(self, learned: Learned, d_model: int | None, vocab_size: int, tables: dict):
        self.learned = learned
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.tables = tables  # cache for frozen random tables: key -> tensor

    def run(self, e: ast.Expr, ctx: Context, site: str, build: bool = False) -> LT:
        self._site, self._count, self._build = site, 0, build
        return self._eval(e, ctx)

    # ------------------------------------------------------------------ core
    def _static(self, e: ast.Expr, ctx: Context):
        try:
            return evaluate(e, StaticEnv(values=ctx.values, pairs=ctx.pairs, n=ctx.n))
        except EvalIssue as issue:
            raise CompileError(str(issue), hint=issue.hint) from None

    def _eval(self, e: ast.Expr, ctx: Context) -> LT:
        static = self._static(e, ctx) if not self._has_site(e) else DYNAMIC
        if static is not DYNAMIC:
            if isinstance(static, (GroupSpec, str, list)) or static is None:
                raise CompileError(f"expected a number, got {static!r}")
            return lift(static, ctx.device)
        k = e.kind
        if k == "name":
            return self._name(e, ctx)
        if k == "unary":
            v = self._eval(e.operand, ctx)
            return LT(-v.t, v.axes)
        if k == "binary":
            a, b = self._eval(e.left, ctx), self._eval(e.right, ctx)
            axes = _union(a.axes, b.axes)
            ta, tb = a.align(axes), b.align(axes)
            ta, tb = _common_dtype(ta, tb)
            op = e.op
            t = ta + tb if op == "+" else ta - tb if op == "-" else ta * tb if op == "*" else ta / tb if op == "/" \
                else torch.pow(ta, tb)
            return LT(t, axes)
        if k == "call":
            return self._call(e, ctx)
        raise CompileError(f"cannot evaluate {to_text(e)} at run time")

    def _has_site(self, e: ast.Expr) -> bool:
        """Whether e contains a learned call site (which must be visited to keep site numbering stable)."""
        from pedsl.lang.exprs import calls_in

        return bool(calls_in(e) & {"linear", "embedding", "shortconv"})

    def _name(self, e: ast.Name, ctx: Context) -> LT:
        if e.id == "position":
            return LT(torch.arange(ctx.L, dtype=F64, device=ctx.device), ("pos",))
        if e.id == "distance":
            return LT(torch.arange(ctx.L, dtype=F64, device=ctx.device), ("dist",))
        if e.id == "n":
            return lift(float(ctx.n if ctx.n is not None else ctx.L), ctx.device)
        raise CompileError(f"'{e.id}' cannot be used as a number here")

    # ------------------------------------------------------------------ builtins
    def _call(self, e: ast.Call, ctx: Context) -> LT:
        spec = FUNCTIONS[e.func]
        args = bind_args(e, spec.params)
        f = e.func
        if f in _ELEMENTWISE:
            v = self._eval(args["x"], ctx)
            return LT(_ELEMENTWISE[f](v.t), v.axes)
        if f in ("min", "max", "clamp", "ramp"):
            names = ("a", "b") if f in ("min", "max") else ("x", "lo", "hi")
            vals = [self._eval(args[n], ctx) for n in names]
            axes = _union(*[v.axes for v in vals])
            ts = [v.align(axes) for v in vals]
            if f == "min":
                return LT(torch.minimum(*_common_dtype(*ts)), axes)
            if f == "max":
                return LT(torch.maximum(*_common_dtype(*ts)), axes)
            x, lo, hi = _common_dtype(*ts)
            if f == "clamp":
                return LT(torch.minimum(torch.maximum(x, lo), hi), axes)
            return LT(((x - lo) / (hi - lo)).clamp(0, 1), axes)
        if f == "log_length":
            length = float(self._static(args["length"], ctx))
            i = torch.arange(ctx.L, dtype=F64, device=ctx.device)
            return LT(torch.clamp(torch.log(i + 1) / math.log(length), min=1.0), ("pos",))
        if f == "frozen_random":
            return self._frozen_random(args, ctx)
        if f == "embedding":
            return self._embedding(args, ctx)
        if f == "linear":
            return self._linear(args, ctx)
        if f == "shortconv":
            return self._shortconv(args, ctx)
        if f == "normalize":
            v = self._eval(args["v"], ctx)
            return LT(F.normalize(v.t, dim=v.axes.index("chan"), eps=1e-6), v.axes)
        raise CompileError(f"{f}() has no run-time value here")

    def _axis_of(self, arg, ctx: Context) -> str:
        name = arg.id if isinstance(arg, ast.Name) else str(arg)
        return {"channel": "chan"}.get(name, name)

    def _width(self, axis: str, ctx: Context) -> int:
        if axis == "pair":
            if ctx.pairs is None:
                raise CompileError("a per-pair value is only defined inside a rotation")
            return ctx.pairs
        if axis == "chan":
            return ctx.chans
        return 1

    def _next_site(self, kind: str) -> str:
        key = f"{self._site}__{kind}{self._count}"
        self._count += 1
        return key

    def _frozen_random(self, args, ctx: Context) -> LT:
        seed = int(self._static(args["seed"], ctx)) if not isinstance(args["seed"], int) else args["seed"]
        index = args["index"]
        P = ctx.pairs
        if isinstance(index, ast.Name) and index.id == "token":
            key = ("token", seed, P, self.vocab_size)
            if key not in self.tables:
                g = torch.Generator().manual_seed(seed)
                self.tables[key] = torch.randn(self.vocab_size, P, generator=g, dtype=F64)
            table = self.tables[key].to(ctx.device)
            if ctx.tokens is None:
                raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
            return LT(table[ctx.tokens.long()], ("batch", "pos", "pair"))
        # per position: generated in chunks of 1024 positions so any prefix is stable
        chunk = 1024
        parts = []
        for c in range(0, max(ctx.L, 1), chunk):
            key = ("position", seed, P, c)
            if key not in self.tables:
                g = torch.Generator().manual_seed(seed * 1_000_003 + c // chunk)
                self.tables[key] = torch.randn(chunk, P, generator=g, dtype=F64)
            parts.append(self.tables[key])
        table = torch.cat(parts)[: ctx.L].to(ctx.device)
        return LT(table, ("pos", "pair"))

    def _embedding(self, args, ctx: Context) -> LT:
        axis = self._axis_of(args["to"], ctx)
        width = self._width(axis, ctx)
        site = self._next_site("embedding")
        if self._build:
            init = float(self._static(args["init"], ctx)) if not isinstance(args["init"], float) else args["init"]
            emb = nn.Embedding(self.vocab_size, ctx.heads * width)
            nn.init.normal_(emb.weight, std=init)
            self.learned.sites[site] = emb
        if ctx.tokens is None:
            raise CompileError("this scheme reads the tokens: pass tokens=(B, L)")
        out = self.learned.sites[site](ctx.tokens.long())  # (B, L, H*W)
        B, L = ctx.tokens.shape
        out = out.view(B, L, ctx.heads, width).transpose(1, 2)  # (B, H, L, W)
        axes = ("batch", "head", "pos") + ((axis,) if axis != "head" else ())
        return LT(out if axis != "head" else out[..., 0], axes)

    def _linear(self, args, ctx: Context) -> LT:
        axis = self._axis_of(args["to"], ctx)
        width = self._width(axis, ctx)
        site = self._next_site("linear")
        if self._build:
            if self.d_model is None:
                raise CompileError("this scheme reads the hidden state x: give d_model when compiling it",
                                   hint="compile_scheme(..., d_model=...)")
            rank = int(self._static(args["rank"], ctx)) if not isinstance(args["rank"], int) else args["rank"]
            bias0 = args["init_bias"]
            bias0 = float(self._static(bias0, ctx)) if not isinstance(bias0, (int, float)) else float(bias0)
            out_f = ctx.heads * width
            if rank and rank > 0:
                lin = nn.Sequential(nn.Linear(self.d_model, rank, bias=False), nn.Linear(rank, out_f))
                last = lin[1]
            else:
                lin = nn.Linear(self.d_model, out_f)
                last = lin
            nn.init.constant_(last.bias, bias0)
            self.learned.sites[site] = lin
        if ctx.x is None:
            raise CompileError("this scheme reads the hidden state: pass x=(B, L, d_model)")
        out = self.learned.sites[site](ctx.x)  # (B, L, H*W)
        B, L = ctx.x.shape[:2]
        out = out.view(B, L, ctx.heads, width).transpose(1, 2)
        axes = ("batch", "head", "pos") + ((axis,) if axis != "head" else ())
        return LT(out if axis != "head" else out[..., 0], axes)

    def _shortconv(self, args, ctx: Context) -> LT:
        v = self._eval(args["v"], ctx)
        site = self._next_site("shortconv")
        width = args["width"]
        width = int(self._static(width, ctx)) if not isinstance(width, int) else width
        axes = _union(v.axes, ("batch", "head", "pos"))
        t = v.align(axes)  # (B|1, H|1, L, W?)
        t = t.movedim(axes.index("pos"), -1)  # (..., L)
        lead = t.shape[:-1]
        feats = int(torch.tensor(lead[1:]).prod().item()) if len(lead) > 1 else 1
        if self._build:
            conv = nn.Conv1d(feats, feats, width, groups=feats, padding=width - 1, bias=False)
            with torch.no_grad():  # start near the identity: the newest token dominates
                conv.weight.normal_(0, 0.1)
                conv.weight[..., -1] += 1.0
            self.learned.sites[site] = conv
        conv = self.learned.sites[site]
        L = t.shape[-1]
        flat = t.reshape(lead[0], feats, L).to(conv.weight.dtype)
        out = conv(flat)[..., :L].reshape(*lead, L).movedim(-1, axes.index("pos"))
        return LT(out, axes)


_ELEMENTWISE = {
    "log": torch.log,
    "exp": torch.exp,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
    "log_sigmoid": F.logsigmoid,
}


def _common_dtype(*ts: Tensor) -> list[Tensor]:
    """Static tables are float64; data-dependent values keep their (lower) precision."""
    dts = {t.dtype for t in ts}
    if len(dts) == 1:
        return list(ts)
    low = [d for d in dts if d != F64]
    target = low[0] if low and any(t.requires_grad for t in ts) else torch.promote_types(*dts) if len(dts) == 2 else F64
    return [t.to(target) for t in ts]


def to_text(e: ast.Expr) -> str:
    from pedsl.lang.exprs import to_source

    return to_source(e)
