"""Run-time evaluation of `.pe` expressions as torch tensors with named axes.

A value is an :class:`LT` (labelled tensor): a tensor whose dimensions are the
axes it varies along, in the canonical order ``batch, head, pos, dist, pair,
chan``. Arithmetic aligns operands by axis name, so ``w * position`` is the
outer product ``(L, P)`` and ``-slopes(heads) * distance`` is ``(H, L)``.

The walk over an expression (folding static sub-expressions - frequency grids,
slopes, constants - in float64 through :mod:`pedsl.lang.fold`, dispatch, call
site names) is :class:`pedsl.runtime.walk.DynamicEvaluator`, shared with the numpy
sampler of ``pedsl diff --numeric``; this module gives it torch operations (``TORCH_OPS``, the
array namespace the builtin records of :mod:`pedsl.lang.builtin_defs` run over), the frozen random
tables, and the learned layers a source's call site asks for (``dense``, ``lookup``,
``causal_conv``): trainable parameters in :class:`Learned`, created once per call site when the
module is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pedsl.errors import CompileError
from pedsl.lang.builtin_defs.arrays import Ops
from pedsl.runtime.walk import DynamicEvaluator, permuted_shape
from pedsl.lang.fold import Vec

F64 = torch.float64
# the torch array namespace of the builtin records' run-time values (numpy's: builtin_defs.arrays)
TORCH_OPS = Ops(log=torch.log, exp=torch.exp, sqrt=torch.sqrt, sin=torch.sin, cos=torch.cos, tanh=torch.tanh,
                abs=torch.abs, sigmoid=torch.sigmoid, log_sigmoid=F.logsigmoid, erf=torch.erf, floor=torch.floor, ceil=torch.ceil,
                minimum=torch.minimum, maximum=torch.maximum, norm=lambda x: x.norm(2, -1, keepdim=True),
                moveaxis=torch.movedim, concat=torch.cat, rows=lambda table, idx: table.to(idx.device)[idx.long()])


@dataclass
class LT:
    t: Tensor
    axes: tuple[str, ...]

    def align(self, axes: tuple[str, ...]) -> Tensor:
        """View of t with a dimension (size 1 where absent) for every axis in ``axes``."""
        perm, shape = permuted_shape(self.axes, self.t.shape, axes)
        return (self.t if perm == sorted(perm) else self.t.permute(perm)).reshape(shape)


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
    # the run-time layout of the tokens (None: one document at positions 0..L-1, no padding):
    positions: Tensor | None = None  # (B, L) integer positions read by `position`, log_length, frozen_random
    docs: Tensor | None = None  # (B, L) document ids: shortconv taps do not cross a boundary
    valid: Tensor | None = None  # (B, L) bool, False for padding: shortconv reads zeros there
    axes: tuple[str, ...] = ()  # the scheme's declared position axes (`axes t, h, w`)
    axes_pos: Tensor | None = None  # (B, L, A) per-axis positions read by position.AXIS (None: each = positions)
    # (B, rows, keys, A) signed per-axis distances i_a - j_a of a block of (query, key) pairs, read by distance.AXIS
    # (None: a table over the one-axis distance)
    axis_dist: Tensor | None = None


_M = TypeVar("_M", bound=nn.Module)


class Learned(nn.Module):
    """The trainable parameters of every learned call site of a scheme, by site key."""

    def __init__(self) -> None:
        super().__init__()
        self.sites = nn.ModuleDict()

    def site(self, key: str, kind: type[_M]) -> _M:
        """The module at a site: of the kind the walk built there for its builtin."""
        module = self.sites[key]
        assert isinstance(module, kind), f"learned site {key} holds a {type(module).__name__}, not a {kind.__name__}"
        return module


class LearnedValue(nn.Module):
    """The parameter of one ``learned(init)`` call: ``value`` over the call's axes (head, pair), in the
    module's parameter dtype; the walk reads it in float64."""

    def __init__(self, start: Tensor) -> None:
        super().__init__()
        self.value = nn.Parameter(start.to(torch.get_default_dtype()))


def mlp_layers(hidden: int, depth: int, n_out: int, relu: bool = False) -> nn.Sequential:
    """mlp()'s layers: Linear(1, hidden), SiLU, (depth - 1) x [Linear(hidden, hidden), SiLU], Linear(hidden, n_out)
    (x-transformers' DynamicPositionBias without its optional norm; its ``mlp.{k}.0`` is layer ``2 k`` here and
    its last ``mlp.{depth}`` is layer ``2 depth``)."""
    act = nn.ReLU if relu else nn.SiLU
    layers: list[nn.Module] = [nn.Linear(1, hidden), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), act()]
    return nn.Sequential(*layers, nn.Linear(hidden, n_out))


class Evaluator(DynamicEvaluator):
    """Evaluates run-time expressions as torch tensors; ``build=True`` creates the learned call
    sites instead of reading them (the walk itself is :class:`pedsl.runtime.walk.DynamicEvaluator`)."""

    def __init__(self, learned: Learned, d_model: int | None, vocab_size: int, tables: dict):
        self.learned = learned
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.tables = tables  # cache for frozen random tables: key -> tensor
        self._build = False
        # static sub-expressions folded in eager calls (the module folds them all when it is built),
        # found by node identity, pair count and device: under torch.compile the trace then reads a
        # float64 constant instead of re-running pedsl.lang.fold on symbolic Python floats, which
        # made dynamo restart its analysis (acc_learned_qk: 2.3 s of a 6 s cached compile). The values
        # sit in a list in build order, so the traced graph names them by position, the same in every
        # process (an id() in the name made the AOT autograd cache key differ per process).
        self._fold_index: dict[tuple, int] = {}
        self._fold_values: list[tuple] = []  # (node, LT); the node kept alive so its id stays unique

    def run(self, e, ctx: Context, site: str, part=None, *, build: bool = False) -> LT:
        self._build = build
        return super().run(e, ctx, site, part)

    # ------------------------------------------------------------------ folding
    @staticmethod
    def _fold_key(e, ctx: Context) -> tuple:
        return id(e), ctx.pairs, "cpu" if ctx.device is None else str(ctx.device)

    def folded(self, e, ctx: Context) -> LT | None:
        i = self._fold_index.get(self._fold_key(e, ctx))
        return None if i is None else self._fold_values[i][1]

    def remember(self, e, ctx: Context, value: LT) -> None:
        if torch.compiler.is_compiling() or self._types[id(e)].runtime:
            return  # never cache a traced value, nor one of the run-time length n (it varies)
        self._fold_index[self._fold_key(e, ctx)] = len(self._fold_values)
        self._fold_values.append((e, value))

    # ------------------------------------------------------------------ arithmetic
    def constant(self, value, ctx: Context) -> LT:  # static values enter in float64
        if isinstance(value, Vec):
            return LT(torch.tensor(value.values, dtype=F64, device=ctx.device), (value.axis,))
        return LT(torch.tensor(float(value), dtype=F64, device=ctx.device), ())

    def arange(self, ctx: Context, axis: str) -> LT:
        if axis == "pos" and ctx.positions is not None:
            return LT(ctx.positions.to(F64), ("batch", "pos"))
        return LT(torch.arange(ctx.L, dtype=F64, device=ctx.device), (axis,))

    def axis_position(self, ctx: Context, axis: str) -> LT:
        if ctx.axes_pos is not None:
            return LT(ctx.axes_pos[..., ctx.axes.index(axis)].to(F64), ("batch", "pos"))
        return self.arange(ctx, "pos")

    def axis_distance(self, ctx: Context, axis: str) -> LT:
        if ctx.axis_dist is not None:
            return LT(ctx.axis_dist[..., ctx.axes.index(axis)].to(F64), ("batch", "pos", "dist"))
        return self.arange(ctx, "dist")

    ops = TORCH_OPS

    def wrap(self, t: Tensor, axes: tuple[str, ...]) -> LT:
        return LT(t, axes)

    def aligned(self, values: list[LT], axes: tuple[str, ...]) -> list[Tensor]:
        return _common_dtype(*[v.align(axes) for v in values])

    # ------------------------------------------------------------------ frozen tables and learned sites
    def frozen(self, key: tuple, shape: tuple[int, int], seed: tuple[int, ...]) -> Tensor:
        if key not in self.tables:
            g = torch.Generator().manual_seed(seed[0] if len(seed) == 1 else seed[0] * 1_000_003 + seed[1])
            self.tables[key] = torch.randn(*shape, generator=g, dtype=F64)
        return self.tables[key]

    def lookup(self, site: str, tokens: Tensor, n_out: int, std: float) -> Tensor:
        if self._build:
            emb = nn.Embedding(self.vocab_size, n_out)
            nn.init.normal_(emb.weight, std=std)
            self.learned.sites[site] = emb
        return self.learned.sites[site](tokens.long())

    def dense(self, site: str, n_out: int, rank: int, init_bias: float, ctx: Context) -> Tensor:
        if self._build:
            if self.d_model is None:
                raise CompileError("this scheme reads the hidden state x: give d_model when compiling it",
                                   hint="compile_scheme(..., d_model=...)")
            lin: nn.Module
            if rank > 0:
                features = nn.Linear(self.d_model, rank, bias=False)  # made first: the generator's draws in order
                last = nn.Linear(rank, n_out)
                lin = nn.Sequential(features, last)
            else:
                lin = last = nn.Linear(self.d_model, n_out)
            nn.init.constant_(last.bias, init_bias)
            self.learned.sites[site] = lin
        if ctx.x is None:
            raise CompileError("this scheme reads the hidden state: pass x=(B, L, d_model)")
        return self.learned.sites[site](ctx.x)

    def parameter(self, site: str, start: Tensor, shape: tuple[int, ...]) -> Tensor:
        if self._build:
            self.learned.sites[site] = LearnedValue(start.detach().cpu().expand(shape).clone())
        value = self.learned.site(site, LearnedValue).value
        return value.to(F64)

    def indexed(self, site: str, index: Tensor, rows: int, n_out: int, std: float) -> Tensor:
        if self._build:
            emb = nn.Embedding(rows, n_out)
            nn.init.normal_(emb.weight, std=std)
            self.learned.sites[site] = emb
        weight = self.learned.site(site, nn.Embedding).weight
        return weight.to(F64)[index.long().to(weight.device)]

    def mlp(self, site: str, features: Tensor, hidden: int, depth: int, n_out: int, relu: bool = False) -> Tensor:
        if self._build:
            self.learned.sites[site] = mlp_layers(hidden, depth, n_out, relu)
        net = self.learned.site(site, nn.Sequential)
        return net(features.to(next(net.parameters()).dtype)).to(F64)  # the first Linear's weight's dtype

    def causal_conv(self, site: str, flat: Tensor, width: int, ctx: Context) -> Tensor:
        feats = flat.shape[1]
        if self._build:
            conv = nn.Conv1d(feats, feats, width, groups=feats, padding=width - 1, bias=False)
            with torch.no_grad():  # start near the identity: the newest token dominates
                conv.weight.normal_(0, 0.1)
                conv.weight[..., -1] += 1.0
            self.learned.sites[site] = conv
        conv = self.learned.site(site, nn.Conv1d)
        L = flat.shape[-1]
        flat = flat.to(conv.weight.dtype)
        if ctx.docs is None and ctx.valid is None and flat.dtype != F64:
            return conv(flat)[..., :L]
        return _segmented_conv(flat, conv.weight, ctx.docs, ctx.valid)


def _segmented_conv(flat: Tensor, weight: Tensor, docs: Tensor | None, valid: Tensor | None) -> Tensor:
    """The causal depthwise convolution as a sum of shifted taps (also the float64 path: torch's
    float64 depthwise conv1d on CPU is ~100x slower), with taps that stay inside the token's document and read
    zeros at padding: ``out_t = sum_s weight[W-1-s] * in_{t-s} [doc(t-s) = doc(t), valid(t-s)]``.

    ``flat (B|1, F, L)``, ``weight (F, 1, W)``, docs / valid ``(B, L)``."""
    W, L = weight.shape[-1], flat.shape[-1]
    B = docs.shape[0] if docs is not None else valid.shape[0] if valid is not None else flat.shape[0]
    flat = flat.expand(B, *flat.shape[1:])
    out = None
    for s in range(min(W, L)):
        src = F.pad(flat, (s, 0))[..., :L]  # in_{t-s}, zeros before the start
        keep = torch.ones(B, L, dtype=torch.bool, device=flat.device)
        if s:
            keep[:, :s] = False
        if docs is not None and s:
            keep[:, s:] &= docs[:, s:] == docs[:, :-s]
        if valid is not None:
            keep &= F.pad(valid, (s, 0))[:, :L]
        term = src * keep.unsqueeze(1).to(flat.dtype) * weight[:, 0, W - 1 - s].unsqueeze(-1)
        out = term if out is None else out + term
    assert out is not None  # a kernel has a tap and a sequence a position: the loop ran
    return out


def _common_dtype(*ts: Tensor) -> list[Tensor]:
    """Static tables are float64; data-dependent values keep their (lower) precision."""
    dts = {t.dtype for t in ts}
    if len(dts) == 1:
        return list(ts)
    low = [d for d in dts if d != F64]
    target = low[0] if low and any(t.requires_grad for t in ts) else torch.promote_types(*dts) if len(dts) == 2 else F64
    return [t.to(target) for t in ts]

