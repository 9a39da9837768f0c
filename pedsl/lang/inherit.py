"""Scheme lookup in a loaded file and the ``extends`` chain: finding a scheme's bases and merging them.

Merging rule for ``extends``, each statement's record's ``inherit`` (pedsl.lang.statements):
``param``/``let`` override by name; ``layout``, ``axes``, ``bias``, ``temperature``, the
attention's shape and the ``channels`` block as a whole; ``train`` and ``eval`` entries key
by key; and the transports as a set: a child that declares any ``qk``/``qkv`` line replaces
all of its base's transports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pedsl.errors import CheckError, Diagnostic, did_you_mean
from pedsl.lang import ast
from pedsl.lang.imports import Source
from pedsl.lang.diagnostics import node_pos, sink_for
from pedsl.lang.statements import APPEND, BY_KIND, BY_NAME, KEYED, ONE, ONE_FIELDS, RECORDS, SET

MAX_CHAIN = 64  # schemes in one extends chain


@dataclass
class Located:
    """A statement with the file it came from (for diagnostics in base files)."""

    stmt: Any
    src: Source


def visible_schemes(src: Source) -> dict[str, tuple[ast.SchemeDecl, Source]]:
    """Schemes declared in src or in the files it imports (cached: chains ask for it per link)."""
    if src.scope is not None:
        return src.scope
    out: dict[str, tuple[ast.SchemeDecl, Source]] = {}
    for imp in src.imports:
        out.update(visible_schemes(imp))
    for decl in src.module.schemes:
        out[decl.name] = (decl, src)
    src.scope = out
    return out


def select_scheme(src: Source, name: str | None) -> ast.SchemeDecl:
    decl = _select(src, name)
    if src.by_name is None:
        src.by_name = {}
        for d in src.module.schemes:
            src.by_name.setdefault(d.name, []).append(d)
    same = src.by_name[decl.name]
    if len(same) > 1:
        sink = sink_for(src)
        sink.add("E205", f"scheme '{decl.name}' is declared twice", **node_pos(same[1]),
                 hint=f"the first is on line {same[0].span.line}" if same[0].span else None)
        sink.raise_if_errors()
    return decl


def _select(src: Source, name: str | None) -> ast.SchemeDecl:
    decls = src.module.schemes
    if name is not None:
        for d in decls:
            if d.name == name:
                return d
        hint = did_you_mean(name, [d.name for d in decls])
        raise CheckError(
            f"no scheme named '{name}' in {src.file or 'the input'}", code="E215", file=src.file,
            hint=hint or ("it declares: " + ", ".join(d.name for d in decls) if decls else "it declares no scheme"),
        )
    if not decls:
        raise CheckError(f"{src.file or 'the input'} declares no scheme", code="E215", file=src.file, line=1, col=1,
                         hint='write one: scheme name "description" { ... }')
    if len(decls) == 1:
        return decls[0]
    stem = Path(src.file).stem if src.file else None
    for d in decls:
        if d.name == stem:
            return d
    return decls[-1]


def chain(decl: ast.SchemeDecl, src: Source, diags: list[Diagnostic]) -> list[tuple[ast.SchemeDecl, Source]]:
    """The extends chain, root first. Reports unknown bases and cycles."""
    scope = visible_schemes(src)
    out = [(decl, src)]
    seen = {decl.name}
    cur, cur_src = decl, src
    while cur.base is not None:
        if cur.base in seen:
            sink = sink_for(cur_src)
            path = " -> ".join([d.name for d, _ in out] + [cur.base])
            sink.add("E207", f"extends cycle: {path}", hint="a scheme cannot extend itself, directly or not",
                     **node_pos(cur))
            diags.extend(sink.items)
            break
        found = visible_schemes(cur_src).get(cur.base) or scope.get(cur.base)
        if found is None:
            sink = sink_for(cur_src)
            hint = did_you_mean(cur.base, scope)
            sink.add("E206", f"'{cur.name}' extends unknown scheme '{cur.base}'",
                     hint=hint or "declare it above or import the file that declares it", **node_pos(cur))
            diags.extend(sink.items)
            break
        if len(out) >= MAX_CHAIN:
            sink = sink_for(cur_src)
            sink.add("E207", f"extends chain of '{decl.name}' is longer than {MAX_CHAIN} schemes",
                     hint="extend a scheme nearer the root", **node_pos(decl if cur_src is src else cur))
            diags.extend(sink.items)
            break
        seen.add(cur.base)
        cur, cur_src = found
        out.append((cur, cur_src))
    return list(reversed(out))


@dataclass
class Merged:
    """A scheme's statements after its ``extends`` chain. The statements a scheme has at most one of
    (``layout``, ``axes``, ``window`` ...: pedsl.lang.statements.ONE_FIELDS) are read as attributes by
    their name (None when absent)."""

    name: str
    doc: str = ""
    bases: tuple[str, ...] = ()
    params: dict[str, Located] = field(default_factory=dict)
    lets: dict[str, Located] = field(default_factory=dict)
    one: dict[str, Located] = field(default_factory=dict)  # ONE_FIELDS name -> its nearest statement
    transports: list[Located] = field(default_factory=list)
    train: dict[str, Located] = field(default_factory=dict)
    eval: dict[str, Located] = field(default_factory=dict)
    allow: list[Located] = field(default_factory=list)

    def __getattr__(self, name: str) -> Located | None:
        if name in ONE_FIELDS:
            return self.__dict__.get("one", {}).get(name)
        raise AttributeError(name)


def _declared_name(st: ast.Stmt) -> str:
    """The name a statement inherited by name declares (the BY_NAME records: param, let)."""
    assert isinstance(st, (ast.Param, ast.Let)), st.kind
    return st.name


def merge(links: list[tuple[ast.SchemeDecl, Source]], diags: list[Diagnostic]) -> Merged:
    decl, _ = links[-1]
    m = Merged(name=decl.name, bases=tuple(d.name for d, _ in reversed(links[:-1])))
    for d, src in links:
        if d.doc:
            m.doc = d.doc
        own_transports: list[Located] = []
        seen: dict[tuple[str, str], ast.Node] = {}
        sink = sink_for(src)
        for st in d.body:
            record = BY_KIND[st.kind]
            key = ("name", _declared_name(st)) if record.inherit == BY_NAME else (st.kind, "") if record.inherit == ONE else None
            if key is not None:
                if key in seen:
                    what = f"'{key[1]}'" if key[0] == "name" else f"'{st.kind}'"
                    first = seen[key].span
                    sink.add("E205", f"{what} is declared twice in scheme '{d.name}'",
                             hint=f"the first is on line {first.line}" if first else None,
                             **node_pos(st))
                    continue
                seen[key] = st
            _take(m, record, Located(st, src), own_transports, d is decl, sink)
        if own_transports:
            m.transports = own_transports
        diags.extend(sink.items)
    return m


def _take(m: Merged, record, loc: Located, own_transports: list[Located], last: bool, sink) -> None:
    """One statement into the merged scheme, as its record's inherit mode says."""
    st = loc.stmt
    if record.inherit == BY_NAME:
        mine, other = getattr(m, record.merged), next(
            getattr(m, r.merged) for r in RECORDS if r.inherit == BY_NAME and r is not record)
        if st.name in other and other[st.name].src is loc.src and last:
            sink.add("E205", f"'{st.name}' is both a param and a let", **node_pos(st))
        mine[st.name] = loc
        other.pop(st.name, None)
    elif record.inherit == ONE:
        m.one[record.merged] = loc
    elif record.inherit == SET:
        own_transports.append(loc)
    elif record.inherit == KEYED:
        table = getattr(m, st.section)
        for entry in st.entries:
            table[entry.name] = Located(entry, loc.src)
    elif record.inherit == APPEND:
        getattr(m, record.merged).append(loc)
