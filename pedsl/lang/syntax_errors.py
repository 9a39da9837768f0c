"""Syntax errors: Lark's exceptions -> positioned diagnostics in words, and the recovery that finds several.

Each error names the line, column and the tokens that were expected (in words) with a hint;
after one, :func:`repair` lets the parse go on to report the next (up to a few per run).
"""

from __future__ import annotations

import functools

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from pedsl.errors import DiagnosticSink, ParseError, quoted
from pedsl.lang.grammar import lark_parser
from pedsl.lang.statements import STATEMENT_KEYWORDS

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

_STATEMENTS = ", ".join(STATEMENT_KEYWORDS)


@functools.lru_cache(maxsize=1)
def _literal_terminals() -> dict[str, str]:
    """Terminal name -> its text, for the grammar's fixed strings (Lark names some __ANON_n)."""
    from lark.lexer import PatternStr

    return {t.name: t.pattern.value for t in lark_parser().terminals if isinstance(t.pattern, PatternStr)}


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


def too_deep(tree, file: str | None, text: str) -> ParseError:
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

# Tokens the recovery may pretend were there (the first that lets the parse go on wins).
_REPAIRS = (("COLON", ":"), ("EQUAL", "="), ("RPAR", ")"), ("RSQB", "]"), ("SEMICOLON", ";"),
            ("NAME", "_"), ("NUMBER", "0"), ("RBRACE", "}"), ("LBRACE", "{"), ("COMMA", ","))


def repair(e: UnexpectedToken) -> None:
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


def report_syntax(errors: list[UnexpectedInput], sink: DiagnosticSink) -> None:
    last_line = 0
    for e in errors:
        line = getattr(e, "line", None)
        col = getattr(e, "column", None)
        if line is None or line == -1:
            lines = (sink.source or "").splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
        if col is None:  # lark gives a column with every line it gives
            col = 1
        if line <= last_line and sink.items:
            continue  # a cascade from the previous error
        last_line = line
        if isinstance(e, UnexpectedCharacters):
            text_in, pos = sink.source or "", e.pos_in_stream
            ch = text_in[pos] if pos is not None and pos < len(text_in) else "?"
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
                f"unexpected {quoted(text)}; expected {_expected_words(e.expected)}",
                line=line,
                col=col,
                end_col=col + max(1, len(text)),
                hint=_keyword_hint(tok, e.expected),
            )
        else:  # pragma: no cover
            sink.add("E100", str(e).splitlines()[0], line=line, col=col)
