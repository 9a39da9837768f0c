"""The language server's state and requests, without the transport: the open documents, their cached
analyses, and one method per request, each answering something (never raising) on any text.

:mod:`pedsl.lsp.server` wires these methods to pygls; tests may call them directly.
"""

from __future__ import annotations

import functools
import logging
import traceback
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import unquote, urlparse

from lsprotocol import types as lsp

from pedsl.errors import Diagnostic, PedslError
from pedsl.lang import api
from pedsl.lang.imports import read_source
from pedsl.lang.parser import MAX_BYTES, MAX_TOKENS, token_estimate
from pedsl.lsp import describe, features, fixes, navigate
from pedsl.lsp.project import Analysis, Document, Files, check_text, resolved
from pedsl.lsp.text import Text

log = logging.getLogger("pedsl.lsp")

REQUEST_FAILED = lsp.LSPErrorCodes.RequestFailed.value
MAX_OPEN_TEXT = 64 * MAX_BYTES  # characters of all open documents together (each at most MAX_BYTES)
_CACHED = 64  # analyses kept for documents that are not open (read from disk)
_Doc = TypeVar("_Doc")  # a documentation field: MarkupContent, a plain string, None ...


class _NotHeld(Exception):
    """The document is open but too large to hold: requests about its text have nothing to answer."""


class Refused(Exception):
    """A request answered with an error instead of a result: an LSP error ``code`` and a one-line message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def uri_path(uri: str) -> Path | None:
    """The file a ``file:`` URI names (None for an unsaved buffer, another scheme, or a name no file can
    have: a NUL byte or a lone surrogate)."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = unquote(parsed.path)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return None if "\0" in path or not path else Path(path)


def answered(default):
    """Run a request; a failure inside pedsl is logged and answered with ``default`` (the server lives on)."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(self: "Session", *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Refused:
                raise
            except _NotHeld:  # a document too large to hold: nothing to say about its text
                return default() if callable(default) else default
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
        # report(message, level): level "error" (a request failed inside pedsl), "warning" (shown to the
        # user: a document is not checked) or "info"
        self.report = report or (lambda message, level: log.log(logging.ERROR if level == "error" else logging.INFO,
                                                                message))
        self.texts: dict[str, str] = {}
        # Open documents over the size `pedsl check` reads: not held, not analysed; what check says of them
        self.oversize: dict[str, list[Diagnostic]] = {}
        self.failures: list[str] = []
        # Caches by the document's text and a generation: an edit of any open document can change what
        # another one sees through its imports (navigation reads open buffers), a save what it checks
        # against (diagnostics read the files as saved, like `pedsl check`).
        self._edits = self._saves = 0
        self._documents: dict[str, tuple[tuple[str, int], Document]] = {}
        self._analyses: dict[str, tuple[tuple[str, int], Analysis]] = {}
        self._lines: dict[str, Text] = {}  # the line index of each open text, for incremental edits
        self.files = Files(self._open_text)

    # ------------------------------------------------------------------ documents
    def _open_text(self, path: Path) -> str | None:
        key = resolved(path)
        for uri, text in self.texts.items():
            p = uri_path(uri)
            if p is not None and key is not None and resolved(p) == key:
                return text
        return None

    def update(self, uri: str, text: str) -> None:
        """The whole text of an open document (opened, or replaced by the editor)."""
        held = sum(len(t) for u, t in self.texts.items() if u != uri)
        if len(text) > MAX_BYTES or held + len(text) > MAX_OPEN_TEXT:
            self._drop(uri, self._too_large(uri, text, held))
            return
        self.oversize.pop(uri, None)
        if self.texts.get(uri) != text:
            self.texts[uri] = text
            self._lines.pop(uri, None)
            self._edits += 1

    def _too_large(self, uri: str, text: str, held: int) -> list[Diagnostic]:
        path = uri_path(uri)
        file = str(path) if path is not None else "<untitled>"
        if len(text) > MAX_BYTES:  # what `pedsl check` says of it (E102, without reading it all)
            return check_text(text, file, self._base(path))[0]
        return [Diagnostic(code="E102", message=f"not checked: the open documents hold {held / 1e6:.0f} MB of text "
                           f"(the limit is {MAX_OPEN_TEXT / 1e6:.0f} MB)", file=file, line=1, col=1,
                           hint="close some documents, then edit this one again")]

    def _drop(self, uri: str, diagnostics: list[Diagnostic]) -> None:
        if uri not in self.oversize:
            self.report(f"pedsl: {uri} is not checked: {diagnostics[0].message}", "warning")
        self.oversize[uri] = diagnostics
        self.texts.pop(uri, None)
        self._lines.pop(uri, None)
        self._documents.pop(uri, None)
        self._analyses.pop(uri, None)
        self._edits += 1

    def edit(self, uri: str, start: lsp.Position, end: lsp.Position, new: str) -> bool:
        """Apply an incremental change of an open document; False when its text is not held (too large:
        only a change of the whole text brings it back)."""
        text = self.texts.get(uri)
        if text is None:
            return False
        lines = self._lines.get(uri) or Text(text, self.encoding)
        a, b = lines.offset(start.line, start.character), lines.offset(end.line, end.character)
        a, b = min(a, b), max(a, b)
        self.update(uri, text[:a] + new + text[b:])
        return uri in self.texts

    def saved(self) -> None:
        """A file was written: check every document again against the files on disk."""
        self._saves += 1

    def close(self, uri: str) -> None:
        self.texts.pop(uri, None)
        self.oversize.pop(uri, None)
        self._lines.pop(uri, None)
        self._documents.pop(uri, None)
        self._analyses.pop(uri, None)
        self._edits += 1

    def _base(self, path: Path | None) -> Path:
        return path.parent if path is not None else (self.root or Path.cwd())

    def text_of(self, uri: str) -> str:
        """The text of a document: the editor's when it is open (empty when too large to hold), else the
        file's, read as `pedsl check` reads it (a regular file under the size limit, UTF-8)."""
        if uri in self.texts:
            return self.texts[uri]
        if uri in self.oversize:
            raise _NotHeld()
        path = uri_path(uri)
        if path is None:
            raise Refused(REQUEST_FAILED, f"{uri[:200]} is neither an open document nor a file pedsl can read")
        try:
            return read_source(path)
        except PedslError as err:
            raise Refused(REQUEST_FAILED, f"the document is not open and its file cannot be read: "
                                          f"{err.diagnostics[0].message}") from None

    def _cached(self, cache: dict, uri: str, key: tuple, make: Callable):
        hit = cache.get(uri)
        if hit is None or hit[0] != key:
            if len(cache) >= _CACHED + len(self.texts):  # entries of files read from disk come and go
                for other in [u for u in cache if u not in self.texts]:
                    del cache[other]
            hit = (key, make())
            cache[uri] = hit
        return hit[1]

    def document(self, uri: str) -> tuple[Document, Text]:
        text = self.text_of(uri)
        if token_estimate(text) > MAX_TOKENS:  # `pedsl check` refuses it (E102): no outline of it either
            raise _NotHeld()
        path = uri_path(uri)
        doc = self._cached(self._documents, uri, (text, self._edits),
                           lambda: Document(text, path, self._base(path), self.files))
        return doc, Text(text, self.encoding)

    def analysis(self, uri: str) -> tuple[Analysis, Text]:
        path = uri_path(uri)
        if uri in self.oversize:  # not held: what `pedsl check` said of it when it came
            return Analysis(Document("", path, self._base(path), self.files), self.oversize[uri]), Text("")
        text = self.text_of(uri)
        found = self._cached(self._analyses, uri, (text, self._saves), lambda: self._analyse(text, path))
        return found, Text(text, self.encoding)

    def _analyse(self, text: str, path: Path | None) -> Analysis:
        if token_estimate(text) > MAX_TOKENS:  # held (edits apply) but too long to check: E102, fast
            diagnostics = check_text(text, str(path) if path else "<untitled>", self._base(path))[0]
            return Analysis(Document("", path, self._base(path), self.files), diagnostics)
        return Analysis(Document(text, path, self._base(path), self.files))

    # ------------------------------------------------------------------ requests
    @answered(list)
    def diagnostics(self, uri: str) -> list[lsp.Diagnostic]:
        analysis, text = self.analysis(uri)
        return [f.lsp for f in fixes.findings(analysis, text)]

    def _format(self, content: _Doc) -> _Doc | lsp.MarkupContent:
        """Markdown documentation as plain text for a client that does not take markdown; anything else as is."""
        if not isinstance(content, lsp.MarkupContent) or self.markdown:
            return content
        return lsp.MarkupContent(kind=lsp.MarkupKind.PlainText, value=content.value)

    @answered(list)
    def completion(self, uri: str, pos: lsp.Position) -> list[lsp.CompletionItem]:
        doc, text = self.document(uri)
        items = features.completions(doc, text, text.offset(pos.line, pos.character), self.snippets)
        for item in items:
            item.documentation = self._format(item.documentation)
        return items

    @answered(None)
    def signature_help(self, uri: str, pos: lsp.Position) -> lsp.SignatureHelp | None:
        doc, text = self.document(uri)
        found = features.signature_help(doc, text.offset(pos.line, pos.character))
        for sig in found.signatures if found else ():
            sig.documentation = self._format(sig.documentation)
        return found

    @answered(None)
    def hover(self, uri: str, pos: lsp.Position) -> lsp.Hover | None:
        analysis, text = self.analysis(uri)
        found = describe.hover(analysis, text, text.offset(pos.line, pos.character))
        if found is not None:
            found.contents = self._format(found.contents)
        return found

    @answered(list)
    def definition(self, uri: str, pos: lsp.Position) -> list[lsp.Location]:
        doc, text = self.document(uri)
        return navigate.definition(doc, navigate.Places(doc, uri, self.encoding), text.offset(pos.line, pos.character))

    @answered(list)
    def symbols(self, uri: str) -> list[lsp.DocumentSymbol]:
        doc, _ = self.document(uri)
        return navigate.symbols(doc, navigate.Places(doc, uri, self.encoding))

    @answered(None)
    def formatting(self, uri: str) -> list[lsp.TextEdit] | None:
        """The whole text replaced by ``pedsl fmt``'s, or no edit (text that does not parse is left alone)."""
        text = self.text_of(uri)
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
