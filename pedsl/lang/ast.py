"""The syntax IR: frozen Pydantic models for what a `.pe` file says, with source spans.

This is the parser's output and the formatter's input: one model per construct,
discriminated unions on ``kind`` for expressions and statements. Spans are kept
for diagnostics but excluded from comparison helpers (:func:`canonical`), so a
reformatted file compares equal to its original.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class Span(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    line: int
    col: int
    end_line: int
    end_col: int


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    span: Span | None = Field(default=None, repr=False)


# ---------------------------------------------------------------- expressions


class Num(Node):
    kind: Literal["num"] = "num"
    value: float | int


class Str(Node):
    kind: Literal["str"] = "str"
    value: str


class Bool(Node):
    kind: Literal["bool"] = "bool"
    value: bool


class Name(Node):
    kind: Literal["name"] = "name"
    id: str


class Unary(Node):
    kind: Literal["unary"] = "unary"
    op: Literal["-"]
    operand: "Expr"


class Binary(Node):
    kind: Literal["binary"] = "binary"
    op: Literal["+", "-", "*", "/", "**"]
    left: "Expr"
    right: "Expr"


class Kwarg(Node):
    kind: Literal["kwarg"] = "kwarg"
    name: str
    value: "Expr"


class Call(Node):
    kind: Literal["call"] = "call"
    func: str
    args: tuple["Expr", ...] = ()
    kwargs: tuple[Kwarg, ...] = ()
    # set by the resolver on a learned call written in a `let` definition: (the let's name, its index among
    # that definition's learned calls). Every inlined use of the let carries it, so all uses are one site.
    bound: tuple[str, int] | None = None


class ListExpr(Node):
    kind: Literal["list"] = "list"
    items: tuple["Expr", ...] = ()


Expr = Annotated[Union[Num, Str, Bool, Name, Unary, Binary, Call, ListExpr], Field(discriminator="kind")]
# The classes of Expr, for isinstance (which narrows a value to Expr): a call's argument left at its default
# is not one of them.
EXPR_NODES = (Num, Str, Bool, Name, Unary, Binary, Call, ListExpr)

for _m in (Unary, Binary, Kwarg, Call, ListExpr):
    _m.model_rebuild()


# ---------------------------------------------------------------- statements


class Constraint(Node):
    op: Literal[">", ">=", "<", "<=", "!="]
    value: Expr


class Param(Node):
    kind: Literal["param"] = "param"
    name: str
    type: Literal["int", "float", "bool", "str"]
    constraints: tuple[Constraint, ...] = ()
    default: Expr


class Let(Node):
    kind: Literal["let"] = "let"
    name: str
    value: Expr


class Layout(Node):
    kind: Literal["layout"] = "layout"
    value: Literal["halves", "interleaved"]


class Axes(Node):
    """``axes t, h, w``: the named axes of the scheme's positions (absent: one unnamed axis)."""

    kind: Literal["axes"] = "axes"
    names: tuple[str, ...]


class Group(Node):
    name: str
    spec: Expr


class Channels(Node):
    kind: Literal["channels"] = "channels"
    groups: tuple[Group, ...] = ()


class Transport(Node):
    kind: Literal["transport"] = "transport"
    targets: Literal["qk", "qkv"]
    group: str | None = None
    value: Expr


class BiasStmt(Node):
    kind: Literal["bias"] = "bias"
    value: Expr


class TemperatureStmt(Node):
    kind: Literal["temperature"] = "temperature"
    value: Expr


class NormalizeStmt(Node):
    """``normalize = softmax | softmax1 | sigmoid(bias = b) | stick_breaking(current = false)``: how scores
    become weights (pedsl.lang.normalizers)."""

    kind: Literal["normalize"] = "normalize"
    value: Expr


class ContextualStmt(Node):
    """``contextual = cope(max_pos = N, shared = BOOL)``: positions counted by gates on the scores (CoPE)."""

    kind: Literal["contextual"] = "contextual"
    value: Expr


class RelativeStmt(Node):
    """``relative = shaw(...) | transformer_xl(...) | deberta(...)``: content-position terms (pedsl.lang.relative)."""

    kind: Literal["relative"] = "relative"
    value: Expr


class WindowStmt(Node):
    """``window = N`` (sliding) or ``chunk = N`` (chunked): which keys a query sees; ``softcap = c``: the
    scores pass through ``c * tanh(s / c)`` before the softmax (Gemma 2; docs/semantics.md §11)."""

    kind: Literal["window", "chunk", "softcap", "keep_first"] = "window"
    value: Expr


class MaskStmt(Node):
    """``mask = causal | bidirectional | prefix(N) | spans``: which pairs of tokens see each other both ways
    (docs/semantics.md §11a); the value is checked by the resolver (:mod:`pedsl.lang.masks`)."""

    kind: Literal["mask"] = "mask"
    value: Expr


class SinkStmt(Node):
    """``sink = logit`` (a learned per-head logit in the normaliser) or ``sink = token`` (a learned key/value slot)."""

    kind: Literal["sink"] = "sink"
    value: str
    value_span: Span | None = Field(default=None, repr=False)


class RegimeBound(Node):
    """``distance < E`` in a regime's predicate (the resolver checks the name is ``distance``)."""

    name: str
    op: Literal[">", ">=", "<", "<=", "!="]
    value: Expr


class RegimeEntry(Node):
    """``query = E`` or ``key = E``: a token's position in one regime of a ``remap`` block."""

    name: str
    value: Expr


class Regime(Node):
    """One regime of a ``remap`` block: the distances it covers and the positions it rotates q and k at
    (an entry left out reads ``position``, the token's own)."""

    bounds: tuple[RegimeBound, ...]
    entries: tuple[RegimeEntry, ...] = ()


class RemapStmt(Node):
    """``remap { REGIME ... }``: the rotation's positions as a function of (i, j), regime by regime
    (ReRoPE, Self-Extend; docs/semantics.md §2d)."""

    kind: Literal["remap"] = "remap"
    regimes: tuple[Regime, ...] = ()
    chunk: RegimeEntry | None = None  # ``remap(chunk = c)``: regimes of the chunk difference (DCA)


class Entry(Node):
    name: str
    value: Expr


class Section(Node):
    kind: Literal["section"] = "section"
    section: Literal["train", "eval"]
    entries: tuple[Entry, ...] = ()


class Allow(Node):
    kind: Literal["allow"] = "allow"
    names: tuple[str, ...]


class LayerRule(Node):
    """One rule of a ``layers`` block: ``rule(args) = value`` (``pattern``, ``default``, ``every(k)``,
    ``first(n)``, ``last(n)``, ``at([i, ...])``); ``args`` is None without parentheses. The resolver
    checks the rule name, its arguments and its value (scheme names, ``name * count`` in a pattern)."""

    rule: str
    args: tuple[Expr, ...] | None = None
    value: Expr


class Layers(Node):
    kind: Literal["layers"] = "layers"
    rules: tuple[LayerRule, ...] = ()


Stmt = Annotated[
    Union[Param, Let, Layout, Axes, Channels, Transport, BiasStmt, TemperatureStmt, NormalizeStmt, ContextualStmt, RelativeStmt, WindowStmt, MaskStmt, SinkStmt, RemapStmt, Section,
          Allow,
          Layers],
    Field(discriminator="kind"),
]


class SchemeDecl(Node):
    kind: Literal["scheme"] = "scheme"
    name: str
    base: str | None = None
    doc: str | None = None
    body: tuple[Stmt, ...] = ()


class Import(Node):
    kind: Literal["import"] = "import"
    path: str


class Comment(Node):
    """A `#` comment, kept so the formatter can put it back."""

    text: str


class Module(Node):
    """One parsed `.pe` file."""

    file: str | None = None
    imports: tuple[Import, ...] = ()
    schemes: tuple[SchemeDecl, ...] = ()
    comments: tuple[Comment, ...] = Field(default=(), repr=False)


def canonical(obj: Any) -> Any:
    """A plain-data view of a node without spans, file names or comments.

    Two files that differ only in layout or comments have equal canonical forms.
    """
    if isinstance(obj, BaseModel):
        out = {}
        for name in type(obj).model_fields:
            if name in ("span", "file", "comments") or name.endswith("_span"):
                continue
            out[name] = canonical(getattr(obj, name))
        return out
    if isinstance(obj, (list, tuple)):
        return [canonical(x) for x in obj]
    if isinstance(obj, dict):
        return {k: canonical(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2**53:
        return obj  # keep float-ness: 2.0 and 2 are different literals
    return obj
