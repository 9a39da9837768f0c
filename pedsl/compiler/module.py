"""The compiled attention module: a scheme's graph turned into
``forward(q, k, v, *, x, tokens, positions, document_ids, cache, attn_mask)``.

Shapes: q ``(B, Hq, Lq, D)``, k, v ``(B, Hkv, L, D)``; x ``(B, L, d_model)`` for data-dependent
steps and gates; tokens ``(B, L)`` for token-indexed steps. Returns ``(B, Hq, Lq, D)``. A call with
positions, documents, masks, a cache, fewer key/value heads or fewer queries than keys takes the
general path of :mod:`pedsl.compiler.general`; one full causal sequence takes the fused path below.

The forward pass executes the lowering plan (:mod:`pedsl.compiler.plan`): every transport
step pre-rotates q and k (and v) by absolute angles (RoPE tables, cumulative SO(2)
angles), biases are carried as the plan says (one extra key channel, a materialised table,
a per-step log term), the temperature scales q, then the plan's backend runs causal
attention; value transports are undone on the output. Static tables are non-persistent buffers, grown on demand
for longer inputs; float64 phases are cast at the end (docs/semantics.md §6).
"""

from __future__ import annotations

import math

import networkx as nx
import torch
from torch import Tensor, nn

from pedsl.compiler import plan as P
from pedsl.runtime.torch_backend import Context, Evaluator, Learned
from pedsl.compiler.shapes import as_bhl, as_bhlp, as_hd, as_table, per_head
from pedsl.compiler.general import AttentionCache, InputError, shape_of, visible
from pedsl.compiler.general.relative import relative_call, relative_rows, relative_scale
from pedsl.compiler.general import angle_dtype, xpos_scale
from pedsl.compiler.general.dense import DenseGenerators, dense_rotate
from pedsl.compiler.kernel_support import bias_call, bidirectional_call, fused_call
from pedsl.compiler.module_values import FusedKernels, ModuleScheme
from pedsl.compiler.scores import differential_lambda, modified_scores, normalised, own_key_counts, sink_column
from pedsl.errors import CompileError, ShapeError
from pedsl.lang.scheme import Scheme
from pedsl.ops import rotary
from pedsl.ops.accumulate import cumulative_angles
from pedsl.ops.bias import materialized_bias_attention, scale_queries, separable_bias_attention
from pedsl.ops.path import path_attention
from pedsl.compiler.reference import reference_forward, transported_scores
from pedsl.lang.frequencies import rotary_frequencies

F64 = torch.float64
TABLE0 = 4096  # static cos/sin tables are prebuilt for this many positions (grown on demand)


class SchemeAttention(nn.Module):
    """Causal attention with the positional encoding of one scheme (see module docstring)."""

    def __init__(self, scheme: Scheme, graph: nx.DiGraph, *, d_model: int | None, vocab_size: int = 256):
        super().__init__()
        self.scheme = scheme
        self.graph = graph
        # the forward reads only the plan (frozen records: networkx views are opaque to torch.compile)
        self.plan: P.Plan = graph.graph["plan"]
        self.backend = self.plan.backend
        self.heads, self.head_dim = scheme.heads, scheme.head_dim
        self.layout = scheme.layout
        self.fused = FusedKernels(scheme.layout)  # the Kernels the fused path asks for the C++ bias kernel
        self.d_model = d_model
        self.values = {**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}
        self.learned = Learned()
        self._tables: dict = {}
        self.evaluator = Evaluator(self.learned, d_model, vocab_size, self._tables)
        self.transforms, self.biases, self.temperature = self.plan.transports, self.plan.biases, self.plan.temperature
        self.needs_x = scheme.needs_x
        self.needs_tokens = scheme.needs_tokens
        self._rope_cache: dict[str, tuple[int, Tensor, Tensor]] = {}
        self._build_learned()
        self._build_sink()
        self._build_contextual()
        self._build_relative()
        self._build_differential()
        self._build_dense()
        # how many earlier tokens' inputs a decoding step re-reads (the widest short convolution - 1)
        self._conv_history = max([m.kernel_size[0] - 1 for m in self.learned.modules()
                                  if isinstance(m, nn.Conv1d)], default=0)
        # static RoPE tables up to TABLE0 positions, built now: under torch.compile the first trace
        # then reads a filled cache instead of filling it (which made the second call recompile)
        for t in self.transforms:
            if t.static_table:
                self.rope_tables(t, TABLE0, torch.device("cpu"), torch.float32)

    # ------------------------------------------------------------------ construction
    def _ctx(self, L: int, x=None, tokens=None, device=None, dtype=torch.float32,
             group: P.TransportStep | None = None) -> Context:
        pairs = chans = None
        if group is not None:
            chans = len(group.channels)
            pairs = chans // 2
        return Context(values=self.values, heads=self.heads, pairs=pairs, chans=chans, L=L, n=L, x=x,
                       tokens=tokens, device=device, dtype=dtype, axes=self.scheme.axes)

    def _build_learned(self) -> None:
        """Create every learned call site and fold every static sub-expression once, eagerly, by
        evaluating all expressions on a dummy input of length 2 (a torch.compile trace then reads
        the parameters and the folded float64 constants)."""
        if self.needs_x and self.d_model is None:
            raise CompileError(f"scheme '{self.scheme.name}' reads the hidden state x: give d_model when compiling",
                               code="E405", hint="compile_scheme(..., d_model=<model width>) or --d-model")
        x = torch.zeros(1, 2, self.d_model) if self.needs_x and self.d_model is not None else None  # None: raised
        tokens = torch.zeros(1, 2, dtype=torch.long) if self.needs_tokens else None
        slopes = {b.site.name: b.slope for b in self.biases}  # a linear bias's slope runs under its site too
        for site in self.plan.params:  # in the plan's order: learned parameters are created (and seeded) in it
            group = self.plan.transport(site.group) if site.group is not None else None
            ctx = self._ctx(2) if site.role == "temperature" else self._ctx(2, x, tokens, group=group)
            for expr in (site.expr, slopes.get(site.name)):
                if expr is not None:
                    self.evaluator.run(expr, ctx, site.name, build=True)

    def _build_sink(self) -> None:
        """The learned sink (docs/semantics.md §11): a logit per head (``sink = logit``, zero at first: the
        sink weighs as much as one key of logit 0), or a key and a value per head (``sink = token``); None for
        those it has not (the general forward's SchemeSide has every member)."""
        self.sink_logit = self.sink_key = self.sink_value = None
        if self.plan.sink == "logit":
            self.sink_logit = nn.Parameter(torch.zeros(self.heads))
        elif self.plan.sink == "token":
            self.sink_key = nn.Parameter(torch.randn(self.heads, self.head_dim) * self.head_dim ** -0.5)
            self.sink_value = nn.Parameter(torch.zeros(self.heads, self.head_dim))

    def _build_contextual(self) -> None:
        """CoPE's learned embedding (docs/semantics.md §1c): (max_pos, head_dim) shared by the heads, or
        (heads, max_pos, head_dim); zero at first, as the paper and x-transformers (the term starts at 0)."""
        c = self.plan.contextual
        self.contextual_embedding = None
        if c is not None:
            self.contextual_embedding = nn.Parameter(torch.zeros(*(() if c.shared else (self.heads,)),
                                                                 c.max_pos, self.head_dim))

    def _build_relative(self) -> None:
        """The content-position terms' learned tables (docs/semantics.md §3b), drawn from N(0, 0.02^2) (Hugging
        Face's DeBERTa initializer range, Transformer-XL's init_std); None for those the scheme has not."""
        r = self.plan.relative
        self.relative_keys = self.relative_queries = self.relative_u = self.relative_v = None
        if r is None:
            return
        H, D = self.heads, self.head_dim
        draw = lambda *shape: nn.Parameter(torch.randn(*shape) * 0.02)  # noqa: E731
        if r.kind != "deberta" or r.c2p:
            self.relative_keys = draw(r.rows, D) if r.kind == "shaw" else draw(r.rows, H, D)
        if r.kind == "deberta" and r.p2c:
            self.relative_queries = draw(r.rows, H, D)
        if r.kind == "transformer_xl":
            self.relative_u, self.relative_v = draw(H, D), draw(H, D)

    def _build_differential(self) -> None:
        """Differential attention's learned lambda (docs/semantics.md §1b): rows (q1, k1, q2, k2) of head_dim each,
        drawn from N(0, 0.1^2) as DiffLlama's ``lambda_std_dev`` (zeros would never learn: each row's gradient
        is its partner row)."""
        self.differential_lambda = None
        if self.plan.normalize == "differential":
            self.differential_lambda = nn.Parameter(torch.randn(4, self.head_dim) * 0.1)

    def _build_dense(self) -> None:
        """The learned generators of each dense rotation (docs/semantics.md §2e), by transport index."""
        self.dense = nn.ModuleDict({str(i): DenseGenerators(**t.dense_shape(self.heads))
                                    for i, t in enumerate(self.transforms) if t.kind == P.DENSE})

    # the mask as the general forward's functions read it (general.masks.MaskSide): the cache's refusal reads it
    mask = property(lambda self: self.plan.mask)
    mask_prefix = property(lambda self: self.plan.mask_prefix)

    def extra_repr(self) -> str:
        return f"scheme={self.scheme.name!r}, backend={self.backend!r}, heads={self.heads}, head_dim={self.head_dim}"

    # ------------------------------------------------------------------ pieces
    def _check(self, q: Tensor, k: Tensor, v: Tensor, x, tokens, cache=None) -> None:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ShapeError(f"{name} must be a (B, H, L, D) tensor, got "
                                 f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
        B, H, Lq, D = q.shape
        if D != self.head_dim or H != self.heads:
            raise ShapeError(
                f"scheme '{self.scheme.name}' was compiled for {self.heads} query heads of dimension "
                f"{self.head_dim}, but q is {tuple(q.shape)} (H={H}, D={D})",
                hint=f"compile it with num_heads={H}, head_dim={D}")
        if k.shape != v.shape:
            raise ShapeError(f"k and v must have one shape (B, Hkv, L, D); got k {tuple(k.shape)}, v {tuple(v.shape)}")
        Bk, Hkv, L, Dk = k.shape
        if Bk != B or Dk != D:
            raise ShapeError(f"k {tuple(k.shape)} does not fit q {tuple(q.shape)}: batch and head dimension must agree")
        if Hkv < 1 or H % Hkv:
            raise ShapeError(
                f"k and v have {Hkv} heads, which does not divide q's {H} heads (grouped-query attention needs "
                f"Hq to be a multiple of Hkv)", hint="give k and v 1 (MQA), a divisor of Hq (GQA), or Hq heads")
        if Lq > L:
            raise ShapeError(
                f"q has {Lq} positions but k and v only {L}: queries are the last Lq of this call's tokens",
                hint="pass every new token's k and v (earlier tokens go in cache=module.new_cache(B))")
        if self.needs_x:
            if x is None:
                raise ShapeError(f"scheme '{self.scheme.name}' reads the hidden state: pass x=(B, L, d_model)")
            if x.dim() != 3 or x.shape[0] != B or x.shape[1] != L or x.shape[2] != self.d_model:
                raise ShapeError(f"x must be (B={B}, L={L}, d_model={self.d_model}) for the L tokens of k and v, "
                                 f"got {tuple(x.shape)}")
        if self.needs_tokens:
            if tokens is None:
                raise ShapeError(f"scheme '{self.scheme.name}' reads the tokens: pass tokens=(B, L)")
            if tokens.shape != (B, L):
                raise ShapeError(f"tokens must be (B={B}, L={L}) for the L tokens of k and v, got {tuple(tokens.shape)}")
        if cache is not None:
            if not isinstance(cache, AttentionCache):
                raise ShapeError(f"cache must come from module.new_cache(batch_size), got {type(cache).__name__}")
            if cache.scheme != self.scheme.name or cache.owner != id(self):
                raise ShapeError(
                    f"cache was made by another module (scheme '{cache.scheme}'), not this one (scheme "
                    f"'{self.scheme.name}')", hint="every attention layer needs its own cache: layer.new_cache(B)")
            if cache.batch_size != B:
                raise ShapeError(f"cache was made for batch size {cache.batch_size}, this call has {B}",
                                 hint="make the cache with module.new_cache(batch_size) for this batch")

    def new_cache(self, batch_size: int):
        """An empty decoding cache for ``batch_size`` sequences (see :mod:`pedsl.compiler.general`).

        Pass it as ``cache=`` to every call: a prefill of any length, then one token or a chunk at a
        time; the outputs equal one full forward (dynamic NTK: cached keys keep the table in force when
        they were cached, as Hugging Face does). One cache per layer and batch of sequences.
        """
        try:  # refused for a bidirectional mask (general.masks.cache_refusal)
            return AttentionCache(self, batch_size, self.scheme.name)
        except InputError as exc:
            raise ShapeError(str(exc), hint=exc.hint) from None

    def rope_tables(self, t: P.TransportStep, L: int, device, dtype) -> tuple[Tensor, Tensor]:
        key = t.site
        cached = self._rope_cache.get(key)
        dynamic = not t.static_table
        if cached is not None and cached[1].device == device and cached[1].dtype == dtype and (
            cached[0] == L if dynamic else cached[0] >= L
        ):
            return cached[1][:L], cached[2][:L]
        size = L if dynamic else max(L, 2 ** math.ceil(math.log2(max(L, 1))))
        phase = self.evaluator.run(t.expr, self._ctx(size, device=device, group=t), key)
        if t.table == P.LEARNED_TABLE:  # trained values: a new table (and autograd graph) per call
            return self._cos_sin_of(phase, t, size, dtype)
        cos, sin = self._cos_sin_of(phase, t, size, dtype)
        self._rope_cache[key] = (size, cos, sin)
        return cos[:L], sin[:L]

    @staticmethod
    def _cos_sin_of(phase, t: P.TransportStep, size: int, dtype) -> tuple[Tensor, Tensor]:
        """(cos, sin) (size, P) of a phase table, reduced mod 2 pi in float64, then cast."""
        ph = as_table(phase, size, len(t.channels) // 2)  # (L, P) float64
        ph = torch.remainder(ph, 2 * math.pi)
        cos, sin = torch.cos(ph), torch.sin(ph)
        scale = t.scale
        if scale != 1:  # HF's attention factor: q and k of the group scaled by multiplying cos and sin
            cos, sin = cos * scale, sin * scale
        return cos.to(dtype), sin.to(dtype)

    def step_angles(self, t: P.TransportStep, L: int, x, tokens, device, dtype) -> Tensor:
        a = self.evaluator.run(t.expr, self._ctx(L, x, tokens, device, dtype, group=t), t.site)
        return as_bhlp(a, L, len(t.channels) // 2)

    def _cos_sin(self, t: P.TransportStep, L: int, x, tokens, device, dtype) -> tuple[Tensor, Tensor]:
        if t.kind == P.ROPE and t.table == P.PER_TOKEN:  # phases per head (learned or not): no cached table
            ph = torch.remainder(as_bhlp(self.evaluator.run(t.expr, self._ctx(L, x, tokens, device, dtype, group=t),
                                                            t.site), L, len(t.channels) // 2).to(F64), 2 * math.pi)
            return (t.scale * torch.cos(ph)).to(dtype), (t.scale * torch.sin(ph)).to(dtype)
        if t.kind == P.ROPE:
            return self.rope_tables(t, L, device, dtype)
        A = cumulative_angles(self.step_angles(t, L, x, tokens, device, dtype).to(F64))
        return torch.cos(A).to(dtype), torch.sin(A).to(dtype)

    def _key_term(self, L: int, x, tokens, device) -> Tensor | None:
        """g(j) of the separable biases, (B|1, H, L) in float64."""
        total = None
        pos = torch.arange(L, dtype=F64, device=device)
        for b in self.biases:
            if b.carried != P.KEY_CHANNEL:
                continue
            if b.kind == P.LINEAR_BIAS:
                slope = self.evaluator.run(b.slope, self._ctx(L, x, tokens, device), b.site.name)
                s = per_head(slope, self.heads).to(F64)  # (H,)
                g = -s[:, None] * pos[None, :]  # (H, L): b = s (i - j) -> g(j) = -s j
                g = g.unsqueeze(0)
            else:
                lg = self.evaluator.run(b.site.expr, self._ctx(L, x, tokens, device), b.site.name)
                G = torch.cumsum(as_bhl(lg, L, self.heads).to(F64), dim=-1)
                g = -G  # b = G_i - G_j -> g(j) = -G_j
            total = g if total is None else total + g
        return total

    def bias_table(self, L: int, x, tokens, device, cols: slice | None = None) -> Tensor | None:
        """The full (B|1, H, L, L) bias, for the masked/reference backends (``cols``: only those
        key columns, (B|1, H, L, len(cols)), for streamed analysis at long lengths)."""
        total = None
        i = torch.arange(L, device=device)
        j = i if cols is None else i[cols]
        dist = (i[:, None] - j[None, :]).clamp(min=0)
        for b in self.biases:
            val = self.evaluator.run(b.site.expr, self._ctx(L, x, tokens, device), b.site.name)
            if b.query or (b.kind == P.AXIS_BIAS and "pos" in val.axes):  # (H, query, distance) gathered
                # (a bias over distance.AXIS reads i - j on every axis here: one sequence at positions 0..L-1)
                tab = val.align(("head", "pos", "dist")).to(F64).expand(self.heads, L, L)
                full = torch.gather(tab, 2, dist.expand(self.heads, *dist.shape)).unsqueeze(0)
            elif b.kind != P.GATE_BIAS:
                full = as_hd(val, L, self.heads).to(F64)[:, dist].unsqueeze(0)  # (H, L) over distance, gathered
            else:
                lg = val
                G = torch.cumsum(as_bhl(lg, L, self.heads).to(F64), dim=-1)
                full = G.unsqueeze(-1) - (G if cols is None else G[..., cols]).unsqueeze(-2)
            total = full if total is None else total + full
        return total

    def axis_bias(self, b: P.BiasTerm, dist: Tensor, qpos: Tensor) -> Tensor:
        """A bias over per-axis distances at (query, key) pairs: ``dist (B, rows, keys, A)`` their signed
        distances i_a - j_a, ``qpos (B, rows)`` the queries' positions (query_position); (B|1, H, rows, keys)
        float64."""
        B, rows, keys, _ = dist.shape
        ctx = self._ctx(keys, device=dist.device)
        ctx.positions, ctx.axis_dist = qpos, dist
        t = self.evaluator.run(b.site.expr, ctx, b.site.name).align(("batch", "head", "pos", "dist")).to(F64)
        return t.expand(t.shape[0], self.heads, rows, keys)

    def query_scale(self, L: int, device) -> Tensor | None:
        if self.temperature is None:
            return None
        tau = self.evaluator.run(self.temperature.site.expr, self._ctx(L, device=device), self.temperature.site.name)
        axes = ("head", "pos")
        t = tau.align(axes) if tau.axes else tau.t.reshape(1, 1)
        return t.expand(t.shape[0], L).unsqueeze(0).to(F64)  # (1, H|1, L)

    # ------------------------------------------------------------------ forward
    def transform_qkv(self, q, k, v, x=None, tokens=None):
        """Absolute pre-transforms of q, k, v; returns (q', k', v', undo) where undo(o) restores values."""
        if self.plan.remap is not None:  # the rotation depends on the pair: no pre-transform of q and k says it
            raise CompileError(f"scheme '{self.scheme.name}' remaps its positions by distance regime: its q and k "
                               "have no single rotation (raw scores, probabilities and the analysis instruments "
                               "are not computed for it yet)", code="E400",
                               hint="call the module itself (its forward computes the regimes block by block)")
        B, H, L, D = q.shape
        undo: list[tuple[Tensor | None, Tensor, tuple[int, ...] | None]] = []  # (cos or None: angles, sin, channels)
        for t in self.transforms:
            if t.kind == P.HOUSEHOLDER:
                continue
            if t.kind == P.DENSE:  # positions 0..L-1 on every axis, as a call without positions reads them
                gens = self.dense[str(t.index)]
                assert isinstance(gens, DenseGenerators)  # self.dense holds one per dense transport
                pos = torch.arange(L, device=q.device).view(1, L, 1).expand(1, L, gens.axes)
                rot, basis = gens.rotations(pos), gens.basis_matrix()
                q, k = (dense_rotate(x, rot, basis, t.channels if len(t.channels) != D else None) for x in (q, k))
                continue
            ch = t.channels if len(t.channels) != D else None
            if t.kind == P.SO2:
                # float64 cumulative sum reduced mod 2 pi, then cast (|A| < 2 pi keeps ~1e-7 rad in float32);
                # one fused rotation for q, k (and v) whose backward gives the angle gradient directly
                A = cumulative_angles(self.step_angles(t, L, x, tokens, q.device, q.dtype)).to(angle_dtype(q.dtype))
                if t.values:
                    q, k, v = rotary.rotate_many_by_angles([q, k, v], A, self.layout, ch)
                    undo.append((None, A, ch))
                else:
                    q, k = rotary.rotate_many_by_angles([q, k], A, self.layout, ch)
                continue
            cos, sin = self._cos_sin(t, L, x, tokens, q.device, angle_dtype(q.dtype))  # half: float32, rounded once
            if t.xpos_gamma:  # positions 0..L-1: the centre L // 2 of the general path without a cache
                try:
                    up = xpos_scale(t, torch.arange(L, device=q.device)[None], L // 2)[0].to(cos.dtype)
                except InputError as exc:
                    raise ShapeError(str(exc), hint=exc.hint) from None
                q = rotary.apply_rotary_channels(q, cos * up, sin * up, ch, self.layout)
                k = rotary.apply_rotary_channels(k, cos / up, sin / up, ch, self.layout)
                continue
            q = rotary.apply_rotary_channels(q, cos, sin, ch, self.layout)
            k = rotary.apply_rotary_channels(k, cos, sin, ch, self.layout)
            if t.values:
                v = rotary.apply_rotary_channels(v, cos, sin, ch, self.layout)
                undo.append((cos, sin, ch))

        def restore(o):
            for cos, sin, ch in reversed(undo):
                if cos is None:  # accumulated angles A: R(A_i)^T = R(-A_i)
                    o = rotary.rotate_many_by_angles([o], -sin, self.layout, ch)[0]
                else:
                    o = rotary.apply_rotary_channels(o, cos, -sin, ch, self.layout)  # R(A_i)^T = R(-A_i)
            return o

        return q, k, v, restore

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, x: Tensor | None = None, tokens: Tensor | None = None,
                positions: Tensor | None = None, document_ids: Tensor | None = None, cache=None,
                attn_mask: Tensor | None = None, band: bool = True, span_ids: Tensor | None = None):
        """q (B, Hq, Lq, D), k and v (B, Hkv, L, D) -> (B, Hq, Lq, D); see the module docstring and
        :mod:`pedsl.compiler.general` for positions, document_ids, cache, attn_mask and span_ids (``mask =
        spans``). ``band=False``: the ``attn_mask`` carries the scheme's window or chunk already (a caller's
        own mask, e.g. Hugging Face's, whose chunks start at a left-padded row's first token), so the module
        does not apply its own band over the positions."""
        self._check(q, k, v, x, tokens, cache)
        if span_ids is not None and self.plan.mask != "spans":
            raise ShapeError(f"span_ids given, but scheme '{self.scheme.name}' has mask = {self.scheme.mask.source()}: "
                             "only mask = spans reads them", hint="drop span_ids, or give the scheme mask = spans")
        if bidirectional_call(self.plan.kernels, q, k, band=band, positions=positions, document_ids=document_ids,
                              cache=cache, attn_mask=attn_mask, span_ids=span_ids):
            return self._bidirectional(q, k, v, x, tokens)
        if self.backend == "flex" or not fused_call(self.plan.kernels, q, k, band=band, positions=positions,
                                                    document_ids=document_ids, cache=cache, attn_mask=attn_mask):
            # every call the fused kernels do not declare (pedsl.compiler.kernel_support): the general path, or
            # the flex lowering where it declares the call
            from pedsl.compiler.stream import stream_forward  # on use: its torch.compiler.disable loads sympy

            return stream_forward(self, q, k, v, x=x, tokens=tokens, positions=positions, document_ids=document_ids,
                                  cache=cache, attn_mask=attn_mask, band=band, span_ids=span_ids)
        if self.backend == "reference":
            return reference_forward(self, q, k, v, x=x, tokens=tokens).to(q.dtype)
        L = q.shape[2]
        qt, kt, vt, restore = self.transform_qkv(q, k, v, x, tokens)
        q_scale = self.query_scale(L, q.device)
        if self.backend == "blockwise":
            o = self._blockwise(qt, kt, vt, x, tokens, q_scale)
        elif self.backend == "masked":
            bias = self.bias_table(L, x, tokens, q.device)
            if bias is None:
                bias = torch.zeros(1, 1, L, L, dtype=q.dtype, device=q.device)
            o = materialized_bias_attention(qt, kt, vt, bias, q_scale=q_scale)
        else:
            g = self._key_term(L, x, tokens, q.device)
            if g is not None and bias_call(self.plan.kernels, self.fused, qt, kt, vt):
                # the C++ kernel: g_j - g_i per score in float64, rounded once (docs/semantics.md §5.7)
                o = FusedKernels.bias_attention(scale_queries(qt, q_scale), kt, vt, key_term=g)
            else:
                # g in float64: offset per block of queries before the cast (pedsl.ops.bias, docs/semantics.md §5.7)
                o = separable_bias_attention(qt, kt, vt, g, q_scale=q_scale)
        return restore(o)

    def _bidirectional(self, q, k, v, x, tokens):
        """One full sequence of a bidirectional scheme (kernel_support's ``bidirectional``): q, k (and v)
        transported absolutely, the temperature on q, then non-causal SDPA over every key."""
        if self.backend == "reference":
            return reference_forward(self, q, k, v, x=x, tokens=tokens).to(q.dtype)
        qt, kt, vt, restore = self.transform_qkv(q, k, v, x, tokens)
        qt = scale_queries(qt, self.query_scale(q.shape[2], q.device))
        return restore(torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=False))

    def householder_inputs(self, B: int, L: int, x, tokens, device, dtype):
        """(w, beta, log_forget) for the blockwise kernel: w (B, H, L, D) with zeros outside the
        Householder groups, beta (B, H, L), log_forget (B, H, L) or None (gates and linear
        distance biases as per-step log terms: b(i, j) = sum_{s=j+1..i} log_forget_s)."""
        H, D = self.heads, self.head_dim
        w = torch.zeros(B, H, L, D, dtype=dtype, device=device)
        beta = torch.zeros(B, H, L, dtype=dtype, device=device)
        for t in self.plan.of_kind(P.HOUSEHOLDER):
            ctx = self._ctx(L, x, tokens, device, dtype, group=t)
            wt, bt = (self.evaluator.run(s.expr, ctx, s.name) for s in t.sites)
            wv = wt.align(("batch", "head", "pos", "chan")).expand(B, H, L, len(t.channels)).to(dtype)
            if len(t.channels) == D:
                w = wv
            else:
                w = w.index_copy(-1, torch.tensor(t.channels, device=device), wv)
            beta = as_bhl(bt, L, H).expand(B, H, L).to(dtype)
        log_forget = None
        for b in self.biases:
            if b.kind == P.LINEAR_BIAS:
                slope = self.evaluator.run(b.slope, self._ctx(L, x, tokens, device), b.site.name)
                lf = per_head(slope, H).to(dtype)[None, :, None].expand(B, H, L)
            else:
                lg = self.evaluator.run(b.site.expr, self._ctx(L, x, tokens, device), b.site.name)
                lf = as_bhl(lg, L, H).expand(B, H, L).to(dtype)
            log_forget = lf if log_forget is None else log_forget + lf
        return w, beta, log_forget

    def _blockwise(self, q, k, v, x, tokens, q_scale):
        w, beta, log_forget = self.householder_inputs(q.shape[0], q.shape[2], x, tokens, q.device, q.dtype)
        return path_attention(q, k, v, w, beta, log_forget, q_scale=q_scale)

    # ------------------------------------------------------------------ analysis
    def raw_scores(self, q: Tensor, k: Tensor, *, x=None, tokens=None) -> Tensor:
        """<q_i, T(j->i) k_j> for j <= i (no scale, temperature or bias), (B, H, L, L); -inf above the diagonal."""
        self._check(q, k, k, x, tokens)
        if self.plan.mask != "causal":
            raise ShapeError(f"raw_scores and probs analyse causal attention, and scheme '{self.scheme.name}' has "
                             f"mask = {self.scheme.mask.source()}", hint="analyse the scheme's causal form "
                             "(without its mask statement), or call the module for its outputs")
        if q.shape != k.shape:
            raise ShapeError(f"raw_scores needs q and k of one shape (B, H, L, D), got {tuple(q.shape)}, {tuple(k.shape)}")
        return transported_scores(self, q, k, x=x, tokens=tokens)

    def probs(self, q: Tensor, k: Tensor, *, x=None, tokens=None) -> Tensor:
        """The attention matrix a(i, j), (B, H, L, L) (materialised: for analysis at moderate L), through the
        one score pipeline (:mod:`pedsl.compiler.scores`); with a sink the rows sum to less than one (the
        sink's share is left out)."""
        L, D = q.shape[2], q.shape[3]
        raw = self.raw_scores(q, k, x=x, tokens=tokens)
        scale = 1 / math.sqrt(D)
        if self.plan.relative is not None:  # content-position terms join the raw scores, as the forward adds them
            side, pos = ModuleScheme.of(self), torch.arange(L, device=q.device)[None]
            raw = raw + relative_rows(side, relative_call(side, q, k, pos, pos), q, pos, pos, 0, L).to(raw.dtype)
            scale = relative_scale(side, D)
        tau, bias = self.query_scale(L, q.device), self.bias_table(L, x, tokens, q.device)
        s = modified_scores(raw, scale=scale, tau=None if tau is None else tau.to(raw.dtype).unsqueeze(-1),
                            bias=None if bias is None else bias.to(raw.dtype), cap=self.plan.softcap)
        own = own_key_counts(self.plan.attend_current, self.plan.normalize)
        ok = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(0 if own else -1)
        seen = self.window_visible(L, q.device)
        ok = ok if seen is None else ok & seen
        emb = None if self.contextual_embedding is None else self.contextual_embedding.detach()  # made with contextual
        differential = self.plan.normalize == "differential"
        w, _ = normalised(s, ok, normalize="softmax" if differential else self.plan.normalize,
                          sink=self.sink_logits(q), qc=q, emb=emb, sigmoid_bias=self.plan.sigmoid_bias)
        if differential:  # both heads of a pair weigh their values by a_h - lambda a_{h + H/2}
            half = w.shape[1] // 2
            assert self.differential_lambda is not None  # made for the differential normalizer
            lam = differential_lambda(self.differential_lambda.detach(), self.plan.lambda_init)
            w = (w[:, :half] - lam.to(w.dtype) * w[:, half:]).repeat(1, 2, 1, 1)
        return w.to(s.dtype)

    def window_visible(self, L: int, device, cols: slice | None = None) -> Tensor | None:
        """(L, keys) bool: which keys (``cols``: the key columns held) the window or chunk lets each query of
        one sequence at positions 0..L-1 see; None without a window or chunk."""
        shape = shape_of(self.plan)
        if shape is None:
            return None
        i = torch.arange(L, device=device)
        return visible(shape, i[None], (i if cols is None else i[cols])[None])[0]

    def window_mask(self, s: Tensor, cols: slice | None = None) -> Tensor:
        """Scores (B, H, L, keys) of one sequence at positions 0..L-1 with the keys outside the window or
        chunk at -inf (``cols``: the key columns they hold)."""
        seen = self.window_visible(s.shape[2], s.device, cols)
        return s if seen is None else s.masked_fill(~seen, float("-inf"))

    def sink_logits(self, q: Tensor) -> Tensor | None:
        """The sink's logit per query, (B, H, L) float64 (docs/semantics.md §11: :func:`pedsl.compiler.scores.
        sink_column`, as the forward forms it), or None without one."""
        with torch.no_grad():
            tau = self.query_scale(q.shape[2], q.device)
            col = sink_column(ModuleScheme.of(self), q.detach().to(F64), tau)
        # softmax1's pinned logit 0 is no learned sink (normalised adds it itself)
        return None if col is None or self.plan.normalize == "softmax1" else col[0]

    def rotary_groups(self) -> list[dict]:
        """Position-indexed rotary groups: channels, layout and angular frequency per pair (for frequency energy)."""
        freqs = rotary_frequencies(self.scheme)
        return [dict(group=g, channels=self.scheme.group(g).channels, layout=self.layout, freqs=f)
                for g, f in freqs.items()]
