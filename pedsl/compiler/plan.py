"""The lowering plan: what the passes decided, as typed, frozen records that the module, codegen,
the reference backend, the numpy sampler and ``pedsl graph`` all read.

The graph passes of :mod:`pedsl.compiler.passes` decide (which identity applies, which kernel
runs, how a bias is carried, which backend); their last pass records the decisions here. The
executors never decide again: :class:`~pedsl.compiler.module.SchemeAttention` and
:mod:`pedsl.compiler.codegen` branch on the plan's fields, and every learned parameter is named
after a :class:`Site` of the plan (one source for the module's ``learned.sites``, the generated
module's and the sampler's weights).

* :class:`TransportStep` - one channel group's transport (docs/semantics.md §1, §5): a
  position-indexed rotation by a phase table (static, or rebuilt for the run-time length n),
  accumulated SO(2) steps (cumulative angles), or Householder steps (PaTH, blockwise).
* :class:`BiasTerm` - a logit bias: a table over distance, a linear distance bias (a coordinate
  ``slope * position``) or a forget gate (the coordinate ``cumsum(log gate)``), and how the fused
  full-sequence path carries it (one key channel, a materialised table, a score_mod, a per-step
  log term).
* :class:`Temperature` - the per-query scale of q: a table over positions or a run-time value.

Networkx and torch free: importing it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from pedsl.compiler.kernel_support import explicit_scores
from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import DenseRotation
from pedsl.lang.frequencies import axis_runs
from pedsl.lang.statements import CARRIED
from pedsl.runtime.walk import learned_calls, param_key, site_name  # noqa: F401 (the plan's names)

# transport kinds
ROPE = "rope-table"  # q, k (, v) rotated by position-indexed phases (cos/sin tables)
SO2 = "accumulated-so2"  # accumulated SO(2) steps: cumulative angles rotate q, k (, v) absolutely
HOUSEHOLDER = "householder"  # accumulated Householder steps (PaTH): no absolute factoring
DENSE = "dense-rotation"  # q, k rotated by R(p) = P^T expm(sum_a p_a A_a) P of their own positions (learned)
# phase tables
STATIC, RUNTIME_LENGTH, PER_TOKEN = "static", "run-time length", "per token"
LEARNED_TABLE = "learned"  # a phase of learned values (learned(init)): evaluated at every call, never cached
# bias kinds
TABLE_BIAS = "distance-table"  # b(i, j) = term(head, i - j), non-linear: a (head, distance) table
LINEAR_BIAS = "linear-distance"  # b(i, j) = slope * (p_i - p_j): coordinate c = slope * p (ALiBi)
GATE_BIAS = "forget-gate"  # b(i, j) = G_i - G_j, G = cumsum(log gate) (FoX)
# b(i, j) = term(head, i_a - j_a for each axis a it reads): evaluated per pair of tokens, in blocks of queries
AXIS_BIAS = "axis-distance"
# what a linear bias counts between two tokens: their positions (-m * distance), or the tokens on the
# route (accumulate(-m): a sum of per-token log gates; the two agree on contiguous, unpadded positions)
POSITIONS, TOKENS = "positions", "tokens"
# how the fused full-sequence path carries a bias
KEY_CHANNEL, MATERIALISED, SCORE_MOD, STEP_LOG_TERM = "key channel", "materialised", "score_mod", "step log term"
# normalisers
SOFTMAX, SOFTMAX1, SIGMOID, STICK_BREAKING = "softmax", "softmax1", "sigmoid", "stick_breaking"
DIFFERENTIAL = "differential"
QUERY_BLOCKS = "table per query block"  # a (head, distance) table gathered per block of queries (general path)
# temperature tables
POSITION_TABLE, RUNTIME = "position table", "run-time"


@dataclass(frozen=True)
class Site:
    """An expression evaluated at run time under one name: its learned call sites are
    ``learned.sites["<name>__<kind><count>"]`` (numbered by :class:`pedsl.runtime.walk.DynamicEvaluator`)."""

    name: str
    role: str  # phase | steps | w | beta | bias | temperature
    expr: ast.Expr
    group: str | None = None  # the channel group whose pairs/channels the expression may span


@dataclass(frozen=True)
class TransportStep:
    group: str
    index: int  # position among the scheme's transports (decoding state is kept per index)
    kind: str  # ROPE | SO2 | HOUSEHOLDER
    channels: tuple[int, ...]
    targets: str  # "qk" | "qkv" (values transported too, undone on the output)
    table: str  # ROPE: STATIC | RUNTIME_LENGTH | LEARNED_TABLE | PER_TOKEN (phases per head); SO2, HOUSEHOLDER: PER_TOKEN
    kernel: str  # "rotary" | "cumulative angles" | "blockwise"
    sites: tuple[Site, ...]  # ROPE: (phase,); SO2: (steps,); HOUSEHOLDER: (w, beta)
    scale: float = 1.0  # rotate(..., scale = m): q and k of the group times m
    orthogonal: bool = False  # HOUSEHOLDER with beta = 2: reflections
    why: str = ""
    pair_axes: tuple[str, ...] = ()  # a multi-axis scheme's rotation: the position axis each pair reads
    # ROPE written xpos(...): pair k of q times xpos_zeta[k]^((i - c) / xpos_gamma), of k its inverse at j
    # (docs/semantics.md §2c); 0 and () for every other transport
    xpos_gamma: float = 0.0
    xpos_zeta: tuple[float, ...] = ()
    # ROPE folded from accumulated constant steps (accumulate(rotation(w))): the step angle w. The fold holds
    # at consecutive positions only; the steps count the tokens on the route (docs/semantics.md §2b)
    step: Site | None = None
    # DENSE: the checked dense_rotation (block, mode, basis, per_head, init, axes); None for every other kind
    dense: DenseRotation | None = None

    @property
    def expr(self) -> ast.Expr:
        """The phase (ROPE) or step angle (SO2) expression."""
        return self.sites[0].expr

    @property
    def site(self) -> str:
        return self.sites[0].name

    @property
    def values(self) -> bool:
        return self.targets == "qkv"

    @property
    def static_table(self) -> bool:
        return self.kind == ROPE and self.table == STATIC

    def dense_shape(self, heads: int) -> dict[str, Any]:
        """DENSE: the keyword arguments of ``general.dense.DenseGenerators`` (the module and the generated module
        build the same parameters from them, so a state dict loads into both)."""
        d = self.dense
        assert d is not None, "dense_shape of a transport that is no dense rotation"
        return dict(width=len(self.channels), block=d.block, axes=d.axes, mode=d.mode, basis=d.basis,
                    heads=heads if d.per_head else 1, init=d.init)

    def as_steps(self) -> "TransportStep":
        """The transport as written: a RoPE table folded from constant steps back as those SO(2) steps, whose
        cumulative angles count the tokens on the route, so that a call with gaps in its positions, padding or
        a cache (the general forward) rotates by the tokens, not the positions; any other transport as it is."""
        if self.step is None:
            return self
        return replace(self, kind=SO2, table=PER_TOKEN, kernel="cumulative angles", sites=(self.step,), step=None)


@dataclass(frozen=True)
class BiasTerm:
    index: int  # position among the scheme's biases
    kind: str  # TABLE_BIAS | LINEAR_BIAS | GATE_BIAS | AXIS_BIAS
    site: Site  # TABLE_BIAS, LINEAR_BIAS: the term over distance; GATE_BIAS: the per-step log gate
    carried: str  # KEY_CHANNEL | "table" | MATERIALISED | SCORE_MOD | STEP_LOG_TERM | QUERY_BLOCKS (fused full-sequence path)
    slope: ast.Expr | None = None  # LINEAR_BIAS: the slope per head
    counts: str = POSITIONS  # LINEAR_BIAS: POSITIONS, or TOKENS when written as a constant gate
    why: str = ""
    query: bool = False  # TABLE_BIAS that reads the query position too (query_position): (H, queries, distances)
    axes: tuple[str, ...] = ()  # AXIS_BIAS: the position axes whose distances (distance.AXIS) the term reads

    @property
    def coordinate(self) -> bool:
        """b(i, j) = c_i - c_j of a per-token float64 coordinate (the general path, codegen, decoding)."""
        return self.kind in (LINEAR_BIAS, GATE_BIAS)

    @property
    def log_gate(self) -> ast.Expr | None:
        """The per-token log gate whose cumulative sum is the coordinate (a gate, or a linear bias that
        counts tokens: the general path, codegen and decoding sum it over the tokens), else None."""
        if self.kind == GATE_BIAS:
            return self.site.expr
        return self.slope if self.kind == LINEAR_BIAS and self.counts == TOKENS else None


@dataclass(frozen=True)
class Temperature:
    site: Site
    table: str  # POSITION_TABLE (reads nothing but the position) | RUNTIME
    carried: str = "q scale"
    why: str = ""


@dataclass(frozen=True)
class Plan:
    scheme: str
    layout: str
    heads: int
    head_dim: int
    transports: tuple[TransportStep, ...]
    biases: tuple[BiasTerm, ...]
    temperature: Temperature | None
    backend: str
    backend_why: str
    # a half-precision call takes the general path, which differences the bias coordinates per query
    # block in float64 (a key channel g(j) loses the bias in half precision: |g| grows with j)
    half_via_general: bool = False
    axes: tuple[str, ...] = ()  # the scheme's position axes (`axes t, h, w`); () for one axis
    # how scores become weights (docs/semantics.md §1b): SOFTMAX; SOFTMAX1 (a logit 0 in the denominator: the
    # general path's sink column); SIGMOID (sigmoid(s + sigmoid_bias)) or STICK_BREAKING, which every call runs
    # on the general path's explicit blocks of scores; attend_current: a query's own key takes part; DIFFERENTIAL
    # (pairs of heads, the general path's blocks with each value widened by its partner's), from lambda_init
    normalize: str = "softmax"
    attend_current: bool = True
    sigmoid_bias: float = 0.0
    lambda_init: float = 0.8

    # score-dependent positions (CoPE, a lang.scheme.ContextualPositions): the logits read the scores
    contextual: Any = None
    # the rotation's positions per distance regime (a lang.scheme.Remap; docs/semantics.md §2d): no fused
    # kernel computes them, the general path's blocks of queries do (one rotated score block per regime)
    remap: Any = None
    # content-position terms (a lang.scheme.RelativeTerms; docs/semantics.md §3b): no fused kernel computes them,
    # the general path's blocks of queries do
    relative: Any = None

    @property
    def explicit_scores(self) -> bool:
        """The weights are not a softmax of q.k plus a bias known beforehand (stick-breaking, CoPE): no fused
        kernel computes them, the general path's explicit blocks of scores do."""
        return explicit_scores(self.normalize, self.contextual)

    # the attention's shape (docs/semantics.md §11): a sliding window or chunk of this many positions, and
    # the learned sink ("logit" or "token"); a scheme with any of them runs the general forward's blocks
    window: int | None = None
    chunk: int | None = None
    sink: str | None = None
    # logit soft-capping (Gemma 2): scores s -> softcap * tanh(s / softcap), on the general forward's
    # explicit blocks of scores (no fused kernel caps them)
    softcap: float | None = None
    # which pairs see each other both ways (docs/semantics.md §11a): "causal", "bidirectional", "prefix" (the
    # positions below mask_prefix) or "spans" (the call's span_ids); only fast paths that declare it run it
    mask: str = "causal"
    mask_prefix: int | None = None
    # the fast kernels whose declaration covers every feature of this plan (pedsl.compiler.kernel_support,
    # decided by the last pass): an executor runs one of them where its call-time check takes the call,
    # the general forward everywhere else
    kernels: tuple[str, ...] = ()
    # the values the statements carry (pedsl.lang.statements.CARRIED) that have no field above: (name, value),
    # read as attributes of the plan (``plan.<name>``), the declared default where absent
    settings: tuple[tuple[str, Any], ...] = ()

    def __getattr__(self, name: str) -> Any:
        """A carried value without a field of its own (only those: anything else is an AttributeError)."""
        declared = _SETTINGS.get(name)
        if declared is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return dict(self.__dict__.get("settings", ())).get(name, declared.default)

    @property
    def statement_features(self) -> frozenset[str]:
        """The kernel features of the carried values (each record's ``Carried.feature``, at a value other than
        its default): what a fused kernel must declare to run this plan's statements."""
        named = (c.feature_of(getattr(self, c.name)) for c in CARRIED)
        return frozenset(f for f in named if f is not None)

    @property
    def params(self) -> tuple[Site, ...]:
        """Every evaluation site, in build order: the names of all learned parameters derive from these."""
        out = [s for t in self.transports for s in t.sites] + [b.site for b in self.biases]
        return tuple(out + ([self.temperature.site] if self.temperature is not None else []))

    def transport(self, group: str) -> TransportStep:
        return next(t for t in self.transports if t.group == group)

    def of_kind(self, kind: str) -> tuple[TransportStep, ...]:
        return tuple(t for t in self.transports if t.kind == kind)


_SETTINGS = {c.name: c for c in CARRIED if c.name not in {f.name for f in fields(Plan)}}


def carried_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The plan's keyword arguments of the carried values (``name -> value``, every one of CARRIED): its fields
    by name, the others as ``settings`` (those other than their default: an absent statement adds nothing)."""
    own = {f.name for f in fields(Plan)}
    return {**{k: v for k, v in values.items() if k in own},
            "settings": tuple((k, v) for k, v in values.items() if k not in own and v != _SETTINGS[k].default)}


def carried_values(plan: Plan) -> dict[str, Any]:
    """Every carried value of the plan, in registry order (``name -> value``)."""
    return {c.name: getattr(plan, c.name) for c in CARRIED}


@dataclass(frozen=True)
class LearnedSite:
    """One set of learned parameters: its key in ``learned.sites``, the call, and the evaluation sites
    that read it with how many times each (a let's value read twice is still one set)."""

    key: str
    call: ast.Call
    readers: tuple[tuple[str, int], ...]


def learned_sites(plan: Plan) -> tuple[LearnedSite, ...]:
    """Every learned parameter set of the plan, in build order (the order the module creates them)."""
    found: dict[str, tuple[ast.Call, dict[str, int]]] = {}
    for site in plan.params:
        for call, key in learned_calls(site.expr, site.name):
            readers = found.setdefault(key, (call, {}))[1]
            readers[site.name] = readers.get(site.name, 0) + 1
    return tuple(LearnedSite(k, c, tuple(r.items())) for k, (c, r) in found.items())


# ---------------------------------------------------------------------- rendering
def plan_lines(plan: Plan) -> list[str]:
    """The plan as text (``pedsl graph``, ``pedsl explain``)."""
    out = [f"plan for {plan.scheme}: backend {plan.backend} - {plan.backend_why}"]
    if plan.axes:
        out.append(f"  positions: axes {', '.join(plan.axes)} (forward takes positions ({len(plan.axes)}, B, L); a "
                   "call that gives them evaluates its phases per token, one without reads the tables below)")
    for t in plan.transports:
        extra = (f", scale {t.scale:g}" if t.scale != 1 else "") + (f", xPos gamma {t.xpos_gamma:g}" if t.xpos_gamma else "")
        out.append(f"  transport {t.group!r} ({len(t.channels)} channels, {t.targets}): {t.kind}, table "
                   f"{t.table}, kernel {t.kernel}{extra}")
        for s in t.sites:
            out.append(f"      {s.name} = {to_source(s.expr)}")
        if t.pair_axes:
            out.append(f"      axes read: {axis_runs(t.pair_axes)}")
        if t.why:
            out.append(f"      {t.why}")
    for b in plan.biases:
        out.append(f"  bias {b.index}: {b.kind}" + (f" (counting {b.counts})" if b.kind == LINEAR_BIAS else "")
                   + (" (and the query position)" if b.query else "")
                   + (f" over axes {', '.join(b.axes)}" if b.axes else "")
                   + f", carried as {b.carried}")
        out.append(f"      {b.site.name} = {to_source(b.site.expr)}"
                   + (f"  (slope {to_source(b.slope)})" if b.slope is not None else ""))
        if b.why:
            out.append(f"      {b.why}")
    if plan.temperature is not None:
        tau = plan.temperature
        out.append(f"  temperature: {tau.table}, carried as {tau.carried}")
        out.append(f"      {tau.site.name} = {to_source(tau.site.expr)}")
        if tau.why:
            out.append(f"      {tau.why}")
    if plan.contextual is not None:
        c = plan.contextual
        out.append(f"  contextual positions: {c.source()}, carried as explicit blocks of scores; learned "
                   f"contextual_embedding ({'' if c.shared else 'heads x '}{c.max_pos} x head_dim)")
    if plan.relative is not None:
        out.append(f"  content-position terms: {plan.relative.source()}, carried per block of queries; "
                   + plan.relative.describe())
    if plan.remap is not None:
        per = "regime" if plan.remap.chunk is None else f"regime of the chunk difference (chunk = {plan.remap.chunk})"
        out.append(f"  remapped positions, carried as one rotated score block per {per}:")
        out.extend(f"      {r.source()}" for r in plan.remap.regimes)
    if plan.mask != "causal":
        out.append(f"  mask: {plan.mask}" + (f" ({plan.mask_prefix} positions)" if plan.mask_prefix else "")
                   + "; a window is symmetric and a distance reads |p_i - p_j|")
    if plan.settings:
        out.append("  statements: " + ", ".join(f"{k} = {v!r}" for k, v in plan.settings))
    if plan.half_via_general:
        out.append("  half precision: the general path (bias coordinates differenced per query block in float64)")
    out.append("  parameter sites: " + (", ".join(s.name for s in plan.params) or "none"))
    learned = learned_sites(plan)
    if learned:
        out.append("  learned parameters (one set per call; a let's value is one set, whatever reads it):")
        width = max(len(ls.key) for ls in learned)
        for ls in learned:
            read = ", ".join(f"{r}" + (f" x{n}" if n > 1 else "") for r, n in ls.readers)
            out.append(f"      {ls.key.ljust(width)}  {_short(to_source(ls.call))}  <- {read}")
    return out


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plan_to_json(plan: Plan) -> dict:
    def site(s: Site) -> dict:
        return {"name": s.name, "role": s.role, "expr": to_source(s.expr), "group": s.group}

    return {
        "scheme": plan.scheme, "layout": plan.layout, "heads": plan.heads, "head_dim": plan.head_dim,
        "backend": plan.backend, "backend_why": plan.backend_why, "half_via_general": plan.half_via_general,
        "axes": list(plan.axes), "mask": plan.mask, "mask_prefix": plan.mask_prefix,
        "transports": [{"group": t.group, "index": t.index, "kind": t.kind, "channels": list(t.channels),
                        "targets": t.targets, "table": t.table, "kernel": t.kernel, "scale": t.scale,
                        "orthogonal": t.orthogonal, "sites": [site(s) for s in t.sites], "why": t.why,
                        "pair_axes": list(t.pair_axes), "xpos_gamma": t.xpos_gamma,
                        "xpos_zeta": list(t.xpos_zeta)}
                       for t in plan.transports],
        "biases": [{"index": b.index, "kind": b.kind, "carried": b.carried, "counts": b.counts, "site": site(b.site),
                    "slope": None if b.slope is None else to_source(b.slope), "why": b.why, "axes": list(b.axes)}
                   for b in plan.biases],
        "temperature": None if plan.temperature is None else {
            "table": plan.temperature.table, "carried": plan.temperature.carried,
            "site": site(plan.temperature.site), "why": plan.temperature.why},
        "params": [s.name for s in plan.params],
        "contextual": None if plan.contextual is None else {"kind": plan.contextual.kind,
                                                            "max_pos": plan.contextual.max_pos,
                                                            "shared": plan.contextual.shared},
        "relative": None if plan.relative is None else plan.relative.model_dump(),
        "remap": None if plan.remap is None else {"chunk": plan.remap.chunk, "regimes": [
            {"low": r.low, "high": r.high, "query": to_source(r.query), "key": to_source(r.key)}
            for r in plan.remap.regimes]},
        "settings": dict(plan.settings),
        "learned": [{"key": ls.key, "call": to_source(ls.call), "readers": dict(ls.readers)}
                    for ls in learned_sites(plan)],
    }
