"""SchemeAttention's side of the general forward (:mod:`pedsl.compiler.general`): the per-token values
its evaluator computes over a window (phases, static RoPE tables, step angles, Householder steps,
slopes, gates, the temperature, distance tables), and pedsl's fused kernels as the primitives."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from pedsl.compiler import plan as PL
from pedsl.compiler.general import (AXIS_BIAS, F64, GATE_BIAS, LINEAR_BIAS, QUERY_BIAS, TABLE_BIAS, TWO_PI, TokenValues,
                                    TorchKernels, Window, angle_dtype)
from pedsl.compiler.kernel_support import static_kernels
from pedsl.compiler.shapes import as_bhl, as_bhlp, as_hd, per_head
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.fold import bind_args
from pedsl.lang.typed import node_types
from pedsl.ops import rotary
from pedsl.ops.accumulate import cumulative_angles
from pedsl.ops.band_kernel import band_attention, bias_kernel_ready, causal_bias_attention
from pedsl.ops.distance_bias import distance_bias_attention, distance_bias_supported
from pedsl.ops.mlp_kernel import mlp_attention
from pedsl.ops.path import path_attention, path_attention_local, path_transported_keys
from pedsl.runtime.walk import learned_calls

if TYPE_CHECKING:  # annotations only
    from pedsl.compiler.general.protocols import Kernels, SchemeSide

TABLE_MAX = 1 << 20  # static phase tables up to this many positions; beyond, phases are evaluated per call


class FusedKernels:
    """The general forward's primitives as pedsl's kernels: rotations with fused autograd in the
    scheme's layout, the two-level float64 angle sum, the blockwise PaTH kernel, the Toeplitz kernel of
    distance-table biases (:mod:`pedsl.ops.distance_bias`), the C++ causal kernel with ALiBi's, a forget gate's or a
    distance table's bias in its rows (:mod:`pedsl.ops.band_kernel`), FIRE's MLP-bias kernel (:mod:`pedsl.ops.mlp_kernel`:
    C++ where it runs, :mod:`pedsl.ops.mlp_bias` elsewhere)."""

    path_attention = staticmethod(path_attention)
    path_local_attention = staticmethod(path_attention_local)
    path_transported_keys = staticmethod(path_transported_keys)
    distance_attention = staticmethod(distance_bias_attention)
    distance_supported = staticmethod(distance_bias_supported)
    mlp_attention = staticmethod(mlp_attention)
    band_attention = staticmethod(band_attention)  # the C++ sliding-window kernel
    bias_attention = staticmethod(causal_bias_attention)  # the C++ causal kernel with biases in its rows
    bias_ready = staticmethod(bias_kernel_ready)

    def __init__(self, layout: str):
        self.layout = layout

    def rotate(self, x, cos, sin, t, channels):
        return rotary.apply_rotary_channels(x, cos, sin, channels, self.layout)

    def rotate_by_angles(self, xs, angles, t, channels):
        return rotary.rotate_many_by_angles(xs, angles, self.layout, channels)

    @staticmethod
    def cumulative_angles(a):
        return cumulative_angles(a, reduce=False)


class ModuleScheme:  # a general.protocols.SchemeSide (checked by _as_scheme_side below)
    """What the general forward reads of a :class:`~pedsl.compiler.module.SchemeAttention` (made once per
    module: ``of(mod)``)."""

    def __init__(self, mod):
        self.mod = mod
        self.heads, self.head_dim = mod.heads, mod.head_dim
        self.axes = mod.scheme.axes
        self.conv_history = mod._conv_history
        # RoPE folded from constant steps runs as the steps: the general forward's calls count tokens (§2b)
        self.transforms = tuple(t.as_steps() for t in mod.transforms)
        self.kernels = FusedKernels(mod.layout)
        # the statements' values (the window, the normaliser ...: pedsl.lang.statements.CARRIED), by their names
        self.__dict__.update(PL.carried_values(mod.plan))
        self.fast_paths = mod.plan.kernels  # the fast kernels the plan's features allow (kernel_support)
        self.cope_max_pos = None if mod.plan.contextual is None else mod.plan.contextual.max_pos
        self.remap = mod.plan.remap
        r = mod.plan.relative
        self.relative = None if r is None else (r.kind, r.max_distance, r.dim, r.buckets, r.c2p, r.p2c)
        self.remap_bounds = () if self.remap is None else tuple((r.low, r.high) for r in self.remap.regimes)
        self.remap_chunk = None if self.remap is None else self.remap.chunk

    # the learned sink's parameters (read on use: they follow the module's device and dtype)
    sink_logit = property(lambda self: self.mod.sink_logit)
    sink_key = property(lambda self: self.mod.sink_key)
    sink_value = property(lambda self: self.mod.sink_value)
    contextual_embedding = property(lambda self: self.mod.contextual_embedding)
    differential_lambda = property(lambda self: self.mod.differential_lambda)
    relative_keys = property(lambda self: self.mod.relative_keys)
    relative_queries = property(lambda self: self.mod.relative_queries)
    relative_u = property(lambda self: self.mod.relative_u)
    relative_v = property(lambda self: self.mod.relative_v)
    dense = property(lambda self: self.mod.dense)

    def __getattr__(self, name: str) -> Any:
        """Only for the checker: the carried values are attributes (set above); anything else is missing."""
        raise AttributeError(f"'ModuleScheme' object has no attribute {name!r}")

    @staticmethod
    def of(mod) -> "ModuleScheme":
        side = mod.__dict__.get("_general_side")
        if side is None:
            side = mod.__dict__["_general_side"] = ModuleScheme(mod)
        return side

    @staticmethod
    def unbanded(mod) -> "ModuleScheme":
        """The module's scheme without its window or chunk: for calls whose mask carries the band already
        (``band=False``), where the mask's band, not ``p // chunk`` of the positions, is the truth."""
        side = mod.__dict__.get("_general_side_unbanded")
        if side is None:
            side = mod.__dict__["_general_side_unbanded"] = copy.copy(ModuleScheme.of(mod))
            side.__dict__.update(window=None, chunk=None)  # carried values: attributes by name (see __init__)
            side.fast_paths = static_kernels(dataclasses.replace(mod.plan, window=None, chunk=None))
        return side

    def ctx(self, win: Window, dtype, group=None):
        p = win.parts
        c = self.mod._ctx(win.Lw, p["x"], p["tokens"], win.device, dtype, group=group)
        c.n = win.n
        c.positions = p["positions"]
        c.axes_pos = p["axes_pos"]
        if win.segmented:
            c.docs, c.valid = p["docs"], p["valid"]
        return c

    def token_values(self, win: Window, dtype) -> TokenValues:
        mod = self.mod
        run = mod.evaluator.run
        out: list[Tensor | tuple[Tensor, Tensor] | None] = []  # per transport: its values, (cos, sin), (w, beta); dense: None
        for t in self.transforms:
            P = len(t.channels) // 2
            if t.static_table and win.n <= TABLE_MAX and win.parts["axes_pos"] is None:
                # a static phase table (float64 phase mod 2 pi, then cos/sin; grown on demand) read at the positions
                # (a call with several position axes evaluates its phases per token instead)
                cos, sin = mod.rope_tables(t, win.n, win.device, angle_dtype(dtype))  # rotate's scale included
                pos = win.parts["positions"][:, win.Lw - win.L:].clamp(0, cos.shape[0] - 1)  # padding: any position
                out.append((cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)))  # (B, 1, L, P)
            elif t.kind == PL.DENSE:  # its rotations come from its generators and the positions (general.dense)
                out.append(None)
            elif t.kind in (PL.ROPE, PL.SO2):
                out.append(as_bhlp(run(t.expr, self.ctx(win, dtype, t), t.site), win.Lw, P))
            else:
                ctx = self.ctx(win, dtype, t)
                wt, bt = (run(s.expr, ctx, s.name) for s in t.sites)
                out.append((wt.align(("batch", "head", "pos", "chan")), as_bhl(bt, win.Lw, mod.heads)))
        return TokenValues(out, [self._bias(b, win, dtype) for b in mod.biases], self._tau(win, dtype))

    def _bias(self, b, win: Window, dtype):
        mod = self.mod
        if b.kind == PL.TABLE_BIAS:
            return (QUERY_BIAS if b.query else TABLE_BIAS), None
        if b.kind == PL.AXIS_BIAS:
            return AXIS_BIAS, None
        if b.log_gate is None and b.kind == PL.LINEAR_BIAS:
            return LINEAR_BIAS, per_head(mod.evaluator.run(b.slope, self.ctx(win, dtype), b.site.name), mod.heads)
        return GATE_BIAS, as_bhl(mod.evaluator.run(b.log_gate, self.ctx(win, dtype), b.site.name), win.Lw, mod.heads)

    def _tau(self, win: Window, dtype) -> Tensor | None:
        tau = self.mod.temperature
        if tau is None:
            return None
        v = self.mod.evaluator.run(tau.site.expr, self.ctx(win, dtype), tau.site.name)
        return (v.align(("batch", "head", "pos")) if v.axes else v.t.reshape(1, 1, 1)).to(F64)

    def remap_rotate(self, x: Tensor, positions: Tensor, regime: int, role: str, n: int) -> Tensor:
        """``x (B, H, L, D)`` rotated at regime ``regime``'s ``query`` or ``key`` (``role``) positions of the
        tokens at ``positions (B, L)`` (docs/semantics.md §2d): the position expression, then every rotation's
        phase at those (possibly fractional) positions in float64, reduced mod 2 pi, with rotate's scale."""
        mod, (B, L) = self.mod, positions.shape
        r = self.remap.regimes[regime]
        ctx = mod._ctx(L, device=x.device, dtype=F64)
        ctx.positions, ctx.n = positions, n
        at = mod.evaluator.run(r.query if role == "query" else r.key, ctx, f"remap[{regime}]")
        at = (at.align(("batch", "pos")) if at.axes else at.t.reshape(1, 1)).to(F64).expand(B, L)
        adt = angle_dtype(x.dtype)
        for t in mod.transforms:  # rotations of q and k only (checked: pedsl.lang.remap)
            c = mod._ctx(L, device=x.device, dtype=F64, group=t)
            c.positions, c.n = at, n
            ph = torch.remainder(as_bhlp(mod.evaluator.run(t.expr, c, t.site), L, len(t.channels) // 2).to(F64),
                                 TWO_PI)
            ch = t.channels if len(t.channels) != self.head_dim else None
            x = self.kernels.rotate(x, (t.scale * torch.cos(ph)).to(adt), (t.scale * torch.sin(ph)).to(adt), t, ch)
        return x

    def query_table(self, i: int, qpos: Tensor, size: int, device, n_run: int | None = None) -> Tensor:
        """Bias i (it reads query_position) at the queries' positions qpos (B, rows) over distances
        0..size-1: (B|1, H, rows, size) float64; ``n`` reads the call's run-time length ``n_run`` (not the
        block's ``size``), so that every block sees the same ``n``."""
        mod = self.mod
        b = mod.biases[i]
        ctx = mod._ctx(size, device=device)
        ctx.positions = qpos
        if n_run is not None:
            ctx.n = n_run
        term = mod.evaluator.run(b.site.expr, ctx, b.site.name)
        t = term.align(("batch", "head", "pos", "dist")).to(F64)
        return t.expand(t.shape[0], mod.heads, qpos.shape[1], size)

    def axis_table(self, i: int, dist: Tensor, qpos: Tensor) -> Tensor:
        """Bias i (over per-axis distances) at a block of (query, key) pairs: ``dist (B, rows, keys, A)`` their
        signed distances i_a - j_a, ``qpos (B, rows)`` the queries' positions; (B|1, H, rows, keys) float64."""
        return self.mod.axis_bias(self.mod.biases[i], dist, qpos)

    def query_mlp(self, i: int, qpos: Tensor, device):
        """Bias i as ``mlp(u(distance) * w(query_position))`` with one hidden ReLU layer (FIRE): u over the
        distances 0 .. L-1, w at the queries' positions ``qpos (L,)`` (float64), and the MLP's W1 (K,), b1,
        W2 (H, K), b2, all differentiable, for :func:`pedsl.ops.mlp_kernel.mlp_attention`; None for any
        other bias (it keeps the blocks of queries)."""
        mod = self.mod
        b = mod.biases[i]
        cache = self.__dict__.setdefault("_factors", {})
        if i not in cache:
            cache[i] = separable_mlp(b.site.expr, mod.values, b.site.name)
        f = cache[i]
        if f is None:
            return None
        L = qpos.shape[0]
        ctx = mod._ctx(L, device=device)
        u = mod.evaluator.run(b.site.expr, ctx, b.site.name, part=f.dist).align(("dist",)).to(F64).expand(L)
        ctx.positions = qpos[None]
        w = mod.evaluator.run(b.site.expr, ctx, b.site.name, part=f.query).align(("batch", "pos")).to(F64)[0].expand(L)
        u, w = (1.0 / u if f.invert == "dist" else u), (1.0 / w if f.invert == "query" else w)
        net = mod.learned.sites[f.key]
        return u, w, net[0].weight[:, 0], net[0].bias, net[2].weight, net[2].bias

    def distance_table(self, i: int, size: int, device) -> Tensor:
        mod = self.mod
        b = mod.biases[i]
        term = mod.evaluator.run(b.site.expr, mod._ctx(size, device=device), b.site.name)
        return as_hd(term, size, mod.heads).to(F64)



def _as_scheme_side(side: ModuleScheme) -> SchemeSide:
    """For mypy: the adapter supplies every attribute the general forward reads (general.protocols.SchemeSide)."""
    return side


def _as_kernels(kernels: FusedKernels) -> Kernels:
    """For mypy: pedsl's kernels supply every member the general forward reads (general.protocols.Kernels)."""
    return kernels


def _torch_kernels_class() -> Kernels:
    """For mypy: TorchKernels too, as a generated module passes it (the class itself)."""
    return TorchKernels


class SeparableMlp(NamedTuple):
    """A bias ``mlp(features, depth = 1, relu = true)`` whose features are a product (or quotient) of a term
    over the distance and a term over the query position: those terms, which one divides, the MLP's key."""

    key: str  # the MLP's entry in learned.sites
    dist: ast.Expr
    query: ast.Expr
    invert: str | None  # "dist" or "query": the features divide by that term


def separable_mlp(expr: ast.Expr, values, site: str) -> SeparableMlp | None:
    """FIRE's form of a bias, or None. Exact about what it accepts: the bias is the MLP itself (one hidden
    layer, ReLU: piecewise linear in its one input), its input ``a * b`` or ``a / b`` with one factor over the
    distance only and the other over the query position only, neither reading the data nor the run-time
    length."""
    if not (isinstance(expr, ast.Call) and expr.func == "mlp"):
        return None
    args = bind_args(expr, FUNCTIONS["mlp"].params)
    depth, relu, feats = args["depth"], args["relu"], args["features"]
    depth = depth.value if isinstance(depth, ast.Num) else depth
    relu = relu.value if isinstance(relu, ast.Bool) else relu
    if depth != 1 or relu is not True or not (isinstance(feats, ast.Binary) and feats.op in ("*", "/")):
        return None
    types = node_types(expr, values)
    kinds = []
    for side in (feats.left, feats.right):
        ty = types[id(side)]
        if ty.data or ty.runtime or not ty.axes or len(ty.axes) != 1 or next(iter(ty.axes)) not in ("dist", "pos"):
            return None
        kinds.append(next(iter(ty.axes)))
    if sorted(kinds) != ["dist", "pos"]:
        return None
    dist, query = (feats.left, feats.right) if kinds[0] == "dist" else (feats.right, feats.left)
    invert = None if feats.op == "*" else ("dist" if feats.right is dist else "query")
    key = dict((id(call), k) for call, k in learned_calls(expr, site))[id(expr)]
    return SeparableMlp(key, dist, query, invert)
