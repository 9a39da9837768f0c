"""Go to definition and document symbols, from the outlines of the document and the files it imports.

``extends NAME`` leads to the base scheme (in whichever file declares it), ``import "f.pe"`` to the
file, a param or let to its nearest declaration along the ``extends`` chain (a declaration that
overrides a base's leads to the base's), ``on GROUP`` to the channel group.
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types as lsp

from pedsl.lsp.project import Document, Located, import_file, resolved
from pedsl.lsp.scan import Decl, Outline, cursor
from pedsl.lsp.text import Text


class Places:
    """Protocol locations of offsets in the document or in another file (one Text per file)."""

    def __init__(self, doc: Document, uri: str, encoding: str):
        self.doc, self.uri, self.encoding = doc, uri, encoding
        self._texts: dict[int, Text] = {}

    def text(self, o: Outline) -> Text:
        if id(o) not in self._texts:
            self._texts[id(o)] = Text(o.text, self.encoding)
        return self._texts[id(o)]

    def range(self, o: Outline, start: int, end: int) -> lsp.Range:
        t = self.text(o)
        return lsp.Range(start=lsp.Position(*t.position(start)), end=lsp.Position(*t.position(end)))

    def location(self, path: Path | None, o: Outline, start: int, end: int) -> lsp.Location:
        real = resolved(path) if path is not None and path != self.doc.path else None
        uri = real.as_uri() if real is not None else self.uri
        return lsp.Location(uri=uri, range=self.range(o, start, end))

    def of(self, link: Located, d: Decl) -> lsp.Location:
        return self.location(link.path, link.outline, d.start, d.end)


def definition(doc: Document, places: Places, offset: int) -> list[lsp.Location]:
    """Where the name (or import) at ``offset`` is declared; [] when it is a builtin or unknown."""
    o = doc.outline
    i = o.token_at(offset)
    if i is None:
        return []
    tok = o.tokens[i]
    c = cursor(o, tok.start)
    prev = c.prev_text(1)
    if tok.kind == "str" and prev == "import":
        folder = doc.path.parent if doc.path is not None else doc.base_dir
        target = import_file(folder, tok.text.strip('"'), doc.roots)
        origin = lsp.Range(start=lsp.Position(0, 0), end=lsp.Position(0, 0))
        real = resolved(target) if target is not None else None
        return [lsp.Location(uri=real.as_uri(), range=origin)] if real is not None else []
    if tok.kind != "name":
        return []
    if prev == "extends":
        loc = doc.visible().get(tok.text)
        return [places.of(loc, loc.scheme.decl)] if loc is not None else []
    scheme = c.scheme
    if scheme is None:
        return []
    if prev == "on":
        found = doc.lookup(scheme, tok.text, ("group",))
    else:
        found = doc.lookup(scheme, tok.text)
        if prev in ("param", "let") and found and found[0][1].start == tok.start and found[0][0].outline is o:
            found = found[1:] or found  # a declaration that overrides a base's leads to the base's
    return [places.of(*found[0])] if found else []


_KINDS = {"param": lsp.SymbolKind.Property, "let": lsp.SymbolKind.Variable, "group": lsp.SymbolKind.Field}


def symbols(doc: Document, places: Places) -> list[lsp.DocumentSymbol]:
    """Imports, and each scheme with its params, lets and channel groups."""
    o = doc.outline
    out = []
    for imp in o.imports:
        rng = places.range(o, imp.stmt_start, imp.stmt_end)
        out.append(lsp.DocumentSymbol(name=f'import "{imp.name}"', kind=lsp.SymbolKind.Module, range=rng,
                                      selection_range=places.range(o, imp.start, imp.end)))
    for s in o.schemes:
        children = [lsp.DocumentSymbol(name=d.name, kind=_KINDS[d.kind], detail=d.kind,
                                       range=places.range(o, d.stmt_start, max(d.stmt_end, d.end)),
                                       selection_range=places.range(o, d.start, d.end))
                    for d in s.members]
        end = s.close + 1 if s.close is not None else s.decl.stmt_end
        out.append(lsp.DocumentSymbol(
            name=s.name, kind=lsp.SymbolKind.Class, detail=f"extends {s.base}" if s.base else (s.doc or ""),
            range=places.range(o, s.decl.stmt_start, max(end, s.decl.end)),
            selection_range=places.range(o, s.decl.start, s.decl.end), children=children))
    return out
