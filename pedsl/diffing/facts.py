"""What a resolved scheme does, in numbers: the facts that ``diff`` compares and ``explain`` prints.

Everything is computed statically in float64 by :mod:`pedsl.lang.fold`
(no torch): which channels each transport acts on, the angular frequency of
every rotary pair (and its period against the training length), the spread of
random or learned step angles, bias slopes per head, the temperature at a few
lengths, the value transport, and the backend the compiler picks
(:func:`pedsl.compiler.compile_graph`, networkx only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pedsl.errors import PedslError
from pedsl.lang import ast
from pedsl.lang.fold import fold_expr
from pedsl.lang.exprs import to_source, transform
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import attention_words
from pedsl.lang.types import Dep
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv, Vec
from pedsl.lang.frequencies import axis_runs, pair_axes, rotary_frequencies
from pedsl.lang.normalizers import weights_words
from pedsl.lang.channels import channel_ranges as ranges
from pedsl.diffing.match import bias_source, transport_source

TAU = 2 * math.pi


@dataclass
class GroupFacts:
    """One channel group and the transport on it (if any)."""

    name: str
    spec: str
    channels: tuple[int, ...]
    kind: str | None = None  # rotate | accumulate_rotation | accumulate_householder | None (NoPE)
    targets: str | None = None  # qk | qkv
    source: str | None = None  # the transport as written
    freqs: tuple[float, ...] | None = None  # angular frequency per pair (static rotations)
    dynamic: bool = False  # table depends on the run-time length
    scale: float = 1.0  # rotate(..., scale = m): q and k of the group times m
    xpos: tuple[float, float] | None = None  # xpos(...): (gamma, zeta)
    data: bool = False  # steps depend on tokens or x
    learned: bool = False
    reads_x: bool = False  # steps read the hidden state x (a projection such as linear(x): costs FLOPs)
    orthogonal: bool | None = None
    commuting: bool | None = None  # dense_rotation: whether its generators commute
    block: int = 0  # dense_rotation: channels per block
    basis: bool = False  # dense_rotation: a learned basis P
    per_head: bool = False  # dense_rotation: generators per head
    spread: tuple[float, ...] | None = None  # per-pair scale of random/learned step angles
    mean: tuple[float, ...] | None = None  # per-pair mean step angle (drift)
    pair_axes: tuple[str, ...] = ()  # a multi-axis scheme's rotation: the position axis each pair reads

    @property
    def pairs(self) -> int:
        return len(self.channels) // 2

    @property
    def periods(self) -> tuple[float, ...] | None:
        if self.freqs is None:
            return None
        return tuple(TAU / w if w > 0 else math.inf for w in self.freqs)


@dataclass
class BiasFacts:
    kind: str  # distance | gate
    source: str
    slopes: tuple[float, ...] | None = None  # d(bias)/d(distance) per head (linear distance biases)
    init_log_gate: float | None = None  # gate bias: the log-gate per token at initialisation
    data: bool = False
    axes: tuple[str, ...] = ()  # the position axes whose distances (distance.AXIS) a distance bias reads


@dataclass
class SchemeFacts:
    name: str
    heads: int
    head_dim: int
    layout: str
    train_length: int | None
    params: dict[str, Any]
    groups: list[GroupFacts]
    biases: list[BiasFacts]
    temperature: str | None
    temperature_at: list[tuple[int, float | tuple[float, ...] | None]] = field(default_factory=list)
    normalize: str = "softmax over the visible keys"  # the normaliser in words (lang.normalizers.weights_words)
    contextual: str = "none"  # score-dependent positions (CoPE), in words
    cope_max_pos: int | None = None  # CoPE's embedding rows, None without CoPE
    relative: tuple[str, int, int] | None = None  # content-position terms: (kind, table rows, terms), or None
    backend: str | None = None
    backend_note: str | None = None
    compile_error: str | None = None
    graph: Any = None
    axes: tuple[str, ...] = ()  # the position axes (`axes t, h, w`)
    shape: str = "causal"  # which keys a query sees and the sink (docs/semantics.md §11), in words

    @property
    def rotating(self) -> list[GroupFacts]:
        return [g for g in self.groups if g.kind is not None]

    @property
    def value_groups(self) -> list[str]:
        return [g.name for g in self.groups if g.targets == "qkv"]


def env_of(s: Scheme, n: int | None = None) -> StaticEnv:
    return StaticEnv(values={**s.params, "heads": s.heads, "head_dim": s.head_dim}, n=n)


def _static(e: ast.Expr, env: StaticEnv) -> Any:
    try:
        v = fold_expr(e, env)
    except EvalIssue:
        return None
    return None if v is DYNAMIC else v


def _per(v: Any, n: int) -> tuple[float, ...] | None:
    if isinstance(v, Vec):
        return tuple(float(x) for x in v.values)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (float(v),) * n
    return None


_RANDOM_CALLS = ("frozen_random", "embedding", "linear")


def _with_random(e: ast.Expr, value: float) -> ast.Expr:
    """e with every random or learned source (frozen_random, embedding, linear) replaced by ``value``."""
    return transform(e, lambda n: ast.Num(value=value) if n.kind == "call" and n.func in _RANDOM_CALLS else None)


def step_spread(angle: ast.Expr, env: StaticEnv, pairs: int) -> tuple[tuple[float, ...] | None, tuple | None]:
    """(per-pair spread, per-pair mean) of step angles 'scale * random + mean' (None when not of that form)."""
    e1 = _per(_static(_with_random(angle, 1.0), env.child(pairs=pairs)), pairs)
    e0 = _per(_static(_with_random(angle, 0.0), env.child(pairs=pairs)), pairs)
    if e1 is None or e0 is None:
        return None, None
    return tuple(abs(a - b) for a, b in zip(e1, e0)), e0


def _init_value(e: ast.Expr, env: StaticEnv) -> float | None:
    """A gate's value at initialisation: learned linear maps start at their init_bias (else 0)."""

    def sub(n):
        if n.kind == "call" and n.func in ("linear", "embedding"):
            kw = {k.name: k.value for k in n.kwargs}
            return kw.get("init_bias", ast.Num(value=0))
        return None

    v = _static(transform(e, sub), env)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def temperature_at(s: Scheme, positions: list[int]) -> list[tuple[int, Any]]:
    """tau(i) at query positions i (log_length(L) = max(1, ln(i + 1) / ln L), docs/semantics.md §4)."""
    if s.temperature is None:
        return [(i, 1.0) for i in positions]
    env = env_of(s)
    out = []
    for i in positions:
        def sub(n, i=i):
            if n.kind == "call" and n.func == "log_length":
                length = _static(n.args[0], env) if n.args else None
                if not isinstance(length, (int, float)) or length <= 1:
                    return None
                return ast.Num(value=max(1.0, math.log(i + 1) / math.log(length)))
            if n.kind == "name" and n.id == "position":
                return ast.Num(value=i)
            return None

        v = _static(transform(s.temperature, sub), env_of(s, n=i + 1))
        out.append((i, _per(v, s.heads) if isinstance(v, Vec) else (float(v) if v is not None else None)))
    return out


def scheme_facts(s: Scheme, *, graph: bool = True) -> SchemeFacts:
    env = env_of(s)
    try:
        freqs = rotary_frequencies(s)
    except Exception:  # a display nicety must never break diff/explain
        freqs = {}
    by_group = {t.group: t for t in s.transports}
    try:
        read = pair_axes(s)
    except Exception:  # a display nicety must never break diff/explain
        read = {}
    groups = []
    for g in s.groups:
        gf = GroupFacts(name=g.name, spec=g.spec, channels=tuple(g.channels))
        t = by_group.get(g.name)
        if t is not None:
            gf.kind, gf.targets, gf.source = t.kind, t.targets, transport_source(t)
            gf.freqs = freqs.get(g.name)
            gf.pair_axes = read.get(g.name, ())
            if t.kind == "rotate":
                gf.dynamic, gf.scale = t.dynamic, t.scale
                # xpos sets gamma and zeta together (terms.py), so both are None or neither
                gf.xpos = None if t.xpos_gamma is None or t.xpos_zeta is None else (t.xpos_gamma, t.xpos_zeta)
            elif t.kind == "accumulate_rotation":
                gf.data, gf.learned, gf.reads_x = t.data, t.learned, Dep.DATA in t.reads
                if gf.freqs is None:
                    gf.spread, gf.mean = step_spread(t.angle, env, gf.pairs)
            elif t.kind == "dense_rotation":
                gf.learned, gf.commuting, gf.block, gf.basis, gf.per_head = True, t.commuting, t.block, t.basis, t.per_head
            else:
                gf.data, gf.learned, gf.orthogonal = t.data, t.learned, t.orthogonal
        groups.append(gf)
    biases = []
    for b in s.biases:
        if b.kind == "distance":
            slopes = _per(_static(b.slope, env), s.heads) if b.slope is not None else None
            biases.append(BiasFacts("distance", bias_source(b), slopes=slopes,
                                    data=b.term_ty.data, axes=b.axes))
        else:
            biases.append(BiasFacts("gate", bias_source(b), init_log_gate=_init_value(b.log_gate, env),
                                    data=b.data))
    train_length = s.train.get("context")
    lengths = _lengths(s)
    facts = SchemeFacts(
        name=s.name, heads=s.heads, head_dim=s.head_dim, layout=s.layout,
        train_length=train_length if isinstance(train_length, int) else None,
        params=dict(s.params), groups=groups, biases=biases, axes=s.axes,
        temperature=None if s.temperature is None else to_source(s.temperature),
        temperature_at=temperature_at(s, [n - 1 for n in lengths]) if s.temperature is not None else [],
        shape=attention_words(s),  # the records' words: the window, the sink, the soft cap ...
        normalize=weights_words(s),
        contextual="none" if s.contextual is None else s.contextual.describe(),
        cope_max_pos=None if s.contextual is None else s.contextual.max_pos,
        relative=None if s.relative is None else (s.relative.kind, s.relative.rows,
                                                  int(s.relative.c2p) + int(s.relative.p2c)),
    )
    if graph:
        from pedsl.compiler import compile_graph  # on use: networkx only when the graph is asked for

        try:
            g = compile_graph(s)
            plan = g.graph["plan"]
            facts.graph, facts.backend, facts.backend_note = g, plan.backend, plan.backend_why
        except PedslError as err:
            facts.compile_error = str(err)
    return facts


def _lengths(s: Scheme) -> list[int]:
    lengths = s.eval.get("lengths")
    lt = s.train.get("context")
    if isinstance(lengths, list) and lengths and all(isinstance(n, int) and n > 0 for n in lengths):
        out = list(lengths)
    elif isinstance(lt, int) and lt > 0:
        out = [lt * m for m in (1, 2, 4, 8, 16)]
    else:
        out = [128, 512, 2048, 8192]
    return sorted(set(out))[:6]


# ---------------------------------------------------------------------- descriptions


def fmt_num(v: float | None) -> str:
    if v is None:
        return "?"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if abs(v) >= 1e5 or (v != 0 and abs(v) < 1e-3):
        return f"{v:.3g}"
    return f"{v:.4g}"


def describe_rotation(g: GroupFacts, head_dim: int, layout: str, where: bool = True) -> str:
    """One phrase for what a group's transport does."""
    who = {"qk": "q, k", "qkv": "q, k, v"}.get(g.targets or "", "")
    where_ = (f"all {head_dim} channels" if len(g.channels) == head_dim
             else f"{len(g.channels)} of {head_dim} channels ({ranges(g.channels)})")
    if g.kind == "rotate":
        how = "rotated by position (RoPE form" + (", table recomputed for each length n)" if g.dynamic else ")")
        if g.scale != 1:
            how += f" and scaled by {g.scale:.4g} (the group's logits x {g.scale ** 2:.4g})"
        if g.xpos is not None:
            how += (f" with xPos's decay zeta_k^((i - j) / {g.xpos[0]:g}) per pair (zeta {g.xpos[1]:g}: the "
                    "slowest pairs decay least)")
    elif g.kind == "accumulate_rotation":
        if g.freqs is not None:
            how = "rotated by accumulated constant steps (= RoPE)"
        else:
            src = "learned " if g.learned else "random "
            src += "token-dependent" if g.data else "position-indexed"
            how = f"rotated by accumulated {src} steps"
    elif g.kind == "dense_rotation":
        how = ("rotated by a learned dense rotation of the position, R(p) = P^T expm(sum_a p_a A_a) P ("
               + ("relative: the generators commute)" if g.commuting else "absolute: the generators need not commute)"))
    else:
        how = "transported by accumulated Householder steps (PaTH" + (", orthogonal)" if g.orthogonal else ")")
    pairing = "" if g.kind == "dense_rotation" else f", {layout} pairing"  # blocks of consecutive channels, no pairs
    return f"{who} {how} on {where_}{pairing}" if where else f"{who} {how}"


def describe_freqs(g: GroupFacts, train_length: int | None) -> str | None:
    periods = g.periods
    if periods is None:
        if g.spread is not None:
            mix = [2 / s**2 if s > 0 else math.inf for s in g.spread]
            drift = any(abs(m) > 0 for m in (g.mean or ()))
            return (f"step spread {fmt_num(max(g.spread))} .. {fmt_num(min(g.spread))} rad per token, each pair "
                    f"mixes within {fmt_num(min(mix))} .. {fmt_num(max(mix))} tokens"
                    + ("; the steps drift with a mean (RoPE-like)" if drift else "; zero-mean (a spectral gap)"))
        return None
    text = f"periods {fmt_num(min(periods))} .. {fmt_num(max(periods))} tokens over {g.pairs} pairs"
    if train_length:
        done = sum(p <= train_length for p in periods)
        text += f"; {done} of {g.pairs} complete a cycle within the training length {train_length}"
    return text


def describe_bias(b: BiasFacts) -> str:
    if b.kind == "distance":
        if b.slopes is not None:
            return (f"linear distance bias (ALiBi form) {b.source}: slope per head "
                    + ", ".join(fmt_num(x) for x in b.slopes))
        if b.axes:
            return (f"distance bias {b.source} over the signed distances along {', '.join(b.axes)} (evaluated per "
                    "pair of tokens; without per-axis positions every axis reads i - j)")
        return f"distance bias {b.source} (not linear in the distance)"
    text = f"data-dependent forget gate (FoX form) {b.source}"
    if b.init_log_gate is not None and b.init_log_gate < 0:
        half = math.log(0.5) / b.init_log_gate
        text += (f"; at init log f = {fmt_num(b.init_log_gate)} per token "
                 f"(half the mass forgotten in ~{half:.0f} tokens)")
    return text


def describe_temperature(f: SchemeFacts) -> str:
    if f.temperature is None:
        return "none (tau = 1)"
    vals = []
    distinct = {repr(v) for _, v in f.temperature_at}
    if len(distinct) == 1 and f.temperature_at and not isinstance(f.temperature_at[0][1], tuple):
        return f"{f.temperature}: tau = {fmt_num(f.temperature_at[0][1])} at every length (constant)"
    for i, v in f.temperature_at:
        shown = "[" + ", ".join(fmt_num(x) for x in v) + "]" if isinstance(v, tuple) else fmt_num(v)
        vals.append(f"{shown} at {i + 1}")
    return f"{f.temperature}: tau = " + ", ".join(vals) if vals else f.temperature


def describe_axes(f: SchemeFacts) -> str:
    """The position axes and which pairs of each rotating group read which axis."""
    if not f.axes:
        return "one axis (positions (B, L))"
    groups = "; ".join(f"[{g.name}] {axis_runs(g.pair_axes)}" for g in f.rotating if g.pair_axes)
    return f"axes {', '.join(f.axes)} (positions ({len(f.axes)}, B, L))" + (f": {groups}" if groups else "")
