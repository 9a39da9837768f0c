"""Lark parse tree -> syntax IR (:mod:`pedsl.lang.ast`), with source spans."""

from __future__ import annotations

import math
import sys

from lark import Token, Transformer, v_args

from pedsl import limits
from pedsl.errors import DiagnosticSink, ParseError
from pedsl.lang import ast
from pedsl.lang.statements import RECORDS


def _span_of(meta) -> ast.Span | None:
    if meta is None or getattr(meta, "empty", True):
        return None
    return ast.Span(line=meta.line, col=meta.column, end_line=meta.end_line, end_col=meta.end_column)


def _tok_span(tok: Token) -> ast.Span:
    return ast.Span(line=tok.line, col=tok.column, end_line=tok.end_line, end_col=tok.end_column)


def _unquote(tok: Token) -> str:
    body = str(tok)[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _number(text: str) -> int | float | None:
    """A NUMBER token's value; None for one beyond the float range ('1e999', an integer of 400 digits):
    every number meets floats somewhere, where such a one overflows."""
    if any(c in text for c in ".eE"):
        value = float(text)
        return None if math.isinf(value) else value
    if len(text.lstrip("0")) > 309:  # also before int(), which refuses more than 4300 digits
        return None
    value = int(text)
    return value if value <= sys.float_info.max else None


def _bin(op: str):
    """The transformer method of a binary operator's rule."""
    def build(self, meta, c):
        return ast.Binary(op=op, left=c[0], right=c[1], span=_span_of(meta))

    return build


@v_args(meta=True)
class ToAst(Transformer):
    """Lark tree -> syntax IR. Method names match the grammar's rule aliases."""

    def __init__(self, file: str | None = None, source: str | None = None):
        super().__init__()
        self.file, self.source = file, source

    def _refuse(self, tok: Token, code: str, message: str, hint: str) -> None:
        sink = DiagnosticSink(file=self.file, source=self.source)
        sink.add(code, message, line=tok.line, col=tok.column, end_col=tok.end_column, hint=hint)
        sink.raise_if_errors(ParseError)

    def NAME(self, tok: Token) -> Token:  # noqa: N802 - lark calls a terminal's callback by the terminal's name
        """Every identifier: a scheme's name becomes file names (``<name>.py``), which have a length limit."""
        if len(tok) > limits.MAX_NAME:
            self._refuse(tok, "E104", f"a name of {len(tok)} characters ('{tok[:20]}...'); the limit is "
                         f"{limits.MAX_NAME}", "choose a shorter name")
        return tok

    # expressions
    def number(self, meta, c):
        tok = c[0]
        text = str(tok)
        value = _number(text)
        if value is None:
            self._refuse(tok, "E113", f"number {text[:40]}{'...' if len(text) > 40 else ''} is too large for a "
                         "float", "numbers must be below about 1.8e308")
        return ast.Num(value=value, span=_tok_span(tok))

    def string(self, meta, c):
        return ast.Str(value=_unquote(c[0]), span=_tok_span(c[0]))

    def true(self, meta, c):
        return ast.Bool(value=True, span=_span_of(meta))

    def false(self, meta, c):
        return ast.Bool(value=False, span=_span_of(meta))

    def name(self, meta, c):
        return ast.Name(id=str(c[0]), span=_tok_span(c[0]))

    def dotted(self, meta, c):
        """``position.h`` / ``distance.h``: one name, read along one declared axis (docs/language.md, axes)."""
        return ast.Name(id=f"{c[0]}.{c[1]}", span=_span_of(meta))

    add, sub, mul, div, pow = _bin("+"), _bin("-"), _bin("*"), _bin("/"), _bin("**")

    def neg(self, meta, c):
        return ast.Unary(op="-", operand=c[0], span=_span_of(meta))

    def kwarg(self, meta, c):
        return ast.Kwarg(name=str(c[0]), value=c[1], span=_tok_span(c[0]))

    def call(self, meta, c):
        func, rest = c[0], [x for x in c[1:] if x is not None]
        args = tuple(x for x in rest if not isinstance(x, ast.Kwarg))
        kwargs = tuple(x for x in rest if isinstance(x, ast.Kwarg))
        return ast.Call(func=str(func), args=args, kwargs=kwargs, span=_span_of(meta))

    def list(self, meta, c):
        return ast.ListExpr(items=tuple(x for x in c if x is not None), span=_span_of(meta))

    # statements
    def constraint(self, meta, c):
        return ast.Constraint(op=str(c[0]), value=c[1], span=_span_of(meta))

    def constraints(self, meta, c):
        return tuple(c)

    def param(self, meta, c):
        name, typ = c[0], c[1]
        cons = c[2] if len(c) == 4 else ()
        return ast.Param(name=str(name), type=str(typ), constraints=cons, default=c[-1], span=_span_of(meta))

    def let(self, meta, c):
        return ast.Let(name=str(c[0]), value=c[1], span=_span_of(meta))

    def layout(self, meta, c):
        return ast.Layout(value=str(c[0]), span=_span_of(meta))

    def axes_decl(self, meta, c):
        return ast.Axes(names=tuple(str(x) for x in c), span=_span_of(meta))

    def group(self, meta, c):
        return ast.Group(name=str(c[0]), spec=c[1], span=_span_of(meta))

    def channels(self, meta, c):
        return ast.Channels(groups=tuple(c), span=_span_of(meta))

    def on_clause(self, meta, c):
        return str(c[0])

    def transport(self, meta, c):
        group = c[1] if len(c) == 3 else None
        return ast.Transport(targets=str(c[0]), group=group, value=c[-1], span=_span_of(meta))

    def sink(self, meta, c):
        return ast.SinkStmt(value=str(c[0]), value_span=_tok_span(c[0]), span=_span_of(meta))

    def regime_bound(self, meta, c):
        return ast.RegimeBound(name=str(c[0]), op=str(c[1]), value=c[2], span=_span_of(meta))

    def regime_entry(self, meta, c):
        return ast.RegimeEntry(name=str(c[0]), value=c[1], span=_span_of(meta))

    def regime(self, meta, c):
        return ast.Regime(bounds=tuple(x for x in c if isinstance(x, ast.RegimeBound)),
                          entries=tuple(x for x in c if isinstance(x, ast.RegimeEntry)), span=_span_of(meta))

    def remap(self, meta, c):
        chunk = next((x for x in c if isinstance(x, ast.RegimeEntry)), None)
        return ast.RemapStmt(regimes=tuple(x for x in c if isinstance(x, ast.Regime)), chunk=chunk,
                             span=_span_of(meta))

    def entry(self, meta, c):
        return ast.Entry(name=str(c[0]), value=c[1], span=_span_of(meta))

    def section(self, meta, c):
        return ast.Section(section=str(c[0]), entries=tuple(c[1:]), span=_span_of(meta))

    def allow(self, meta, c):
        return ast.Allow(names=tuple(str(x) for x in c), span=_span_of(meta))

    def layer_args(self, meta, c):
        return ("layer_args", tuple(x for x in c if x is not None))

    def layer_rule(self, meta, c):
        args = c[1][1] if len(c) == 3 else None
        return ast.LayerRule(rule=str(c[0]), args=args, value=c[-1], span=_span_of(meta))

    def layers(self, meta, c):
        return ast.Layers(rules=tuple(c), span=_span_of(meta))

    def extends_clause(self, meta, c):
        return ("extends", str(c[0]))

    def scheme(self, meta, c):
        name = str(c[0])
        base = doc = None
        body = []
        for x in c[1:]:
            if isinstance(x, tuple) and x and x[0] == "extends":
                base = x[1]
            elif isinstance(x, Token) and x.type == "STRING":
                doc = _unquote(x)
            else:
                body.append(x)
        return ast.SchemeDecl(name=name, base=base, doc=doc, body=tuple(body), span=_span_of(meta))

    def import_stmt(self, meta, c):
        return ast.Import(path=_unquote(c[0]), span=_span_of(meta))

    def start(self, meta, c):
        return list(c)


def _assignment(record):
    """The method of a ``KEYWORD = expr`` statement's rule: its record's node, kind and value."""
    def build(self, meta, c):
        return record.node(kind=record.kind, value=c[0], span=_span_of(meta))
    return v_args(meta=True)(build)


for _record in RECORDS:
    if _record.assign:
        setattr(ToAst, _record.rule, _assignment(_record))
