"""A token scan and an outline of `.pe` text that never fails, for text as it is being typed.

The parser (:mod:`pedsl.lang.parser`) gives the checked meaning of a file that parses; an editor
mostly holds text that does not (yet). Statements of the language start with a keyword, so the
declarations a file makes - ``import "f.pe"``, ``scheme NAME extends BASE``, ``param NAME``,
``let NAME``, channel groups ``NAME = ...`` - and where the cursor stands (which scheme, which
statement, which call) are read off the tokens and bracket depth, whatever else is broken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pedsl.lang.statements import STATEMENT_KEYWORDS  # the words that start a statement in a scheme's body

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*"?)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\*\*|>=|<=|!=|[-+*/=<>:;,(){}\[\]])
  | (?P<other>.)
""", re.X | re.S)

_OPEN, _CLOSE = "([{", ")]}"


@dataclass(frozen=True)
class Token:
    kind: str  # comment | str | num | name | op | other
    text: str
    start: int
    end: int
    depth: int  # brackets open before it


def tokens(text: str) -> list[Token]:
    """Every token of ``text`` but whitespace, with the bracket depth before it (unbalanced closers
    never take it below 0)."""
    out: list[Token] = []
    depth = 0
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKEN is a named group
        if kind == "ws":
            continue
        tok = m.group()
        if kind == "op" and tok in _CLOSE:
            depth = max(0, depth - 1)
        out.append(Token(kind, tok, m.start(), m.end(), depth))
        if kind == "op" and tok in _OPEN:
            depth += 1
    return out


@dataclass
class Decl:
    """One named declaration: a param, let, channel group or scheme, or an import."""

    kind: str  # param | let | group | scheme | import
    name: str
    start: int  # the name (an import: its string)
    end: int
    stmt_start: int  # the whole statement
    stmt_end: int


@dataclass
class SchemeOutline:
    decl: Decl
    base: str | None = None
    base_at: tuple[int, int] | None = None  # offsets of the base's name after `extends`
    doc: str | None = None
    body_start: int | None = None  # offset just after '{'
    close: int | None = None  # offset of the closing '}' (None: not closed yet)
    depth0: int = 0  # brackets open before the scheme (left open by an unclosed scheme above)
    members: list[Decl] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.decl.name

    def member(self, name: str, kinds: tuple[str, ...] = ("param", "let")) -> Decl | None:
        """The last declaration of ``name`` here (of one of ``kinds``)."""
        found = [d for d in self.members if d.name == name and d.kind in kinds]
        return found[-1] if found else None


@dataclass
class Outline:
    text: str
    tokens: list[Token]
    imports: list[Decl]
    schemes: list[SchemeOutline]

    def scheme_at(self, offset: int) -> SchemeOutline | None:
        """The scheme whose declaration (header or body) holds ``offset``."""
        for k, s in enumerate(self.schemes):
            if s.close is not None:
                end = s.close + 1
            else:  # not closed yet: the text up to the next scheme is still being typed into it
                end = self.schemes[k + 1].decl.stmt_start - 1 if k + 1 < len(self.schemes) else len(self.text)
            if s.decl.stmt_start <= offset <= end:
                return s
        return None

    def scheme(self, name: str) -> SchemeOutline | None:
        found = [s for s in self.schemes if s.name == name]
        return found[-1] if found else None

    def token_at(self, offset: int) -> int | None:
        """The index of the token holding ``offset`` (or ending at it), preferring a name or string."""
        best = None
        for i, t in enumerate(self.tokens):
            if t.start <= offset <= t.end:
                if t.kind in ("name", "str", "num"):
                    return i
                best = i if best is None else best
            elif t.start > offset:
                break
        return best


def _unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s.endswith('"') else s[1:]


class _OutlineBuilder:
    def __init__(self, text: str):
        self.toks = [t for t in tokens(text) if t.kind != "comment"]
        self.all = tokens(text)
        self.text = text
        self.imports: list[Decl] = []
        self.schemes: list[SchemeOutline] = []

    def build(self) -> Outline:
        toks, i = self.toks, 0
        while i < len(toks):
            t = toks[i]
            # `import` and `scheme` only start top-level declarations; met deeper, a scheme above is unclosed
            if t.kind == "name" and t.text == "import":
                nxt = toks[i + 1] if i + 1 < len(toks) else None
                if nxt is not None and nxt.kind == "str":
                    self.imports.append(Decl("import", _unquote(nxt.text), nxt.start, nxt.end, t.start, nxt.end))
                    i += 2
                    continue
            if t.kind == "name" and t.text == "scheme":
                i = self._scheme(i)
                continue
            i += 1
        return Outline(self.text, self.all, self.imports, self.schemes)

    def _scheme(self, i: int) -> int:
        toks = self.toks
        kw = toks[i]
        i += 1
        if i >= len(toks) or toks[i].kind != "name":
            return i
        name = toks[i]
        s = SchemeOutline(Decl("scheme", name.text, name.start, name.end, kw.start, name.end), depth0=kw.depth)
        self.schemes.append(s)
        i += 1
        if i < len(toks) and toks[i].text == "extends":
            if i + 1 < len(toks) and toks[i + 1].kind == "name":
                s.base, s.base_at = toks[i + 1].text, (toks[i + 1].start, toks[i + 1].end)
                i += 1
            i += 1
        if i < len(toks) and toks[i].kind == "str":
            s.doc = _unquote(toks[i].text)
            i += 1
        if i >= len(toks) or toks[i].text != "{":
            s.decl.stmt_end = toks[i - 1].end
            return i
        s.body_start = toks[i].end
        return self._body(s, i + 1, kw.depth)

    def _body(self, s: SchemeOutline, i: int, d0: int) -> int:
        """Statements up to the scheme's closing brace, or up to a `scheme`/`import` keyword at the start of
        a statement (an unclosed scheme: the next declaration starts there). ``d0``: the brackets open
        before the scheme (0 but after an unclosed one)."""
        toks = self.toks
        current: Decl | None = None
        section: str | None = None
        while i < len(toks):
            t = toks[i]
            depth = t.depth - d0
            if depth == 0 and t.text == "}":
                s.close = t.start
                s.decl.stmt_end = t.end
                return i + 1
            if t.kind == "name" and t.text in ("scheme", "import"):
                break
            if depth == 1 and t.kind == "name" and t.text in STATEMENT_KEYWORDS:
                section = t.text
                current = None
                nxt = toks[i + 1] if i + 1 < len(toks) else None
                if t.text in ("param", "let") and nxt is not None and nxt.kind == "name":
                    current = Decl(t.text, nxt.text, nxt.start, nxt.end, t.start, nxt.end)
                    s.members.append(current)
                    i += 2
                    continue
            elif (depth == 2 and section == "channels" and t.kind == "name" and i + 1 < len(toks)
                  and toks[i + 1].text == "="):  # a keyword argument sits deeper, inside a call
                current = Decl("group", t.text, t.start, t.end, t.start, t.end)
                s.members.append(current)
            elif depth == 1 and t.text == ";":
                current = None
            if current is not None:
                current.stmt_end = max(current.stmt_end, t.end)
            i += 1
        s.decl.stmt_end = toks[i - 1].end if i > 0 else s.decl.stmt_end
        return i


def _line_start(text: str, offset: int) -> bool:
    """Only whitespace between the start of the line and ``offset``."""
    head = text[text.rfind("\n", 0, offset) + 1:offset]
    return not head.strip()


def outline(text: str) -> Outline:
    """The declarations of ``text``, read off its tokens (never raises)."""
    return _OutlineBuilder(text).build()


# ------------------------------------------------------------------ where the cursor is


@dataclass
class Cursor:
    """What surrounds an offset: the word being typed, the tokens before it, open brackets."""

    offset: int
    prefix: str  # the part of a name typed before the cursor ('' when none)
    word_start: int  # where that name starts
    before: list[Token]  # significant tokens wholly before the word being typed
    scheme: SchemeOutline | None
    statement: str | None  # the statement keyword of the scheme-body statement the cursor is in
    calls: list[tuple[str, int]]  # open calls, innermost last: (function name, arguments before the cursor)
    depth: int  # brackets open at the cursor (within its scheme)
    inside: Token | None  # the string literal or comment the cursor is inside
    at_statement_start: bool  # nothing of the current statement typed before the word

    @property
    def prev(self) -> Token | None:
        return self.before[-1] if self.before else None

    def prev_text(self, k: int = 1) -> str | None:
        return self.before[-k].text if len(self.before) >= k else None


def cursor(o: Outline, offset: int) -> Cursor:
    """The context of ``offset`` in the text ``o`` outlines."""
    text = o.text
    offset = max(0, min(offset, len(text)))
    inside = None
    before: list[Token] = []
    for t in o.tokens:
        if t.end > offset or (t.end == offset and t.kind == "str" and (len(t.text) < 2 or not t.text.endswith('"'))):
            if t.kind == "str" and t.start < offset:
                inside = t
            break
        if t.kind == "comment":
            if t.end >= offset and t.start < offset:
                inside = t  # inside a comment: no completion
            continue
        before.append(t)
    m = re.search(r"[A-Za-z_][A-Za-z0-9_]*$", text[max(0, offset - 200):offset])
    prefix = m.group() if m else ""
    if prefix and before and before[-1].kind == "name" and before[-1].end == offset:
        before.pop()
    elif prefix and before and before[-1].end == offset and before[-1].kind == "num":
        prefix = ""  # '1e' of a number is not a name
    word_start = offset - len(prefix)
    stack: list[int] = []
    for idx, t in enumerate(before):
        if t.kind == "op" and t.text in _OPEN:
            stack.append(idx)
        elif t.kind == "op" and t.text in _CLOSE and stack:
            stack.pop()
    calls = []
    for idx in stack:
        if before[idx].text == "(" and idx > 0 and before[idx - 1].kind == "name":
            level = sum(1 for t in before[idx + 1:] if t.text == "," and t.depth == before[idx].depth + 1)
            calls.append((before[idx - 1].text, level))
    scheme = o.scheme_at(word_start)
    statement = None
    start_ok = True
    if scheme is not None and scheme.body_start is not None and word_start >= scheme.body_start:
        for t in reversed(before):
            if t.start < scheme.body_start:
                break
            if t.depth - scheme.depth0 == 1 and t.kind == "name" and t.text in STATEMENT_KEYWORDS:
                statement = t.text
                break
        last = before[-1] if before else None
        start_ok = last is None or last.text in ("{", "}", ";") or _line_start(text, word_start)
    else:
        last = before[-1] if before else None
        start_ok = last is None or last.text in ("}", ";") or (last.kind == "str" and _line_start(text, word_start))
    depth = len(stack) - (scheme.depth0 if scheme is not None else 0)
    return Cursor(offset, prefix, word_start, before, scheme, statement, calls, depth, inside, start_ok)
