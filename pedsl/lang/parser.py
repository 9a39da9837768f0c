"""Text -> syntax IR: the Lark grammar, a Transformer to :mod:`pedsl.lang.ast`, friendly syntax errors.

The grammar (``grammars/pe.lark``) is loaded once and parsed with LALR and
positions kept. Syntax errors become :class:`~pedsl.errors.ParseError` with the
line, column, the tokens that were expected (in words) and a hint; several are
reported per run by resuming after each one.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from importlib import resources
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from pedsl.errors import DiagnosticSink, ParseError, PedslError
from pedsl.lang import ast

MAX_BYTES = 1_000_000  # a scheme file is a few lines; this bound keeps every input fast
MAX_NESTING = 64
MAX_TOKENS = 20_000  # ~100 schemes' worth; the LALR parser takes ~1 s per 20k tokens on a busy CPU
_PUNCTUATION = "()[]{}=,;:+-*/<>"

# How terminals read in a message.
_TOKEN_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": 'a string ("...")',
    "TYPE": "a type (int, float, bool, str)",
    "LAYOUT": "a layout (halves or interleaved)",
    "TARGET": "qk or qkv",
    "SECTION": "train or eval",
    "CMP": "a comparison (>, >=, <, <=, !=)",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COLON": "':'",
    "EQUAL": "'='",
    "COMMA": "','",
    "SEMICOLON": "';'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "$END": "the end of the file",
}

_STATEMENTS = "param, let, layout, channels, qk, qkv, bias, temperature, train, eval, allow"


def grammar_path() -> Path:
    """The shipped grammar: inside the installed package, or the source tree's grammars/."""
    try:
        packaged = resources.files("pedsl") / "grammars" / "pe.lark"
        if packaged.is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, FileNotFoundError):  # pragma: no cover - defensive
        pass
    return Path(__file__).resolve().parents[2] / "grammars" / "pe.lark"


def _cache_file(grammar: str) -> str | None:
    """Where to cache the built LALR tables (saves ~0.2 s per run), or None not to cache.

    Lark's cache is a pickle, so it lives only in a folder that this user owns and nobody
    else can write to (never the shared temp folder); PEDSL_NO_CACHE=1 turns it off.
    """
    if os.environ.get("PEDSL_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "pedsl")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            return None
    except OSError:
        return None
    digest = hashlib.sha256(grammar.encode()).hexdigest()[:16]
    return os.path.join(folder, f"grammar-{lark.__version__}-{digest}.lark")


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = grammar_path().read_text(encoding="utf-8")
    options = dict(parser="lalr", propagate_positions=True, maybe_placeholders=False)
    cache = _cache_file(grammar)
    if cache is not None:
        try:
            return Lark(grammar, cache=cache, **options)
        except Exception:  # noqa: BLE001 - a broken cache must never break parsing
            pass
    return Lark(grammar, **options)


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


def _number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


@v_args(meta=True)
class ToAst(Transformer):
    """Lark tree -> syntax IR. Method names match the grammar's rule aliases."""

    def __init__(self, file: str | None = None, source: str | None = None):
        super().__init__()
        self.file, self.source = file, source

    # expressions
    def number(self, meta, c):
        tok = c[0]
        value = _number(str(tok))
        if isinstance(value, float) and math.isinf(value):
            sink = DiagnosticSink(file=self.file, source=self.source)
            sink.add("E113", f"number {str(tok)} is too large for a float", line=tok.line, col=tok.column,
                     end_col=tok.end_column, hint="numbers must be below about 1.8e308")
            sink.raise_if_errors(ParseError)
        return ast.Num(value=value, span=_tok_span(tok))

    def string(self, meta, c):
        return ast.Str(value=_unquote(c[0]), span=_tok_span(c[0]))

    def true(self, meta, c):
        return ast.Bool(value=True, span=_span_of(meta))

    def false(self, meta, c):
        return ast.Bool(value=False, span=_span_of(meta))

    def name(self, meta, c):
        return ast.Name(id=str(c[0]), span=_tok_span(c[0]))

    def _bin(op):  # noqa: N805 - a small factory used in the class body
        def build(self, meta, c):
            return ast.Binary(op=op, left=c[0], right=c[1], span=_span_of(meta))

        return build

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

    def group(self, meta, c):
        return ast.Group(name=str(c[0]), spec=c[1], span=_span_of(meta))

    def channels(self, meta, c):
        return ast.Channels(groups=tuple(c), span=_span_of(meta))

    def on_clause(self, meta, c):
        return str(c[0])

    def transport(self, meta, c):
        group = c[1] if len(c) == 3 else None
        return ast.Transport(targets=str(c[0]), group=group, value=c[-1], span=_span_of(meta))

    def bias(self, meta, c):
        return ast.BiasStmt(value=c[0], span=_span_of(meta))

    def temperature(self, meta, c):
        return ast.TemperatureStmt(value=c[0], span=_span_of(meta))

    def entry(self, meta, c):
        return ast.Entry(name=str(c[0]), value=c[1], span=_span_of(meta))

    def section(self, meta, c):
        return ast.Section(section=str(c[0]), entries=tuple(c[1:]), span=_span_of(meta))

    def allow(self, meta, c):
        return ast.Allow(names=tuple(str(x) for x in c), span=_span_of(meta))

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


@functools.lru_cache(maxsize=1)
def _literal_terminals() -> dict[str, str]:
    """Terminal name -> its text, for the grammar's fixed strings (Lark names some __ANON_n)."""
    from lark.lexer import PatternStr

    return {t.name: t.pattern.value for t in _parser().terminals if isinstance(t.pattern, PatternStr)}


def _word(t: str) -> str:
    if t in _TOKEN_WORDS:
        return _TOKEN_WORDS[t]
    literal = _literal_terminals().get(t)
    if literal is not None:
        return f"'{literal}'"
    return f"'{t.lower()}'" if t.isupper() else t


def _expected_words(expected) -> str:
    words = sorted({_word(t) for t in expected})
    if len(words) > 12:
        words = words[:12] + ["..."]
    return ", ".join(words)


def _keyword_hint(tok: Token | None, expected) -> str | None:
    if tok is None:
        return None
    if tok.type == "NAME" and any(k in expected for k in ("PARAM", "LET", "TARGET", "BIAS")):
        return f"a statement starts with one of: {_STATEMENTS}"
    if "RBRACE" in expected and tok.type == "$END":
        return "a '{' is not closed: add '}' at the end of the scheme"
    return None


def _check_text(text: str, sink: DiagnosticSink) -> None:
    """Cheap guards before parsing: size, control bytes, nesting depth."""
    if len(text) > MAX_BYTES:
        sink.add(
            "E102",
            f"file too large ({len(text) / 1e6:.1f} MB; the limit is {MAX_BYTES / 1e6:.0f} MB)",
            line=1,
            col=1,
            hint="a .pe file declares schemes in a few lines; is this the right file?",
        )
        return
    # A cheap over-estimate of the token count (C-speed string methods): words plus punctuation.
    estimate = len(text.split()) + sum(text.count(c) for c in _PUNCTUATION)
    if estimate > MAX_TOKENS:
        sink.add(
            "E102",
            f"file too long (about {estimate} tokens; the limit is {MAX_TOKENS})",
            line=1,
            col=1,
            hint="a .pe file declares schemes in a few lines; split it into several files",
        )
        return
    line, col, depth = 1, 1, 0
    in_str = in_comment = False
    for ch in text:
        if ch == "\n":
            line, col, in_comment = line + 1, 1, False
            continue
        if ch == "\x00" or (ord(ch) < 32 and ch not in "\t\r\f\v"):
            sink.add(
                "E101",
                f"control character {ch!r} in the text: this does not look like a .pe file",
                line=line,
                col=col,
                hint="a .pe file is UTF-8 text",
            )
            return
        if not in_comment:
            if ch == '"':
                in_str = not in_str
            elif not in_str:
                if ch == "#":
                    in_comment = True
                elif ch in "([{":
                    depth += 1
                    if depth > MAX_NESTING:
                        sink.add(
                            "E103",
                            f"brackets nested more than {MAX_NESTING} deep",
                            line=line,
                            col=col,
                            end_col=col + 1,
                            hint="split the expression with 'let' definitions",
                        )
                        return
                elif ch in ")]}":
                    depth = max(0, depth - 1)
        col += 1


def read_bytes(path: Path) -> bytes:
    """The bytes of a source file, reading at most a little over the size limit.

    A huge file (or an endless one such as /dev/zero) is refused with E102 after reading
    MAX_BYTES + 1 bytes, so every input is answered quickly; OSError propagates to the caller.
    """
    from pedsl.fsio import open_regular

    with open_regular(path) as fh:  # a FIFO or a device is refused (it could block or never end)
        data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            try:
                size = f"{os.fstat(fh.fileno()).st_size / 1e6:.1f} MB"
            except OSError:  # pragma: no cover
                size = "unknown size"
            if size.startswith("0.0"):
                size = "an endless stream"
            raise ParseError(
                f"file too large ({size}; the limit is {MAX_BYTES / 1e6:.0f} MB)",
                code="E102",
                file=str(path),
                line=1,
                col=1,
                hint="a .pe file declares schemes in a few lines; is this the right file?",
            )
    return data


def decode(data: bytes, file: str | None = None) -> str:
    """Bytes -> text, or a positioned E101 diagnostic for bytes that are not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise ParseError(
            f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            code="E101",
            file=file,
            line=line,
            col=col,
            hint="save the file as UTF-8; a .pe file is plain text",
        ) from None
    return text.removeprefix("\ufeff")


def parse_module(text: str, file: str | None = None) -> ast.Module:
    """Parse `.pe` text into a :class:`~pedsl.lang.ast.Module`, or raise ParseError.

    Results are cached by (text, file): modules are frozen, and a file imported by
    several others (``rope.pe``) is parsed once per process.
    """
    return _parse_cached(text, file)


def _too_deep(tree, file: str | None, text: str) -> ParseError:
    """E103 at the deepest node of the parse tree (found without recursion; the leftmost if several):
    for a long operator chain that is its first operand, inside the expression to split."""
    best = (-1, 1, 1)  # (depth, line, col)
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        meta = getattr(node, "meta", None)
        if meta is not None and not getattr(meta, "empty", True):
            if depth > best[0] or (depth == best[0] and (meta.line, meta.column) < best[1:]):
                best = (depth, meta.line, meta.column)
        stack.extend((child, depth + 1) for child in getattr(node, "children", ()) if hasattr(child, "children"))
    _, line, col = best
    lines = text.split("\n")
    return ParseError("expression nested too deeply", code="E103", file=file, line=line, col=col,
                      source_line=lines[line - 1] if line <= len(lines) else None,
                      hint="split the expression with 'let' definitions")


@functools.lru_cache(maxsize=128)
def _parse_cached(text: str, file: str | None) -> ast.Module:
    sink = DiagnosticSink(file=file, source=text)
    _check_text(text, sink)
    sink.raise_if_errors(ParseError)

    comments: list[ast.Comment] = []
    errors: list[UnexpectedInput] = []

    def on_error(e: UnexpectedInput) -> bool:
        errors.append(e)
        if isinstance(e, UnexpectedToken):
            _repair(e)
        return len(errors) < 5  # resume and look for more, up to a few

    parser = _parser()
    tree = None
    try:
        tree = parser.parse(text, on_error=on_error)
    except (UnexpectedCharacters, UnexpectedEOF, UnexpectedToken) as e:
        errors.append(e)
    except UnexpectedInput as e:  # pragma: no cover - other lark errors
        errors.append(e)
    if errors:
        _report_syntax(errors, sink)
        sink.raise_if_errors(ParseError)
    try:
        items = ToAst(file, text).transform(tree)
    except VisitError as e:  # an error raised inside a transformer method
        inner = e.orig_exc
        if isinstance(inner, PedslError):
            raise inner from None
        if isinstance(inner, RecursionError):
            raise _too_deep(tree, file, text) from None
        raise ParseError(f"cannot build the syntax tree: {inner}", file=file, line=1, col=1) from None
    except RecursionError:
        raise _too_deep(tree, file, text) from None
    # Comments: re-lex cheaply (the grammar ignores them).
    for i, raw in enumerate(text.split("\n"), start=1):
        idx = _comment_start(raw)
        if idx is not None:
            comments.append(
                ast.Comment(
                    text=raw[idx:].rstrip(),
                    span=ast.Span(line=i, col=idx + 1, end_line=i, end_col=len(raw) + 1),
                )
            )
    imports = tuple(x for x in items if isinstance(x, ast.Import))
    schemes = tuple(x for x in items if isinstance(x, ast.SchemeDecl))
    return ast.Module(file=file, imports=imports, schemes=schemes, comments=tuple(comments))


# Tokens the recovery may pretend were there (the first that lets the parse go on wins).
_REPAIRS = (("COLON", ":"), ("EQUAL", "="), ("RPAR", ")"), ("RSQB", "]"), ("SEMICOLON", ";"),
            ("NAME", "_"), ("NUMBER", "0"), ("RBRACE", "}"), ("LBRACE", "{"), ("COMMA", ","))


def _repair(e: UnexpectedToken) -> None:
    """Error recovery: insert one expected token before the bad one when that lets parsing go on.

    Without it the LALR parser drops tokens until one fits, and reports a cascade of errors
    for a single missing ':'. Only used to find further errors; the tree is discarded.
    """
    ip = e.interactive_parser
    if ip is None or e.token.type == "$END":
        return
    for typ, value in _REPAIRS:
        if typ not in e.expected:
            continue
        trial = ip.copy()
        try:
            trial.feed_token(Token.new_borrow_pos(typ, value, e.token))
            trial.feed_token(e.token)
        except UnexpectedInput:
            continue
        ip.feed_token(Token.new_borrow_pos(typ, value, e.token))
        ip.feed_token(e.token)
        return


def _comment_start(line: str) -> int | None:
    in_str = False
    for i, ch in enumerate(line):
        if ch == '"' and (i == 0 or line[i - 1] != "\\"):
            in_str = not in_str
        elif ch == "#" and not in_str:
            return i
    return None


def _report_syntax(errors: list[UnexpectedInput], sink: DiagnosticSink) -> None:
    last_line = 0
    for e in errors:
        line = getattr(e, "line", None)
        col = getattr(e, "column", None)
        if line is None or line == -1:
            lines = (sink.source or "").splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
        if line <= last_line and sink.items:
            continue  # a cascade from the previous error
        last_line = line
        if isinstance(e, UnexpectedCharacters):
            ch = (sink.source or "")[e.pos_in_stream] if e.pos_in_stream < len(sink.source or "") else "?"
            if ch == '"':
                sink.add("E110", "unterminated string", line=line, col=col, end_col=col + 1,
                         hint='close the string with " on the same line')
                continue
            sink.add(
                "E110",
                f"unexpected character {ch!r}",
                line=line,
                col=col,
                end_col=col + 1,
                hint=f"expected {_expected_words(e.allowed)}" if e.allowed else None,
            )
        elif isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
            sink.add(
                "E112",
                "unexpected end of file",
                line=line,
                col=col,
                hint=f"expected {_expected_words(e.expected)}; is a '}}' missing?",
            )
        elif isinstance(e, UnexpectedToken):
            tok = e.token
            text = str(tok)
            sink.add(
                "E111",
                f"unexpected {text!r}; expected {_expected_words(e.expected)}",
                line=line,
                col=col,
                end_col=col + max(1, len(text)),
                hint=_keyword_hint(tok, e.expected),
            )
        else:  # pragma: no cover
            sink.add("E100", str(e).splitlines()[0], line=line, col=col)
