"""The canonical form of a `.pe` file: ``parse(format(x)) == parse(x)``, and format is idempotent.

Layout: two-space indentation, one statement per line, blocks (``channels``,
``train``, ``eval``) one entry per line, a blank line between top-level items,
expressions printed with the fewest parentheses and numbers in their shortest
round-trip form. Comments are kept: a comment on its own line stays before the
construct that follows it; a comment after code stays at the end of that line.
"""

from __future__ import annotations

from dataclasses import dataclass

from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.statements import BY_KIND, regime_text

INDENT = "  "


@dataclass
class _Comments:
    own: dict[int, str]  # line -> text, comments alone on their line
    trailing: dict[int, str]  # line -> text, comments after code

    def leading(self, before_line: int, after_line: int) -> list[str]:
        lines = sorted(ln for ln in self.own if after_line < ln < before_line)
        return [self.own.pop(ln) for ln in lines]

    def trail(self, first: int, last: int) -> str:
        for ln in range(first, last + 1):
            if ln in self.trailing:
                return "  " + self.trailing.pop(ln)
        return ""

    def inside(self, first: int, last: int) -> list[str]:
        """Every other comment on lines first .. last (a construct spanning several lines), in order."""
        found = sorted((ln, d) for d in (self.own, self.trailing) for ln in d if first <= ln <= last)
        return [d.pop(ln) for ln, d in found]

    def rest(self) -> list[str]:
        out = [self.own[ln] for ln in sorted(self.own)] + [self.trailing[ln] for ln in sorted(self.trailing)]
        self.own.clear()
        self.trailing.clear()
        return out


def _split_comments(module: ast.Module, text: str | None) -> _Comments:
    own: dict[int, str] = {}
    trailing: dict[int, str] = {}
    lines = text.split("\n") if text is not None else None
    for c in module.comments:
        ln = c.span.line if c.span else 0
        before = lines[ln - 1][: c.span.col - 1] if lines and 0 < ln <= len(lines) and c.span else ""
        (trailing if before.strip() else own)[ln] = c.text
    return _Comments(own, trailing)


def _line(node) -> int:
    return node.span.line if node is not None and node.span else 0


def _end(node) -> int:
    return node.span.end_line if node is not None and node.span else 0


class _Writer:
    def __init__(self, comments: _Comments):
        self.c = comments
        self.out: list[str] = []
        self.cursor = 0  # last source line consumed

    def lead(self, node, depth: int) -> None:
        for text in self.c.leading(_line(node), self.cursor):
            self.out.append(INDENT * depth + text)

    def emit(self, depth: int, text: str, node=None, first: int | None = None, last: int | None = None,
             inner: int | None = None) -> None:
        """One output line for the construct on source lines first .. last.

        The first trailing comment in that range stays at the end of the line; any other
        comment in the range (inside a construct written over several lines) follows on its
        own line, at depth ``inner`` (the block's depth for an opening line).
        """
        trail, more = "", []
        if node is not None and node.span:
            lo, hi = first or node.span.line, node.span.line if last is None else last
            trail = self.c.trail(lo, hi)
            more = self.c.inside(lo, hi)
            self.cursor = max(self.cursor, hi)
        self.out.append(INDENT * depth + text + trail)
        self.out.extend(INDENT * (depth if inner is None else inner) + t for t in more)

    def close(self, depth: int, text: str, node, shared: bool = False) -> None:
        end = _end(node)
        for t in self.c.leading(end + 1 if end else 10**9, self.cursor):
            self.out.append(INDENT * (depth + 1) + t)
        trail = self.c.trail(end, end) if end and not shared else ""
        self.cursor = max(self.cursor, end)
        self.out.append(INDENT * depth + text + trail)


def _claim(node, nxt) -> int:
    """The last source line whose comments belong to ``node``: a comment on a line shared with
    the next construct belongs to that one (``let a = 1; let b = 2  # about b``)."""
    end = _end(node)
    return end - 1 if nxt is not None and _line(nxt) == end else end


def _item_head(item) -> str:
    """The left side of a block's line: a group or entry name, or a layer rule with its arguments."""
    if isinstance(item, ast.LayerRule):
        args = "" if item.args is None else "(" + ", ".join(to_source(a) for a in item.args) + ")"
        return item.rule + args
    return item.name


def _stmt(w: _Writer, st, depth: int, nxt=None) -> None:
    w.lead(st, depth)
    record = BY_KIND[st.kind]
    if record.form is not None:
        w.emit(depth, record.form(st), st, last=_claim(st, nxt))
        return
    assert record.block is not None  # a statement record without a one-line form is a block
    head, items, value_of = record.block(st)
    first_item = _line(items[0]) if items else _end(st)
    w.emit(depth, head + " {", st, last=first_item - 1, inner=depth + 1)
    for i, it in enumerate(items):
        w.lead(it, depth + 1)
        nxt_item = items[i + 1] if i + 1 < len(items) else None
        text = regime_text(it) if value_of is None else f"{_item_head(it)} = {to_source(value_of(it))}"
        w.emit(depth + 1, text, it, last=_claim(it, nxt_item))
    w.close(depth, "}", st, shared=nxt is not None and _line(nxt) == _end(st))


def format_module(module: ast.Module, text: str | None = None) -> str:
    """Canonical text of a parsed module. ``text`` (the original) places the comments."""
    w = _Writer(_split_comments(module, text))
    items: list[ast.Import | ast.SchemeDecl] = sorted([*module.imports, *module.schemes], key=_line)
    prev_kind = None
    for item in items:
        if w.out and not (prev_kind == "import" and item.kind == "import"):
            w.out.append("")
        w.lead(item, 0)
        if item.kind == "import":
            w.emit(0, f"import {to_source(ast.Str(value=item.path))}", item)
        else:
            header = f"scheme {item.name}"
            if item.base:
                header += f" extends {item.base}"
            if item.doc is not None:
                header += f" {to_source(ast.Str(value=item.doc))}"
            body_first = _line(item.body[0]) if item.body else _end(item)
            w.emit(0, header + " {", item, last=body_first - 1, inner=1)
            for i, st in enumerate(item.body):
                _stmt(w, st, 1, item.body[i + 1] if i + 1 < len(item.body) else None)
            w.close(0, "}", item)
        prev_kind = item.kind
    rest = w.c.rest()
    if rest:
        if w.out:
            w.out.append("")
        w.out.extend(rest)
    return "\n".join(w.out) + "\n" if w.out else ""
