"""Text -> syntax IR: reading and decoding a file, cheap guards, parsing, comments.

The grammar is loaded once (:mod:`pedsl.lang.grammar`) and parsed with LALR and
positions kept; :mod:`pedsl.lang.transform` turns the tree into :mod:`pedsl.lang.ast`.
Syntax errors become :class:`~pedsl.errors.ParseError` with the line, column, the
tokens that were expected (in words) and a hint (:mod:`pedsl.lang.syntax_errors`);
several are reported per run by resuming after each one.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from pedsl.errors import DiagnosticSink, ParseError, PedslError
from pedsl.lang import ast
from pedsl.lang.statements import KEYWORDS
from pedsl.lang.grammar import lark_parser
from pedsl.lang.syntax_errors import repair, report_syntax, too_deep
from pedsl.lang.transform import ToAst
from pedsl.fsio import open_regular

MAX_BYTES = 1_000_000  # a scheme file is a few lines; this bound keeps every input fast
MAX_NESTING = 64
MAX_TOKENS = 20_000  # ~100 schemes' worth; the LALR parser takes ~1 s per 20k tokens on a busy CPU
_PUNCTUATION = "()[]{}=,;:+-*/<>"


def _string_step(ch: str, escaped: bool) -> tuple[bool, bool]:
    """One character inside a string literal, read as the grammar's STRING does (a backslash escapes the
    next character): (still inside the string, the next character is escaped)."""
    if escaped:
        return True, False
    return ch != '"', ch == "\\"


def token_estimate(text: str) -> int:
    """A cheap over-estimate of the token count (C-speed string methods): words plus punctuation."""
    return len(text.split()) + sum(text.count(c) for c in _PUNCTUATION)


def _lone_surrogate(text: str, sink: DiagnosticSink) -> bool:
    """A lone UTF-16 surrogate (text an editor sent, never a decoded file) is not Unicode text: E101 at it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        col = exc.start - (text.rfind("\n", 0, exc.start) + 1) + 1
        sink.add("E101", f"a lone surrogate U+{ord(text[exc.start]):04X} in the text: this is not Unicode text",
                 line=line, col=col, hint="a .pe file is UTF-8 text; remove the character")
        return True
    return False


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
    estimate = token_estimate(text)
    if estimate > MAX_TOKENS:
        sink.add(
            "E102",
            f"file too long (about {estimate} tokens; the limit is {MAX_TOKENS})",
            line=1,
            col=1,
            hint="a .pe file declares schemes in a few lines; split it into several files",
        )
        return
    if _lone_surrogate(text, sink):
        return
    line, col, depth = 1, 1, 0
    in_str = in_comment = escaped = False
    for ch in text:
        if ch == "\n":  # a string or a comment ends at the line's end (the grammar's STRING has no newline)
            line, col, in_str, in_comment, escaped = line + 1, 1, False, False, False
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
        if in_str:
            in_str, escaped = _string_step(ch, escaped)
        elif not in_comment:
            if ch == '"':
                in_str = True
            elif ch == "#":
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
            repair(e)
        return len(errors) < 5  # resume and look for more, up to a few

    parser = lark_parser()
    tree = None
    try:
        tree = parser.parse(text, on_error=on_error)
    except (UnexpectedCharacters, UnexpectedEOF, UnexpectedToken) as e:
        errors.append(e)
    except UnexpectedInput as e:  # pragma: no cover - other lark errors
        errors.append(e)
    if errors:
        report_syntax(errors, sink)
        sink.raise_if_errors(ParseError)
    assert tree is not None  # parse() returned (no exception) and on_error saw nothing, or we raised above
    try:
        items = ToAst(file, text).transform(tree)
    except VisitError as e:  # an error raised inside a transformer method
        inner = e.orig_exc
        if isinstance(inner, PedslError):
            raise inner from None
        if isinstance(inner, RecursionError):
            raise too_deep(tree, file, text) from None
        raise ParseError(f"cannot build the syntax tree: {inner}", file=file, line=1, col=1) from None
    except RecursionError:
        raise too_deep(tree, file, text) from None
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


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be written as a scheme's name in a ``.pe`` file, or None when it can: the grammar's
    NAME (ASCII letters, digits and '_', not starting with a digit), not a keyword, at most MAX_NAME long."""
    if not _NAME.fullmatch(name):
        return "a name is ASCII letters, digits and '_', not starting with a digit"
    if name in KEYWORDS:
        return f"'{name}' is a keyword of the language"
    try:
        parse_module(f"scheme {name} {{\n}}\n")
    except ParseError as err:
        return err.diagnostics[0].message if err.diagnostics else str(err)
    return None


def _comment_start(line: str) -> int | None:
    """Where a line's comment starts (a ``#`` outside a string, whose backslash escapes are skipped)."""
    in_str = escaped = False
    for i, ch in enumerate(line):
        if in_str:
            in_str, escaped = _string_step(ch, escaped)
        elif ch == '"':
            in_str = True
        elif ch == "#":
            return i
    return None
