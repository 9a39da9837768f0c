"""The statement registry: one record per statement of a scheme's body, and everything the tools read off it.

A statement (``window = 512``, ``softcap = 50.0``, ``axes t, h, w`` ...) is written once here: its grammar
rule (``grammars/pe.lark``, which stays hand-written and is checked against these records), the syntax IR
node it parses to, how ``extends`` merges it, its canonical text (the formatter), the expressions it reads
(the unused-``let`` lint), where its value lands on the resolved :class:`~pedsl.lang.scheme.Scheme`, how
``pedsl show`` renders it and ``pedsl diff`` compares it, its completion snippet and its highlighting, and
(as data: the compiler reads the scheme, not this table) the plan field the compiler lowers it to. The
consumers - parser, inherit, formatter, lint, diff, render, the LSP's scan and completion, the Pygments
lexer and the editor grammar (``python -m tools.doc_tables``) - iterate :data:`RECORDS` instead of naming
statements; ``compiler_tests/lang/test_statement_records.py`` fails on a record missing a part, on a
consumer that names a statement's keyword, and on a grammar statement without a record.

Some statements are the scheme's skeleton (``param``, ``let``, ``channels``, the ``qk``/``qkv``
transports, ``train``/``eval``, ``allow``, ``layers``): their merge, render and diff are structure (match
by name, blocks, the layer map) written once in their consumer, and their record says so with
:data:`BY_CONSUMER` for that part instead of a function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pedsl.lang import ast
from pedsl.lang.builtins import WARNINGS
from pedsl.lang.exprs import to_source
from pedsl.limits import MAX_LENGTH

# How `extends` merges a statement (pedsl.lang.inherit.merge):
BY_NAME = "by name"  # param, let: the child's overrides the base's of that name
ONE = "one"  # at most one per scheme: the nearest in the chain wins, whole
SET = "set"  # the transports: a child with any replaces all of its base's
KEYED = "keyed"  # train / eval: entry by entry, into the table its keyword names
APPEND = "append"  # allow: every scheme's, all kept
OWN = "own"  # layers: not merged; pedsl.lang.layers reads the chain itself
INHERIT_MODES = (BY_NAME, ONE, SET, KEYED, APPEND, OWN)

# A part that the consumer writes as structure (matching by name, blocks, the layer map), said explicitly
BY_CONSUMER = "by its consumer's structure code"

# Highlight classes: the Pygments token and the TextMate scope of a statement's keyword
HIGHLIGHT = {"keyword": ("Keyword", "keyword.other.statement.pedsl")}
# Words the language fixes that start no statement (also highlighted as keywords, reserved as names)
FIXED_KEYWORDS = ("scheme", "extends", "import", "on")
FIXED_WORDS = ("true", "false", "int", "float", "bool", "str")  # and the records' choices


@dataclass(frozen=True)
class Show:
    """How ``pedsl show`` renders the statement's resolved value: ``lines(scheme)`` (none when absent);
    ``place`` is ``header`` (with the scheme's shape, before its parameters) or ``body`` (after the biases)."""

    place: str
    lines: Callable[[Any], list[str]]


@dataclass(frozen=True)
class Diff:
    """How ``pedsl diff`` compares it: ``value(scheme)`` is the compared value at path ``path``; ``optional``:
    a scheme may lack it (Insert / Remove, ``shown`` as ``show(value)``), else always compared (Update / Keep);
    ``expr``: the value is an expression, compared after the parameter renames as its source text.
    ``place`` as :class:`Show`'s; within the body, edits come out by ``rank`` (then in registry order)."""

    path: str
    value: Callable[[Any], Any]
    place: str = "body"
    optional: bool = True
    show: Callable[[Any], Any] = lambda v: v
    expr: bool = False
    rank: int = 0


@dataclass(frozen=True)
class Words:
    """The statement in words, for ``pedsl explain``'s and the diff summary's attention line: ``text(scheme)``
    (None when the scheme lacks it); ``sees``: it says which keys a query sees (without one: causal), else
    it is said after them."""

    text: Callable[[Any], str | None]
    sees: bool = False


@dataclass(frozen=True)
class Carried:
    """A value a statement lowers to, declared once and carried by its name end to end: read off the resolved
    scheme (``read``; None: its attribute ``name``), recorded on the plan (``Plan.<name>``), supplied to the
    general forward as the scheme side's attribute ``name`` (``ModuleScheme`` in process; a generated module's
    constant ``NAME`` and class attribute), and named as a kernel feature when it is not ``default``:
    ``feature`` (formatted with the value, or a mapping from values to names). A fused kernel computes that
    feature only if its ``KernelDecl`` takes it, so a new statement's value runs on the general path until one
    declares it. ``feature`` None: no feature of its own (a detail read wherever another field's feature is
    computed; said in ``why``)."""

    name: str
    type: type  # int, float, bool or str: the value's type (None stays None), a generated module's literal
    default: Any
    feature: str | Mapping[Any, str] | None
    read: Callable[[Any], Any] | None = None
    why: str = ""  # feature None: why every kernel computes it

    def value_of(self, scheme: Any) -> Any:
        """The value on a resolved scheme, of its declared type."""
        value = getattr(scheme, self.name) if self.read is None else self.read(scheme)
        return None if value is None else self.type(value)

    def feature_of(self, value: Any) -> str | None:
        """The kernel feature of ``value`` (None at the default, or for a field with no feature of its own)."""
        if self.feature is None or value == self.default:
            return None
        if isinstance(self.feature, str):
            return self.feature.format(value)
        return self.feature[value]  # a value the mapping lacks is a bug of its record, never a kernel that ignores it


@dataclass(frozen=True)
class Known:
    """A ``KEYWORD = expr`` statement whose value is a number known when the scheme is checked (a literal, a param,
    arithmetic on them; ``none`` drops an inherited one), checked by the resolver's one rule for such values
    (``resolve_known``, E218): of ``type`` (int or float), within ``low`` .. ``high``, and beside one of the
    statements whose values ``needs`` names (without one it would change nothing)."""

    type: type
    low: float
    high: float
    needs: tuple[str, ...] = ()
    hint: str = ""  # how to write it


@dataclass(frozen=True)
class Statement:
    """One statement of a scheme's body. ``completions``: (keyword, snippet, what it does) for each keyword
    that starts it (most have one; the transports ``qk`` and ``qkv``, the sections ``train`` and ``eval``)."""

    rule: str  # the grammar rule (grammars/pe.lark) and the parser's method of that name
    kind: str  # the syntax IR's `kind` (pedsl.lang.ast)
    node: type  # the syntax IR class
    completions: tuple[tuple[str, str, str], ...]
    inherit: str  # one of INHERIT_MODES
    merged: str  # the attribute of pedsl.lang.inherit.Merged that holds it ("" where KEYED: its keyword's)
    fields: tuple[str, ...]  # the attributes of the resolved Scheme its value lands on
    form: Callable[[Any], str] | None  # its one canonical line (the formatter); None for a block
    # a block: (head, items, an item's value; None: the item is written by the formatter's own rule)
    block: Callable[[Any], tuple[str, tuple, Callable | None]] | None
    reads: Callable[[Any], list]  # the expressions it reads (the unused-`let` lint, W105)
    show: Show | str  # pedsl show (or BY_CONSUMER)
    diff: Diff | str  # pedsl diff (or BY_CONSUMER)
    words: Words | str  # the attention line of pedsl explain and the diff summary (or BY_CONSUMER: its own section)
    plan_fields: tuple[str, ...] = ()  # data only: the fields of pedsl.compiler.plan.Plan it lowers to
    carried: tuple[Carried, ...] = ()  # its plain values, carried to the plan, the forward and the features by name
    completes: tuple[str, ...] = ()  # the builtin categories offered for its value (LSP completion)
    choices: tuple[str, ...] = ()  # the fixed words its keyword takes (`layout halves`), not an expression
    # the Resolver's method that checks it and returns its value, (env, lets, transports) -> value, called after the
    # transports and the window; "" where pedsl.lang.resolve resolves it with others (its own code there)
    resolve: str = ""
    known: Known | None = None  # a number checked by the resolver's one rule (then no `resolve` of its own)
    assign: bool = False  # `KEYWORD = expr`: the parser builds `node(kind, value, span)` from the record
    highlight: str = "keyword"  # a key of HIGHLIGHT
    reserved: bool = True  # its keyword may not name a param, a let or a scheme
    frequencies: bool = False  # its keyword's hover adds the scheme's frequency table (a rotation's)

    @property
    def keywords(self) -> tuple[str, ...]:
        return tuple(k for k, _, _ in self.completions)

    def hover(self, keyword: str) -> str:
        """The LSP's hover on the keyword (one of :attr:`keywords`): the keyword and what it does."""
        doc = next(d for k, _, d in self.completions if k == keyword)
        return f"`{keyword}`: {doc}"


# ---------------------------------------------------------------- the parts


def _assign_form(st: Any) -> str:
    return f"{st.kind} = {to_source(st.value)}"


def _value(st: Any) -> list:
    return [st.value]


def _none(st: Any) -> list:
    return []


def _param_form(st: Any) -> str:
    cons = ""
    if st.constraints:
        cons = " (" + ", ".join(f"{c.op} {to_source(c.value)}" for c in st.constraints) + ")"
    return f"param {st.name}: {st.type}{cons} = {to_source(st.default)}"


def _transport_form(st: Any) -> str:
    on = f" on {st.group}" if st.group else ""
    return f"{st.targets}{on}: {to_source(st.value)}"


def _bias_lines(s: Any) -> list[str]:
    if not s.biases:
        return []
    lines = ["biases:"]
    for b in s.biases:
        if b.kind == "distance":
            lines.append("  - kind: distance")
            lines.append(f"    term: {to_source(b.term)}")
            if b.slope is not None:
                lines.append(f"    slope: {to_source(b.slope)}")
            if b.axes:
                lines.append(f"    axes: [{', '.join(b.axes)}]  # signed per-axis distances, evaluated per pair of tokens")
        else:
            lines.append("  - kind: gate")
            lines.append(f"    log_gate: {to_source(b.log_gate)}")
    return lines


def _normalize_lines(s: Any) -> list[str]:
    if s.normalize == "softmax":
        return []
    if s.normalize == "stick_breaking":
        return [f"normalize: {s.normalize}  # own key {'included' if s.attend_current else 'left out'}"]
    return [f"normalize: {_normalizer(s)}"]


def _normalizer(s: Any) -> str:
    """The normalize statement's value as written (``softmax`` when absent; the sigmoid's bias folded)."""
    if s.normalize == "stick_breaking":
        return "stick_breaking" if s.attend_current else "stick_breaking(current = false)"
    if s.normalize == "sigmoid" and s.sigmoid_bias:
        return f"sigmoid(bias = {float(s.sigmoid_bias)!r})"
    if s.normalize == "differential":
        return f"differential(lambda_init = {float(s.lambda_init)!r})"
    return s.normalize


def _contextual(s: Any) -> str | None:
    return None if s.contextual is None else s.contextual.source()


def _relative(s: Any) -> str | None:
    return None if s.relative is None else s.relative.source()


def _remap(s: Any) -> str | None:
    return None if s.remap is None else s.remap.source()


def _regime_reads(st: Any) -> list:
    head = [] if st.chunk is None else [st.chunk.value]
    return head + [x.value for r in st.regimes for x in (*r.bounds, *r.entries)]


def _remap_head(st: Any) -> str:
    """``remap`` or ``remap(chunk = c)``: the opening of the block as written canonically."""
    return "remap" if st.chunk is None else f"remap({st.chunk.name} = {to_source(st.chunk.value)})"


def regime_text(r: Any) -> str:
    """A regime of a ``remap`` block as written canonically (the formatter's line for it)."""
    bounds = ", ".join(f"{b.name} {b.op} {to_source(b.value)}" for b in r.bounds)
    return bounds + (": " + ", ".join(f"{e.name} = {to_source(e.value)}" for e in r.entries) if r.entries else "")


def _shown(field: str, text: Callable[[Any], str] = str) -> Show:
    """A body line ``field: value`` when the scheme has the value."""
    return Show("body", lambda s: [] if getattr(s, field) is None else [f"{field}: {text(getattr(s, field))}"])


def _shape(rule: str, doc: str, snippet: str, words: Words, kind: type = int, **parts: Any) -> Statement:
    """``KEYWORD = N``: a statement of the attention's shape (docs/semantics.md §11), an int (or ``kind``) on the
    scheme and carried under its keyword's name, its own kernel feature (None: absent)."""
    return Statement(rule=rule, kind=rule, node=ast.WindowStmt, completions=((rule, snippet, doc),), inherit=ONE,
                     words=words,
                     merged=rule, fields=(rule,), form=_assign_form, block=None, reads=_value, show=_shown(rule),
                     diff=Diff(rule, lambda s: getattr(s, rule), show=str), carried=(Carried(rule, kind, None, rule),),
                     assign=True, **parts)


# the normaliser's values (kernel features: the normalisers other than softmax, each computed by no fused kernel yet)
_NORMALIZE = (
    Carried("normalize", str, "softmax", {"stick_breaking": "stick-breaking", "sigmoid": "sigmoid weights",
                                          "softmax1": "softmax plus one", "differential": "differential heads"}),
    Carried("attend_current", bool, True, {False: "skips its own key"}),
    Carried("sigmoid_bias", float, 0.0, None, why="the number inside the sigmoid: computed wherever sigmoid weights are"),
    Carried("lambda_init", float, 0.8, None, why="differential attention's constant: computed wherever its heads are"),
)


def _allow_snippet() -> str:
    return "allow ${1|" + ",".join(WARNINGS) + "|}"


# ---------------------------------------------------------------- the records (the order: the formatter's
# grammar order; `pedsl show` renders and the LSP offers them in it)

RECORDS: tuple[Statement, ...] = (
    Statement(
        rule="param", kind="param", node=ast.Param, inherit=BY_NAME, merged="params", fields=("params",),
        completions=(("param", "param ${1:name}: ${2|float,int,bool,str|} = ${3:0}", "a parameter: type, bounds, default"),),
        form=_param_form, block=None, reads=lambda st: [st.default] + [c.value for c in st.constraints],
        show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="let", kind="let", node=ast.Let, inherit=BY_NAME, merged="lets", fields=(),  # inlined where read
        completions=(("let", "let ${1:name} = $0", "a named expression"),), completes=("grid",),
        form=lambda st: f"let {st.name} = {to_source(st.value)}", block=None, reads=_value,
        show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="layout", kind="layout", node=ast.Layout, inherit=ONE, merged="layout", fields=("layout",),
        completions=(("layout", "layout ${1|halves,interleaved|}", "how channels pair up for rotations"),),
        form=lambda st: f"layout {st.value}", block=None, reads=_none, plan_fields=("layout",),
        choices=("halves", "interleaved"),
        show=Show("header", lambda s: [f"layout: {s.layout}"]),
        diff=Diff("layout", lambda s: s.layout, place="header", optional=False), words=BY_CONSUMER),
    Statement(
        rule="axes_decl", kind="axes", node=ast.Axes, inherit=ONE, merged="axes", fields=("axes",),
        completions=(("axes", "axes ${1:h}, ${2:w}",
                      "the named axes of the positions (read as position.h; positions (A, B, L))"),),
        form=lambda st: "axes " + ", ".join(st.names), block=None, reads=_none, plan_fields=("axes",),
        show=Show("header", lambda s: [f"axes: {', '.join(s.axes)}"] if s.axes else []),
        diff=Diff("axes", lambda s: s.axes, place="header", optional=False), words=BY_CONSUMER),
    Statement(
        rule="channels", kind="channels", node=ast.Channels, inherit=ONE, merged="channels", fields=("groups",),
        completions=(("channels", "channels {\n\t${1:rot} = ${2:fraction(0.5)}\n\t${3:plain} = rest\n}",
                      "channel groups"),), completes=("channels",),
        form=None, block=lambda st: ("channels", st.groups, lambda g: g.spec), reads=lambda st: [g.spec for g in st.groups],
        show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="transport", kind="transport", node=ast.Transport, inherit=SET, merged="transports",
        fields=("transports",), plan_fields=("transports",), completes=("transport",), frequencies=True,
        completions=(("qk", "qk: rotate($0)", "a transport of queries and keys"),
                     ("qkv", "qkv: rotate($0)", "a transport of queries, keys and values")),
        form=_transport_form, block=None, reads=_value, show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="bias", kind="bias", node=ast.BiasStmt, inherit=ONE, merged="bias", fields=("biases",),
        completions=(("bias", "bias = $0", "an additive attention bias"),), completes=("bias", "transport"),
        form=_assign_form, block=None, reads=_value, plan_fields=("biases",), assign=True,
        show=Show("body", _bias_lines), diff=BY_CONSUMER, words=BY_CONSUMER),  # terms matched by kind: diffing.edits
    Statement(
        rule="temperature", kind="temperature", node=ast.TemperatureStmt, inherit=ONE, merged="temperature",
        fields=("temperature", "temperature_ty"), plan_fields=("temperature",), completes=("temperature",),
        completions=(("temperature", "temperature = $0", "a per-query logit scale"),),
        form=_assign_form, block=None, reads=_value, assign=True, show=_shown("temperature", to_source),
        diff=Diff("temperature", lambda s: s.temperature, expr=True), words=BY_CONSUMER),
    Statement(
        rule="normalize", kind="normalize", node=ast.NormalizeStmt, inherit=ONE, merged="normalize",
        fields=("normalize", "attend_current", "sigmoid_bias", "lambda_init"), carried=_NORMALIZE,
        completions=(("normalize", "normalize = ${1|softmax,softmax1,sigmoid(bias = -log(train_length)),stick_breaking,"
                      "differential(lambda_init = 0.8)|}",
                      "how scores become weights: softmax, softmax plus one, sigmoid, stick-breaking or differential"),),
        form=_assign_form, block=None, reads=_value, assign=True, reserved=False,  # also a builtin's name
        show=Show("body", _normalize_lines), diff=Diff("normalize", _normalizer, optional=False, rank=1),
        words=BY_CONSUMER),
    Statement(
        rule="contextual", kind="contextual", node=ast.ContextualStmt, inherit=ONE, merged="contextual",
        fields=("contextual",), plan_fields=("contextual",),
        completions=(("contextual", "contextual = cope(max_pos = ${1:16})",
                      "CoPE: positions counted by sigmoid gates on the scores"),),
        form=_assign_form, block=None, reads=_value, assign=True,
        reserved=False,  # never reserved: files that name a param or let `contextual` parse
        show=_shown("contextual", lambda c: c.source()), diff=Diff("contextual", _contextual, rank=1),
        words=BY_CONSUMER),
    Statement(
        rule="relative", kind="relative", node=ast.RelativeStmt, inherit=ONE, merged="relative",
        fields=("relative",), plan_fields=("relative",), resolve="resolve_relative",  # pedsl.lang.relative
        completions=(("relative", "relative = ${1|shaw(max_distance = 16),transformer_xl(dim = 64),"
                      "deberta(buckets = 256\\, max_distance = 512)|}",
                      "content-position terms: Shaw, Transformer-XL or DeBERTa-v2"),),
        form=_assign_form, block=None, reads=_value, assign=True,
        reserved=False,  # never reserved: files that name a param or let `relative` parse
        show=_shown("relative", lambda r: r.source()), diff=Diff("relative", _relative, rank=1),
        words=Words(lambda s: None if s.relative is None else s.relative.describe())),
    _shape("window", "a sliding window: a query sees itself and the N - 1 tokens before it", "window = ${1:512}",
           Words(lambda s: None if s.window is None else f"sliding window of {s.window}", sees=True)),
    _shape("chunk", "chunked attention: a query sees the keys of its chunk of N positions", "chunk = ${1:8192}",
           Words(lambda s: None if s.chunk is None else f"chunks of {s.chunk} positions", sees=True)),
    _shape("keep_first", "StreamingLLM's attention sinks: beside its window or chunk, every query sees the keys at "
           "the first k positions", "keep_first = ${1:4}",
           Words(lambda s: None if s.keep_first is None else f"the keys at the first {s.keep_first} positions",
                 sees=True), reserved=False,  # files that name a param or let `keep_first` parse
           known=Known(int, 1, MAX_LENGTH, needs=("window", "chunk"),
                       hint="keep_first = 4 (StreamingLLM's four sink tokens) beside window = N or chunk = N")),
    Statement(
        rule="mask", kind="mask", node=ast.MaskStmt, inherit=ONE, merged="mask", fields=("mask",),
        carried=(Carried("mask", str, "causal", "mask {}", read=lambda s: s.mask.kind),
                 Carried("mask_prefix", int, None, None, read=lambda s: s.mask.prefix,
                         why="mask = prefix(N)'s N: read wherever the prefix mask is")),
        resolve="resolve_mask",  # pedsl.lang.masks
        completions=(("mask", "mask = ${1|bidirectional,causal,spans|}",
                      "which pairs see each other both ways: causal, bidirectional, prefix(N), spans"),),
        form=_assign_form, block=None, reads=lambda st: list(getattr(st.value, "args", ())), assign=True,
        show=Show("body", lambda s: [] if s.mask.causal else [f"mask: {s.mask.source()}"]),
        diff=Diff("mask", lambda s: None if s.mask.causal else s.mask.source()),
        words=Words(lambda s: s.mask.describe(), sees=True)),
    Statement(
        rule="sink", kind="sink", node=ast.SinkStmt, inherit=ONE, merged="sink", fields=("sink",),
        completions=(("sink", "sink = ${1|logit,token|}", "a learned attention sink: a logit per head, or a key/value slot"),),
        form=lambda st: f"sink = {st.value}", block=None, reads=_none, carried=(Carried("sink", str, None, "sink {}"),),
        show=_shown("sink"), diff=Diff("sink", lambda s: s.sink, show=str),
        words=Words(lambda s: None if s.sink is None else f"learned sink {s.sink}")),
    _shape("softcap", "logit soft-capping (Gemma 2): every score s becomes c * tanh(s / c)", "softcap = ${1:50.0}",
           Words(lambda s: None if s.softcap is None else f"scores soft-capped at {s.softcap:g}"), kind=float,
           resolve="resolve_softcap"),  # pedsl.lang.windows
    Statement(
        rule="remap", kind="remap", node=ast.RemapStmt, inherit=ONE, merged="remap", fields=("remap",),
        plan_fields=("remap",), resolve="resolve_remap",  # pedsl.lang.remap
        completions=(("remap", "remap {\n\tdistance < ${1:w}\n\tdistance >= ${1:w}: query = ${1:w}, key = ${2:0}\n}",
                      "positions remapped by distance regime (ReRoPE, Self-Extend)"),),
        form=None, block=lambda st: (_remap_head(st), st.regimes, None), reads=_regime_reads,
        reserved=False,  # files that name a param or let `remap` parse
        show=_shown("remap", lambda r: "; ".join(x.source() for x in r.regimes)), diff=Diff("remap", _remap, rank=1),
        words=Words(lambda s: None if s.remap is None else "positions remapped per distance regime" if s.remap.chunk
                    is None else f"positions remapped per regime of the chunk difference (chunks of {s.remap.chunk})")),
    Statement(
        rule="section", kind="section", node=ast.Section, inherit=KEYED, merged="", fields=("train", "eval"),
        completions=(("train", "train {\n\tcontext = ${1:train_length}\n}", "training settings"),
                     ("eval", "eval {\n\tlengths = ${1:train_length * [1, 2, 4, 8]}\n}", "evaluation settings")),
        form=None, block=lambda st: (st.section, st.entries, lambda e: e.value), reads=lambda st: [e.value for e in st.entries],
        show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="allow", kind="allow", node=ast.Allow, inherit=APPEND, merged="allow", fields=("allow",),
        completions=(("allow", _allow_snippet(), "silence a lint warning"),),
        form=lambda st: "allow " + ", ".join(st.names), block=None, reads=_none, show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),
    Statement(
        rule="layers", kind="layers", node=ast.Layers, inherit=OWN, merged="", fields=("layers",),
        completions=(("layers", "layers {\n\tpattern = [${1:local} * ${2:5}, ${3:global}]\n}",
                      "a scheme per layer (other schemes by name)"),),
        form=None, block=lambda st: ("layers", st.rules, lambda r: r.value), reads=_none,
        reserved=False,  # `-P layers=N` is the layer count: a scheme may declare `param layers`
        show=BY_CONSUMER, diff=BY_CONSUMER, words=BY_CONSUMER),  # pedsl show writes the layer map; pedsl diff refuses it
)

BY_KIND: dict[str, Statement] = {r.kind: r for r in RECORDS}
BY_RULE: dict[str, Statement] = {r.rule: r for r in RECORDS}
BY_KEYWORD: dict[str, Statement] = {k: r for r in RECORDS for k in r.keywords}
# Keywords that start a statement inside a scheme body, in registry order
STATEMENT_KEYWORDS: tuple[str, ...] = tuple(BY_KEYWORD)
# The words a param, let or scheme may not be named
KEYWORDS: frozenset[str] = frozenset(FIXED_KEYWORDS + FIXED_WORDS + tuple(k for r in RECORDS for k in r.choices)
                                     + tuple(k for r in RECORDS if r.reserved for k in r.keywords))
# Every value a statement carries to the plan and the general forward by name, in registry order
CARRIED: tuple[Carried, ...] = tuple(c for r in RECORDS for c in r.carried)
# The statements `extends` keeps one of (the nearest wins): the attributes of Merged read by name
ONE_FIELDS: tuple[str, ...] = tuple(r.merged for r in RECORDS if r.inherit == ONE)


def highlighted(cls: str) -> tuple[str, ...]:
    """The keywords highlighted as ``cls`` (a key of HIGHLIGHT): the fixed ones with the statements'."""
    return FIXED_KEYWORDS * (cls == "keyword") + tuple(k for r in RECORDS if r.highlight == cls for k in r.keywords)


def shown(scheme: Any, place: str) -> list[str]:
    """The ``pedsl show`` lines of the statements rendered at ``place``, in registry order."""
    return [line for r in RECORDS if isinstance(r.show, Show) and r.show.place == place for line in r.show.lines(scheme)]


def attention_words(scheme: Any) -> str:
    """Which keys a query sees and what else shapes its scores, in words (the records' Words): "causal" when
    no statement says which keys."""
    said = [(r.words.sees, r.words.text(scheme)) for r in RECORDS if isinstance(r.words, Words)]
    seen = [text for sees, text in said if sees and text is not None]
    return (", ".join(seen) if seen else "causal") + "".join(f", {text}" for sees, text in said if not sees and text is not None)


def compared(place: str) -> list[Diff]:
    """The ``pedsl diff`` comparisons at ``place``, in the order their edits come out."""
    return sorted((r.diff for r in RECORDS if isinstance(r.diff, Diff) and r.diff.place == place), key=lambda d: d.rank)


__all__ = ["RECORDS", "CARRIED", "Carried", "Known", "Statement", "Show", "Diff", "Words", "attention_words", "BY_KIND", "BY_RULE", "BY_KEYWORD", "STATEMENT_KEYWORDS",
           "KEYWORDS", "ONE_FIELDS", "BY_CONSUMER", "HIGHLIGHT", "highlighted", "shown", "compared"]
