"""The language server's state and requests, without the transport: the open documents, their cached
analyses, and one method per request, each answering something (never raising) on any text.

:mod:`pedsl.lsp.server` wires these methods to pygls; tests may call them directly.
"""

from __future__ import annotations

import functools
import logging
import traceback
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

from lsprotocol import types as lsp

from pedsl.errors import PedslError
from pedsl.lang import api
from pedsl.lsp import describe, features, fixes, navigate
from pedsl.lsp.project import Analysis, Document, Files
from pedsl.lsp.text import Text

log = logging.getLogger("pedsl.lsp")


def uri_path(uri: str) -> Path | None:
    """The file a ``file:`` URI names (None for an unsaved buffer or another scheme)."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return Path(unquote(parsed.path))


def answered(default):
    """Run a request; a failure inside pedsl is logged and answered with ``default`` (the server lives on)."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(self: "Session", *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - no request may stop the server
                self.failures.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
                self.report(f"pedsl lsp: {fn.__name__} failed: {type(exc).__name__}: {exc}\n"
                            + "".join(traceback.format_exc(limit=8)), "error")
                return default() if callable(default) else default

        return run

    return wrap


class Session:
    """Open documents by URI and what the requests about them need."""

    def __init__(self, root: Path | None = None, encoding: str = "utf-16", snippets: bool = True,
                 markdown: bool = True, report: Callable[[str, str], None] | None = None):
        self.root = root
        self.encoding = encoding
        self.snippets = snippets
        self.markdown = markdown  # the client renders Markdown (else the same text goes as plain text)
        # report(message, level): level "error" (a request failed inside pedsl) or "info"
        self.report = report or (lambda message, level: log.log(logging.ERROR if level == "error" else logging.INFO,
                                                                message))
        self.texts: dict[str, str] = {}
        self.failures: list[str] = []
        # Caches by the document's text and a generation: an edit of any open document can change what
        # another one sees through its imports (navigation reads open buffers), a save what it checks
        # against (diagnostics read the files as saved, like `pedsl check`).
        self._edits = self._saves = 0
        self._documents: dict[str, tuple[tuple[str, int], Document]] = {}
        self._analyses: dict[str, tuple[tuple[str, int], Analysis]] = {}
        self.files = Files(self._open_text)

    # ------------------------------------------------------------------ documents
    def _open_text(self, path: Path) -> str | None:
        for uri, text in self.texts.items():
            p = uri_path(uri)
            if p is not None and p.resolve() == path.resolve():
                return text
        return None

    def update(self, uri: str, text: str) -> None:
        if self.texts.get(uri) != text:
            self.texts[uri] = text
            self._edits += 1

    def saved(self) -> None:
        """A file was written: check every document again against the files on disk."""
        self._saves += 1

    def close(self, uri: str) -> None:
        self.texts.pop(uri, None)
        self._documents.pop(uri, None)
        self._analyses.pop(uri, None)
        self._edits += 1

    def document(self, uri: str) -> tuple[Document, Text]:
        text = self.texts.get(uri, "")
        key = (text, self._edits)
        hit = self._documents.get(uri)
        if hit is None or hit[0] != key:
            path = uri_path(uri)
            base = path.parent if path is not None else (self.root or Path.cwd())
            hit = (key, Document(text, path, base, self.files))
            self._documents[uri] = hit
        return hit[1], Text(text, self.encoding)

    def analysis(self, uri: str) -> tuple[Analysis, Text]:
        text = self.texts.get(uri, "")
        key = (text, self._saves)
        hit = self._analyses.get(uri)
        if hit is None or hit[0] != key:
            path = uri_path(uri)
            base = path.parent if path is not None else (self.root or Path.cwd())
            hit = (key, Analysis(Document(text, path, base, self.files)))
            self._analyses[uri] = hit
        return hit[1], Text(text, self.encoding)

    def _offset(self, uri: str, pos: lsp.Position) -> int:
        return Text(self.texts.get(uri, ""), self.encoding).offset(pos.line, pos.character)

    # ------------------------------------------------------------------ requests
    @answered(list)
    def diagnostics(self, uri: str) -> list[lsp.Diagnostic]:
        analysis, text = self.analysis(uri)
        return [f.lsp for f in fixes.findings(analysis, text)]

    def _format(self, content: lsp.MarkupContent | None) -> lsp.MarkupContent | None:
        if content is None or self.markdown:
            return content
        return lsp.MarkupContent(kind=lsp.MarkupKind.PlainText, value=content.value)

    @answered(list)
    def completion(self, uri: str, pos: lsp.Position) -> list[lsp.CompletionItem]:
        doc, text = self.document(uri)
        items = features.completions(doc, text, self._offset(uri, pos), self.snippets)
        for item in items:
            item.documentation = self._format(item.documentation)
        return items

    @answered(None)
    def signature_help(self, uri: str, pos: lsp.Position) -> lsp.SignatureHelp | None:
        doc, _ = self.document(uri)
        found = features.signature_help(doc, self._offset(uri, pos))
        for sig in found.signatures if found else ():
            sig.documentation = self._format(sig.documentation)
        return found

    @answered(None)
    def hover(self, uri: str, pos: lsp.Position) -> lsp.Hover | None:
        analysis, text = self.analysis(uri)
        found = describe.hover(analysis, text, self._offset(uri, pos))
        if found is not None:
            found.contents = self._format(found.contents)
        return found

    @answered(list)
    def definition(self, uri: str, pos: lsp.Position) -> list[lsp.Location]:
        doc, _ = self.document(uri)
        return navigate.definition(doc, navigate.Places(doc, uri, self.encoding), self._offset(uri, pos))

    @answered(list)
    def symbols(self, uri: str) -> list[lsp.DocumentSymbol]:
        doc, _ = self.document(uri)
        return navigate.symbols(doc, navigate.Places(doc, uri, self.encoding))

    @answered(None)
    def formatting(self, uri: str) -> list[lsp.TextEdit] | None:
        """The whole text replaced by ``pedsl fmt``'s, or no edit (text that does not parse is left alone)."""
        text = self.texts.get(uri, "")
        path = uri_path(uri)
        try:
            new = api.format_text(text, str(path) if path else None)
        except PedslError as err:
            self.report(f"pedsl fmt: not formatted: {err.diagnostics[0].render()}", "info")
            return None
        if new == text:
            return []
        t = Text(text, self.encoding)
        end = lsp.Position(*t.position(len(text)))
        return [lsp.TextEdit(range=lsp.Range(start=lsp.Position(0, 0), end=end), new_text=new)]

    @answered(list)
    def code_actions(self, uri: str, rng: lsp.Range) -> list[lsp.CodeAction]:
        analysis, text = self.analysis(uri)
        start = text.offset(rng.start.line, rng.start.character)
        end = text.offset(rng.end.line, rng.end.character)
        return fixes.code_actions(analysis, text, uri, start, end)
