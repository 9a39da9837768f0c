"""The resolved IR: one scheme after imports, `extends` and parameters, checked.

This is what :func:`pedsl.load` returns and what the compiler, `show`, `diff`
and `explain` consume. Frozen Pydantic models with ``extra="forbid"`` and
discriminated unions for transports and biases; ``pedsl schema`` prints their
JSON Schema. Expressions keep parameter names (their values are in
``params``); ``let`` definitions are inlined. Every expression is stored with its
type (``*_ty``: a :class:`~pedsl.lang.types.Ty` with its kind, axes and what it reads,
computed once by the checker); its dependence class ``.dep`` (docs/semantics.md §1a)
is what the compiler, ``graph``, ``diff`` and the linter decide by.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from pedsl.lang.ast import Expr
from pedsl.lang.exprs import to_source
from pedsl.lang.types import Dep, Ty


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChannelGroup(_Frozen):
    name: str
    channels: tuple[int, ...]
    spec: str  # the source spec, canonically formatted (e.g. "quarters(1, 3)")


class RotateTransport(_Frozen):
    """Position-indexed phase rotation: T(j->i) = R(phase(j) - phase(i)) per pair (docs/semantics.md §2a)."""

    kind: Literal["rotate"] = "rotate"
    targets: Literal["qk", "qkv"]
    group: str
    phase: Expr
    phase_ty: Ty
    # q and k of the group are multiplied by scale (HF's attention factor on cos and sin): the
    # group's share of the logit scales by scale^2, the other channels' does not
    scale: float = 1.0
    scale_expr: Expr | None = None  # the scale as written (lets inlined), None when absent
    # xpos(phase, gamma, zeta): pair k of q times zeta_k^(i / gamma), of k times zeta_k^(-j / gamma)
    # (docs/semantics.md §2c); None for a plain rotation
    xpos_gamma: float | None = None
    xpos_zeta: float | None = None

    @property
    def dynamic(self) -> bool:
        """The table depends on the run-time length n."""
        return self.phase_ty.runtime

    @property
    def reads(self) -> frozenset[Dep]:
        return self.phase_ty.reads


class RotationSteps(_Frozen):
    """Accumulated SO(2) steps: M_t rotates pair k by -angle(t, k) (docs/semantics.md §2b)."""

    kind: Literal["accumulate_rotation"] = "accumulate_rotation"
    targets: Literal["qk", "qkv"]
    group: str
    angle: Expr
    angle_ty: Ty

    @property
    def data(self) -> bool:
        """Depends on the tokens or the hidden state."""
        return self.angle_ty.data

    @property
    def learned(self) -> bool:
        return self.angle_ty.learned

    @property
    def reads(self) -> frozenset[Dep]:
        return self.angle_ty.reads


class HouseholderSteps(_Frozen):
    """Accumulated Householder-like steps M_t = I - beta_t w_t w_t^T (PaTH)."""

    kind: Literal["accumulate_householder"] = "accumulate_householder"
    targets: Literal["qk", "qkv"]
    group: str
    w: Expr
    beta: Expr
    w_ty: Ty
    beta_ty: Ty
    orthogonal: bool = False  # beta is the constant 2 (or 0)

    @property
    def reads(self) -> frozenset[Dep]:
        return self.w_ty.reads | self.beta_ty.reads

    @property
    def data(self) -> bool:
        return self.w_ty.data or self.beta_ty.data

    @property
    def learned(self) -> bool:
        return Dep.LEARNED in self.reads


class DenseRotation(_Frozen):
    """A rotation of the group's channels by the token's own position p = (p_1 .. p_A), one coordinate per axis
    (docs/semantics.md §2e): ``R(p) = P^T expm(sum_a p_a A_a) P`` with learned skew-symmetric generators A_a,
    block-diagonal in blocks of ``block`` consecutive channels of the group. ``mode``: ``independent`` (one
    generator per axis: LieRE; relative only where they commute), ``shared`` (``A_a = lambda_a A``: ComRoPE-LD),
    ``split`` (the blocks dealt to the axes in contiguous runs: ComRoPE-AP); ``basis``: P the Cayley transform
    of a learned skew-symmetric S (STRING), else the identity. q_i and k_j are rotated by R(p_i), R(p_j)."""

    kind: Literal["dense_rotation"] = "dense_rotation"
    targets: Literal["qk"]
    group: str
    block: int  # channels per block (the group's width for one dense block)
    mode: Literal["independent", "shared", "split"] = "independent"
    basis: bool = False
    per_head: bool = False
    init: float = 0.1
    axes: int = 1  # position coordinates the rotation reads (the scheme's axes; 1 without an axes statement)

    @property
    def commuting(self) -> bool:
        """The generators commute (every 2 x 2 skew-symmetric block commutes), so R(p_i)^T R(p_j) = R(p_j - p_i)."""
        return self.mode != "independent" or self.block == 2 or self.axes == 1

    @property
    def reads(self) -> frozenset[Dep]:
        return frozenset({Dep.POSITION, Dep.LEARNED})

    def source(self) -> str:
        """The call as it would be written (defaults left out)."""
        args = [f"block = {self.block}"]
        args += [f"{f} = true" for f, on in (("shared", self.mode == "shared"), ("split", self.mode == "split"),
                                             ("basis", self.basis)) if on]
        args += ["per = head"] * self.per_head + ([f"init = {self.init:g}"] if self.init != 0.1 else [])
        return "dense_rotation(" + ", ".join(args) + ")"


Transport = Annotated[Union[RotateTransport, RotationSteps, HouseholderSteps, DenseRotation],
                      Field(discriminator="kind")]


class DistanceBias(_Frozen):
    """b(i, j) = term(head, d = i - j). ``slope`` is set when the term is slope * d (ALiBi-like).

    ``axes``: the declared position axes whose distances the term reads (``distance.h``: the signed
    ``i_h - j_h``), in the order of the ``axes`` statement; () for a term over the one-axis distance.
    A term over per-axis distances is evaluated per (query, key) pair (docs/semantics.md §3a) and never
    has a slope."""

    kind: Literal["distance"] = "distance"
    term: Expr
    term_ty: Ty
    slope: Expr | None = None
    axes: tuple[str, ...] = ()

    @property
    def reads(self) -> frozenset[Dep]:
        return self.term_ty.reads


class GateBias(_Frozen):
    """b(i, j) = sum_{s = j+1 .. i} log_gate(s, head) (forget gate, FoX)."""

    kind: Literal["gate"] = "gate"
    log_gate: Expr
    log_gate_ty: Ty

    @property
    def data(self) -> bool:
        """Depends on the tokens or the hidden state."""
        return self.log_gate_ty.data

    @property
    def reads(self) -> frozenset[Dep]:
        return self.log_gate_ty.reads


Bias = Annotated[Union[DistanceBias, GateBias], Field(discriminator="kind")]


class ContextualPositions(_Frozen):
    """CoPE (Golovneva et al. 2024; docs/semantics.md §1c): key j of query i sits at the contextual position
    ``p(i, j) = sum over the visible keys t, j <= t <= i, of sigmoid(s(i, t))`` (s: the logit before this
    term), clamped to ``max_pos - 1``; the logit gains ``q_i . e[p(i, j)]``, e a learned (max_pos, head_dim)
    table (one per head unless shared) read between its integer rows by linear interpolation."""

    kind: Literal["cope"] = "cope"
    max_pos: int
    shared: bool = True

    def source(self) -> str:
        """The statement's value as it would be written (``shared = true`` is the default, left out)."""
        return f"cope(max_pos = {self.max_pos}" + ("" if self.shared else ", shared = false") + ")"

    def describe(self) -> str:
        """In words, for diff summaries and explain."""
        return (f"CoPE: gated counts sum_(t = j..i) sigmoid(s(i, t)), clamped to {self.max_pos - 1}, "
                f"+ q_i . e[p] (e: {self.max_pos} x head_dim, " + ("shared by the heads)" if self.shared
                                                                  else "one per head)"))


class RelativeTerms(_Frozen):
    """Content-position terms (docs/semantics.md §3b): the raw score of (i, j) gains
    ``(q_i + v_h) . P_h[r(i - j)] + k_j . Q_h[r(i - j)] + u_h . k_j`` before the scale, P and Q tables over a
    row index r of the signed distance. ``shaw``: P a learned (2K + 1, head_dim) table shared by the heads,
    r = clip(j - i, -K, K) + K (Shaw et al. 2018); ``transformer_xl``: P = sinusoid(i - j) W_R with W_R a
    learned (dim, heads * head_dim) map, u and v learned per head (Dai et al. 2019); ``deberta``: P (c2p) and
    Q (p2c) learned (2 buckets, heads, head_dim) tables read at DeBERTa-v2's log bucket of i - j, the scale
    1 / sqrt(head_dim (1 + terms)) (He et al. 2021; Hugging Face's DebertaV2)."""

    kind: Literal["shaw", "transformer_xl", "deberta"]
    max_distance: int = 0  # shaw: K; deberta: max_relative_positions
    dim: int = 0  # transformer_xl: the sinusoid's width
    buckets: int = 0  # deberta: position_buckets (the tables have 2 * buckets rows)
    c2p: bool = True  # q_i . P[r]
    p2c: bool = False  # k_j . Q[r] (deberta)

    def source(self) -> str:
        """The statement's value as it would be written."""
        if self.kind == "shaw":
            return f"shaw(max_distance = {self.max_distance})"
        if self.kind == "transformer_xl":
            return f"transformer_xl(dim = {self.dim})"
        flags = "" if self.c2p and self.p2c else f", c2p = {str(self.c2p).lower()}, p2c = {str(self.p2c).lower()}"
        return f"deberta(buckets = {self.buckets}, max_distance = {self.max_distance}{flags})"

    def describe(self) -> str:
        """In words, for diff summaries, explain and the plan."""
        if self.kind == "shaw":
            return (f"Shaw relative keys: + q_i . a[clip(j - i, -{self.max_distance}, {self.max_distance})] "
                    f"(a: {2 * self.max_distance + 1} x head_dim learned, shared by the heads)")
        if self.kind == "transformer_xl":
            return (f"Transformer-XL terms: + (q_i + v) . R(i - j) W_R + u . k_j (R: sinusoid of width {self.dim}; "
                    "W_R, u, v learned)")
        terms = " + ".join(t for t, on in (("c2p q_i . Kr[r]", self.c2p), ("p2c k_j . Qr[r]", self.p2c)) if on)
        return (f"DeBERTa disentangled terms: + {terms}, r the log bucket of i - j ({self.buckets} buckets up to "
                f"{self.max_distance}), scale 1 / sqrt({self.scale_factor} head_dim)")

    @property
    def rows(self) -> int:
        """Rows of the learned tables (transformer_xl: the sinusoid's width, W_R's rows)."""
        return {"shaw": 2 * self.max_distance + 1, "transformer_xl": self.dim, "deberta": 2 * self.buckets}[self.kind]

    @property
    def scale_factor(self) -> int:
        """The raw scores are divided by sqrt(scale_factor * head_dim): DeBERTa's 1 + its terms, else 1."""
        return 1 + int(self.c2p) + int(self.p2c) if self.kind == "deberta" else 1


class Regime(_Frozen):
    """One regime of a remapped rotation (docs/semantics.md §2d): the pairs whose distance d = p_i - p_j lies in
    ``low <= d < high`` (``high`` None: no end) rotate q_i at ``query(p_i)`` and k_j at ``key(p_j)``, both
    functions of the token's own position (lets inlined)."""

    low: int
    high: int | None
    query: Expr
    key: Expr
    bounds: str  # the predicate as written, e.g. "distance >= w"

    def source(self) -> str:
        """The regime as it would be written (positions equal to ``position`` left out)."""
        own = [f"{n} = {to_source(e)}" for n, e in (("query", self.query), ("key", self.key))
               if not (e.kind == "name" and e.id == "position")]
        return self.bounds + (": " + ", ".join(own) if own else "")


class Remap(_Frozen):
    """The rotation's positions as a function of (i, j): regimes that partition the distances 0, 1, 2, ...
    (ReRoPE, Leaky ReRoPE, Self-Extend), or with ``chunk`` = c the chunk differences
    ``floor(p_i / c) - floor(p_j / c)`` 0, 1, 2, ... (Dual Chunk Attention): a regime's ``low`` / ``high``
    then bound that difference."""

    regimes: tuple[Regime, ...]
    chunk: int | None = None

    def source(self) -> str:
        head = "remap" if self.chunk is None else f"remap(chunk = {self.chunk})"
        return head + " { " + "; ".join(r.source() for r in self.regimes) + " }"


MASK_KINDS = ("causal", "bidirectional", "prefix", "spans")


class AttentionMask(_Frozen):
    """Which pairs of tokens see each other both ways (docs/semantics.md §11a). Every pair j <= i (token order,
    inside a document, neither padded) is visible; j > i is visible too where the mask says: ``bidirectional``
    every pair, ``prefix`` the pairs whose positions are both below ``prefix`` (the first N tokens of each
    document), ``spans`` the pairs whose run-time ``span_ids`` are equal and nonzero. ``causal``: none."""

    kind: Literal["causal", "bidirectional", "prefix", "spans"] = "causal"
    prefix: int | None = None  # kind "prefix": N

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    def source(self) -> str:
        """The statement's value as it would be written."""
        return f"prefix({self.prefix})" if self.kind == "prefix" else self.kind

    def describe(self) -> str | None:
        """In words, for explain and the diff summary (None: causal, said by default)."""
        return {"causal": None, "bidirectional": "bidirectional (every token sees every token)",
                "prefix": f"prefix-LM (the first {self.prefix} positions see each other both ways)",
                "spans": "causal, with run-time span_ids whose tokens see each other both ways"}[self.kind]


Layout = Literal["halves", "interleaved"]
Normalizer = Literal["softmax", "softmax1", "sigmoid", "stick_breaking", "differential"]
SinkKind = Literal["logit", "token"]


class Scheme(_Frozen):
    name: str
    doc: str = ""
    file: str | None = None
    bases: tuple[str, ...] = ()  # the extends chain, nearest first
    params: dict[str, Any] = Field(default_factory=dict)
    heads: int
    head_dim: int
    layout: Layout = "halves"
    axes: tuple[str, ...] = ()  # the named axes of the positions (`axes t, h, w`); () = one unnamed axis
    groups: tuple[ChannelGroup, ...] = ()
    transports: tuple[Transport, ...] = ()
    biases: tuple[Bias, ...] = ()
    temperature: Expr | None = None
    temperature_ty: Ty | None = None
    # how scores become weights (docs/semantics.md §1b): softmax; softmax1 (a logit 0 pinned in the denominator);
    # sigmoid(s + sigmoid_bias) with no sum over the keys (Ramapuram et al. 2024); or stick-breaking (Tan et
    # al. 2024), where attend_current says whether a query's own key takes part (True: A_ii = sigmoid(s_ii))
    # or differential attention (Ye et al. 2024): heads h and h + heads/2 share the weights a_h - lambda a_{h+heads/2},
    # lambda learned from lambda_init
    normalize: Normalizer = "softmax"
    attend_current: bool = True
    sigmoid_bias: float = 0.0
    lambda_init: float = 0.8
    contextual: ContextualPositions | None = None  # score-dependent positions (CoPE), added to the logits
    relative: RelativeTerms | None = None  # content-position terms (Shaw, Transformer-XL, DeBERTa)
    # the attention's shape (docs/semantics.md §11): key j is visible to query i iff 0 <= p_i - p_j < window,
    # or iff p_i // chunk == p_j // chunk; sink: a learned logit per head in the normaliser, or a learned
    # key/value slot every query sees
    window: int | None = None
    chunk: int | None = None
    # which pairs see each other both ways (docs/semantics.md §11a); with a non-causal mask a window is
    # symmetric, |p_i - p_j| < window, and a distance reads |p_i - p_j|
    mask: AttentionMask = Field(default_factory=AttentionMask)
    sink: SinkKind | None = None
    # logit soft-capping (Gemma 2's attn_logit_softcapping): every score s (after scale, temperature and
    # bias) becomes softcap * tanh(s / softcap) before the mask and the softmax
    softcap: float | None = None
    # the rotation's positions per regime of the distance (docs/semantics.md §2d), None: each token's own
    remap: Remap | None = None
    # the values of the statements carried without a field above (pedsl.lang.statements.CARRIED), by name: read
    # as attributes of the scheme (``scheme.<name>``), the declared default where absent
    settings: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    allow: tuple[str, ...] = ()
    source: str = Field(default="", repr=False)
    source_hash: str = ""
    # set on a scheme whose body is a `layers { ... }` block: its parts per layer (then transports, biases
    # and temperature are empty: each layer's attention is its part's)
    layers: "LayerMap | None" = None

    def __getattr__(self, name: str) -> Any:
        """A carried statement value without a field of its own (from ``settings``), else pydantic's lookup."""
        from pedsl.lang.statements import CARRIED  # the registry reads the syntax IR this module's siblings build

        declared = next((c for c in CARRIED if c.name == name), None)
        if declared is None or name in type(self).model_fields:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's own (private attributes, errors)
        return self.__dict__.get("settings", {}).get(name, declared.default)

    @property
    def value_transport(self) -> bool:
        return any(t.targets == "qkv" for t in self.transports)

    @property
    def reads(self) -> frozenset[Dep]:
        """Every run-time input the scheme reads (docs/semantics.md §1a)."""
        out = frozenset().union(*(t.reads for t in (*self.transports, *self.biases)))
        return out | (self.temperature_ty.reads if self.temperature_ty is not None else frozenset())

    @property
    def needs_x(self) -> bool:
        return Dep.DATA in self.reads

    @property
    def needs_tokens(self) -> bool:
        return Dep.TOKEN in self.reads

    def group(self, name: str) -> ChannelGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)



# ------------------------------------------------------------------ per-layer schemes

LAYER_RULES = ("pattern", "default", "every", "first", "last", "at")
# precedence of the rules, highest first (docs/semantics.md "Per-layer schemes"): a layer takes the part of
# the highest tier whose rule names it; two rules of one tier may not both name a layer (E243)
LAYER_TIERS = {"at": 0, "first": 1, "last": 1, "every": 2, "pattern": 3, "default": 3}


class LayerRule(_Frozen):
    """One rule of a ``layers`` block. ``parts``: the part for every other rule; for ``pattern`` the
    cycle written out (``[a * 2, b]`` is ``(a, a, b)``). ``n``: k of ``every(k)``, n of ``first(n)`` /
    ``last(n)``. ``layers``: the 0-based layers of ``at([...])``. ``line``/``col``: where it is written,
    for the diagnostics that need the model's layer count."""

    rule: Literal["pattern", "default", "every", "first", "last", "at"]
    parts: tuple[str, ...]
    n: int = 0
    layers: tuple[int, ...] = ()
    line: int = 0
    col: int = 0

    def names(self, layer: int, count: int) -> bool:
        """Whether this rule assigns ``layer`` (0-based) of a model of ``count`` layers."""
        if self.rule in ("pattern", "default"):
            return True
        if self.rule == "every":
            return (layer + 1) % self.n == 0
        if self.rule == "first":
            return layer < self.n
        if self.rule == "last":
            return layer >= count - self.n
        return layer in self.layers

    def part(self, layer: int) -> str:
        return self.parts[layer % len(self.parts)] if self.rule == "pattern" else self.parts[0]

    @property
    def text(self) -> str:
        """The rule as written (canonically)."""
        if self.rule == "pattern":
            runs: list[list] = []
            for p in self.parts:
                if runs and runs[-1][0] == p:
                    runs[-1][1] += 1
                else:
                    runs.append([p, 1])
            return "pattern = [" + ", ".join(p if k == 1 else f"{p} * {k}" for p, k in runs) + "]"
        arg = {"default": "", "at": "([" + ", ".join(map(str, self.layers)) + "])"}.get(self.rule, f"({self.n})")
        return f"{self.rule}{arg} = {self.parts[0]}"


class LayerMap(_Frozen):
    """The ``layers`` block of a scheme: its rules and every part, resolved (each an ordinary scheme).
    ``count`` is the model's layer count when it was known at resolution (``-P layers=N`` or the model)."""

    rules: tuple[LayerRule, ...]
    parts: dict[str, "Scheme"]
    count: int | None = None

    def rule_for(self, layer: int, count: int) -> LayerRule | None:
        """The rule that gives ``layer`` its part (the highest tier naming it), or None when none does."""
        named = [r for r in self.rules if r.names(layer, count)]
        return min(named, key=lambda r: LAYER_TIERS[r.rule]) if named else None

    def assign(self, count: int) -> tuple[str, ...]:
        """The part of each layer of a ``count``-layer model (call after the fit is checked)."""
        out = []
        for layer in range(count):
            rule = self.rule_for(layer, count)
            if rule is None:
                raise ValueError(f"layer {layer} has no part")  # the checker reports this first (E244)
            out.append(rule.part(layer))
        return tuple(out)


Scheme.model_rebuild(_types_namespace={"LayerMap": LayerMap})
