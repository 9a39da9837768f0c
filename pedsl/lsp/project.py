"""A document and the files around it: what it imports, the schemes it can see, and its checked meaning.

Imports are followed by the language's own policy (:func:`pedsl.lang.imports.import_target`: relative to
the importing file, then the scheme library, confined to the open file's folder tree, the library and
the allowed import roots), so the editor never reads a file ``pedsl check`` would refuse. The checked
analysis (diagnostics, resolved schemes) goes through :mod:`pedsl.lang.api`, the same path as
``pedsl check FILE``; navigation works on :mod:`pedsl.lsp.scan` outlines, so it keeps working while
the text does not parse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pedsl.errors import Diagnostic, PedslError
from pedsl.lang import api
from pedsl.lang.imports import import_roots, import_target, read_source
from pedsl.lang.scheme import Scheme
from pedsl.limits import MAX_IMPORT_DEPTH, MAX_IMPORTS
from pedsl.lsp.scan import Decl, Outline, SchemeOutline, outline


_CACHED_CHARS = 16 << 20  # characters of the outlines of files on disk kept at once


@dataclass
class Located:
    """A scheme outline and the file (path, outline) it is declared in."""

    scheme: SchemeOutline
    path: Path | None  # None: the document itself when it has no path
    outline: Outline


class Files:
    """Outlines of files by path: an open document's text when the editor holds it, else the disk's."""

    def __init__(self, open_text: Callable[[Path], str | None] = lambda p: None):
        self.open_text = open_text
        self._disk: dict[Path, tuple[tuple[int, int], Outline]] = {}
        self._chars = 0

    def outline(self, path: Path) -> Outline | None:
        """The outline of the file, or None where pedsl would not read it (missing, not a regular file,
        too large, not UTF-8)."""
        text = self.open_text(path)
        if text is not None:
            return outline(text)
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        hit = self._disk.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            o = outline(read_source(path))
        except PedslError:
            return None
        if len(self._disk) >= 512 or self._chars + len(o.text) > _CACHED_CHARS:
            self._disk.clear()
            self._chars = 0
        self._disk[path] = (stamp, o)
        self._chars += len(o.text)
        return o


def resolved(path: Path) -> Path | None:
    """``path`` with its links followed; None for a symlink loop or a name the OS refuses."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def check_text(text: str, file: str, base_dir: Path) -> tuple[list[Diagnostic], object | None]:
    """Every diagnostic ``pedsl check`` reports for ``text`` (the file ``file``, its imports relative to
    ``base_dir``), and the loaded source (None when loading failed: a syntax error, a file too large, an
    import that cannot be loaded)."""
    try:
        src = api.load_text(text, file, base_dir)
    except PedslError as err:
        return err.diagnostics, None
    try:
        return api.check(src), src
    except PedslError as err:
        return err.diagnostics, src


def import_file(importing_dir: Path, name: str, roots: list[Path]) -> Path | None:
    """The file ``import "name"`` in a file of ``importing_dir`` loads, or None where pedsl refuses it."""
    try:
        target, refused = import_target(importing_dir, name, roots)
    except PedslError:
        return None
    return None if refused else target


@dataclass
class Document:
    """One open document: its text, its path (None for an unsaved buffer) and the folder imports start from."""

    text: str
    path: Path | None
    base_dir: Path
    files: Files = field(default_factory=Files)

    def __post_init__(self):
        self.outline = outline(self.text)
        self.roots = import_roots(self.base_dir)
        self._visible: dict[str, Located] | None = None
        self._chains: dict[int, tuple[SchemeOutline, list[Located]]] = {}

    @property
    def file(self) -> str | None:
        return None if self.path is None else str(self.path)

    # ------------------------------------------------------------------ imports and visible schemes
    def imported(self, o: Outline, folder: Path) -> list[tuple[Path, Outline]]:
        """The files ``o`` (a file in ``folder``) imports, in order, that pedsl would load."""
        out: list[tuple[Path, Outline]] = []
        for imp in o.imports:
            target = import_file(folder, imp.name, self.roots)
            if target is None:
                continue
            sub = self.files.outline(target)
            if sub is not None:
                out.append((target, sub))
        return out

    def _scope(self, path: Path | None, o: Outline, seen: set, depth: int) -> dict[str, Located]:
        """Schemes declared in a file or the files it imports (its own win), as the resolver sees them."""
        out: dict[str, Located] = {}
        folder = path.parent if path is not None else self.base_dir
        if depth < MAX_IMPORT_DEPTH and len(seen) < MAX_IMPORTS:
            for target, sub in self.imported(o, folder):
                key = resolved(target)
                if key in seen:
                    continue
                seen.add(key)
                out.update(self._scope(target, sub, seen, depth + 1))
        for s in o.schemes:
            out[s.name] = Located(s, path, o)
        return out

    def visible(self) -> dict[str, Located]:
        """Every scheme the document can name after ``extends``."""
        if self._visible is None:
            seen = {resolved(self.path)} if self.path is not None else set()
            self._visible = self._scope(self.path, self.outline, seen, 0)
        return self._visible

    def chain(self, scheme: SchemeOutline) -> list[Located]:
        """The scheme and its bases, the scheme first (stops at an unknown base or a cycle)."""
        hit = self._chains.get(id(scheme))
        if hit is not None and hit[0] is scheme:
            return hit[1]
        out = [Located(scheme, self.path, self.outline)]
        self._chains[id(scheme)] = (scheme, out)
        names = {scheme.name}
        scope = self.visible()
        while (base := out[-1].scheme.base) is not None and len(out) < 64:
            cur = out[-1]
            local = scope if cur.path == self.path else self._scope(cur.path, cur.outline, set(), 0)
            found = local.get(base) or scope.get(base)
            if found is None or found.scheme.name in names:
                break
            names.add(found.scheme.name)
            out.append(found)
        return out

    def lookup(self, scheme: SchemeOutline, name: str, kinds=("param", "let")) -> list[tuple[Located, Decl]]:
        """Declarations of ``name`` along the scheme's extends chain, nearest first."""
        out: list[tuple[Located, Decl]] = []
        for link in self.chain(scheme):
            d = link.scheme.member(name, kinds)
            if d is not None:
                out.append((link, d))
        return out

    # ------------------------------------------------------------------ the checked meaning
    def check(self) -> tuple[list[Diagnostic], object | None]:
        return check_text(self.text, self.file or "<untitled>", self.base_dir)


class Analysis:
    """A document's diagnostics and, on demand, its resolved schemes (cached for one text); ``diagnostics``
    given: a document that is not checked (too large to hold), with what was said of it instead."""

    def __init__(self, doc: Document, diagnostics: list[Diagnostic] | None = None):
        self.doc = doc
        if diagnostics is None:
            self.diagnostics, self.source = doc.check()
        else:
            self.diagnostics, self.source = diagnostics, None
        self._schemes: dict[str, tuple[Scheme | None, list[Diagnostic]]] = {}

    def resolved(self, name: str) -> Scheme | None:
        """The resolved scheme ``name`` of the document (None when it has errors)."""
        if name not in self._schemes:
            scheme = None
            if self.source is not None:
                try:
                    scheme, _ = api.load_with_warnings(self.source, scheme=name)
                except PedslError:
                    scheme = None
            self._schemes[name] = (scheme, [])
        return self._schemes[name][0]

    def own(self, d: Diagnostic) -> bool:
        """The diagnostic points into this document (not into a file it imports)."""
        if d.file is None or d.file in (self.doc.file, "<untitled>"):
            return True
        if self.doc.path is None:
            return False
        here = resolved(self.doc.path)
        return here is not None and resolved(Path(d.file)) == here

    def anchor_of(self, d: Diagnostic) -> tuple[int, int]:
        """Offsets in this document for a diagnostic found in an imported file: the import that leads to
        that file, else the first `extends`, else the start of the text."""
        doc, o = self.doc, self.doc.outline
        target = resolved(Path(d.file)) if d.file else None
        for imp in o.imports:
            p = import_file(doc.path.parent if doc.path else doc.base_dir, imp.name, doc.roots)
            if p is not None and target is not None and resolved(p) == target:
                return imp.start, imp.end
        for s in o.schemes:
            if s.base_at is not None:
                return s.base_at
        return 0, 0
