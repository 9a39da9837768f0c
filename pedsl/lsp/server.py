"""``pedsl lsp``: the pygls server over stdio, each request handed to a :class:`~pedsl.lsp.session.Session`.

The wire is :mod:`pedsl.lsp.transport` (bounded frames; malformed messages answered with their JSON-RPC
error); :class:`PeProtocol` adds the protocol's rules pygls leaves out: a request before ``initialize``
is refused with ServerNotInitialized, one after ``shutdown`` with InvalidRequest, and the open documents
live in the session (under the size limit of ``pedsl check``), not in pygls's workspace.

Diagnostics are published when a document opens, a moment after the last of a run of changes (a burst
of edits is checked once), and for every open document when one is saved (it may be imported by the
others).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from pedsl.lsp import transport
from pedsl.lsp.session import Refused, Session, uri_path
from pedsl.lsp.transport import Frame, Problem

DEBOUNCE_S = 0.15  # diagnostics wait this long after a change for the next one


def _version() -> str:
    try:
        return version("pedsl")
    except PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        return "0"


class RefusedError(JsonRpcException):
    """A request refused on purpose (an unreadable file, the server not initialized): answered with its code,
    never logged as a failure."""


class PeProtocol(LanguageServerProtocol):
    """pygls's protocol, fed checked messages by :func:`receive` and keeping the protocol's order."""

    _server: "PeServer"

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.ready = False  # initialize has been received

    def reply_error(self, msg_id, code: int, message: str) -> None:
        self._send_data(lsp.ResponseErrorMessage(id=msg_id, error=lsp.ResponseError(code=code, message=message)))

    def receive(self, frame: Frame) -> None:
        """One frame off the wire: dispatched, or answered (a request) or reported (anything else) as malformed."""
        if frame.problem is not None:
            self._server.tell(f"pedsl lsp: {frame.problem}", lsp.MessageType.Warning)
            return
        # serve() hands on only frames that carry a problem or a body (an end frame stops it)
        assert frame.body is not None
        try:
            data = transport.parse(frame.body)
            message = transport.decode(data, self.get_message_type, lambda i: self._result_types.pop(i, None),
                                       self._converter.structure)
        except Problem as p:
            if p.is_request or p.code in (transport.PARSE_ERROR, transport.INVALID_REQUEST):
                self.reply_error(p.msg_id, p.code, p.message)
            else:
                self._server.tell(f"pedsl lsp: ignored a notification: {p.message}", lsp.MessageType.Error)
            return
        self.handle_message(message)

    def handle_message(self, message) -> None:
        method = getattr(message, "method", None)
        msg_id = getattr(message, "id", None)
        is_request = method is not None and msg_id is not None
        if method == lsp.INITIALIZE and self.ready:
            return self.reply_error(msg_id, transport.INVALID_REQUEST, "the server is already initialized")
        if not self.ready and method not in (lsp.INITIALIZE, lsp.EXIT):
            if is_request:  # notifications before initialize are dropped, as the protocol says
                self.reply_error(msg_id, transport.SERVER_NOT_INITIALIZED,
                                 f"{method}: the server is not initialized (send initialize first)")
            return
        if self._shutdown and method != lsp.EXIT:
            if is_request:
                self.reply_error(msg_id, transport.INVALID_REQUEST, f"{method}: the server is shutting down")
            return
        if method == lsp.INITIALIZE:
            self.ready = True
        super().handle_message(message)

    # The open documents are the session's (pygls's workspace would hold any size and read unopened files).
    @lsp_method(lsp.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: lsp.DidOpenTextDocumentParams):
        yield self.fm.features[lsp.TEXT_DOCUMENT_DID_OPEN], (params,), None

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: lsp.DidChangeTextDocumentParams):
        yield self.fm.features[lsp.TEXT_DOCUMENT_DID_CHANGE], (params,), None

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: lsp.DidCloseTextDocumentParams):
        yield self.fm.features[lsp.TEXT_DOCUMENT_DID_CLOSE], (params,), None


class PeServer(LanguageServer):
    protocol: PeProtocol  # made by LanguageServer.__init__ from protocol_cls=PeProtocol

    def __init__(self):
        super().__init__("pedsl", _version(), text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
                         protocol_cls=PeProtocol)
        self.session = Session(report=self._log)
        self.versions: dict[str, int | None] = {}
        self._pending: dict[str, asyncio.TimerHandle] = {}

    def tell(self, message: str, kind: lsp.MessageType) -> None:
        """A line for the user (window/showMessage) or the log (window/logMessage)."""
        if kind == lsp.MessageType.Warning:
            self.window_show_message(lsp.ShowMessageParams(type=kind, message=message))
        else:
            self.window_log_message(lsp.LogMessageParams(type=kind, message=message))

    def _log(self, message: str, level: str) -> None:
        kinds = {"error": lsp.MessageType.Error, "warning": lsp.MessageType.Warning}
        self.tell(message, kinds.get(level, lsp.MessageType.Log))

    def publish(self, uri: str) -> None:
        self._pending.pop(uri, None)
        if uri not in self.session.texts and uri not in self.session.oversize:
            return  # closed meanwhile
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=uri, diagnostics=self.session.diagnostics(uri), version=self.versions.get(uri)))

    def schedule(self, uri: str, delay: float) -> None:
        """Publish the document's diagnostics after ``delay`` seconds, unless another change comes first."""
        pending = self._pending.pop(uri, None)
        if pending is not None:
            pending.cancel()
        self._pending[uri] = asyncio.get_running_loop().call_later(delay, self.publish, uri)

    def start_io(self, stdin=None, stdout=None) -> int:
        """Serve until the client says exit (the exit code: 0 after shutdown, else 1) or its input ends (0)."""
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        # The reader thread blocks in a read; on a stream of its own (not sys.stdin, which the interpreter
        # locks to close at exit) a client that keeps the pipe open after `exit` cannot abort the exit.
        stream = stdin or os.fdopen(os.dup(sys.stdin.fileno()), "rb")
        try:
            asyncio.run(transport.serve(stream, self.protocol.receive, self._stop_event))
            return 0
        except SystemExit as stop:  # pygls's exit handler
            return stop.code if isinstance(stop.code, int) else 0
        except BrokenPipeError:  # the client went away
            return 0
        finally:
            self.shutdown()


server = PeServer()


def request(method: str, options=None) -> Callable:
    """Register a request handler; a :class:`Refused` from the session is answered with its error code."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(ls: PeServer, params):
            try:
                return fn(ls, params)
            except Refused as r:
                raise RefusedError(message=r.message, code=r.code) from None

        return server.feature(method, options)(run)

    return wrap


@server.feature(lsp.INITIALIZE)
def initialize(ls: PeServer, params: lsp.InitializeParams) -> None:
    caps = params.capabilities
    completion = caps.text_document.completion if caps.text_document else None
    item = completion.completion_item if completion else None
    hover_caps = caps.text_document.hover if caps.text_document else None
    ls.session.snippets = bool(item and item.snippet_support)
    ls.session.markdown = bool(hover_caps and lsp.MarkupKind.Markdown in (hover_caps.content_format or ()))
    root = params.root_uri or (params.workspace_folders[0].uri if params.workspace_folders else None)
    ls.session.root = uri_path(root) if root else None


@server.feature(lsp.INITIALIZED)
def initialized(ls: PeServer, params: lsp.InitializedParams) -> None:
    ls.session.encoding = str(ls.workspace.position_encoding or "utf-16")


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: PeServer, params: lsp.DidOpenTextDocumentParams) -> None:
    doc = params.text_document
    ls.versions[doc.uri] = doc.version
    ls.session.update(doc.uri, doc.text)
    ls.schedule(doc.uri, 0)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: PeServer, params: lsp.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.versions[uri] = params.text_document.version
    for change in params.content_changes:
        if isinstance(change, lsp.TextDocumentContentChangePartial):
            ls.session.edit(uri, change.range.start, change.range.end, change.text)
        else:
            ls.session.update(uri, change.text)
    ls.schedule(uri, DEBOUNCE_S)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: PeServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.session.saved()
    for uri in [*ls.session.texts, *ls.session.oversize]:
        ls.schedule(uri, DEBOUNCE_S)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: PeServer, params: lsp.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.session.close(uri)
    ls.versions.pop(uri, None)
    pending = ls._pending.pop(uri, None)
    if pending is not None:
        pending.cancel()
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@request(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=["(", '"', ","]))
def completion(ls: PeServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    return lsp.CompletionList(is_incomplete=False, items=ls.session.completion(params.text_document.uri,
                                                                               params.position))


@request(lsp.TEXT_DOCUMENT_SIGNATURE_HELP, lsp.SignatureHelpOptions(trigger_characters=["(", ","]))
def signature_help(ls: PeServer, params: lsp.SignatureHelpParams) -> lsp.SignatureHelp | None:
    return ls.session.signature_help(params.text_document.uri, params.position)


@request(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: PeServer, params: lsp.HoverParams) -> lsp.Hover | None:
    return ls.session.hover(params.text_document.uri, params.position)


@request(lsp.TEXT_DOCUMENT_DEFINITION)
def definition(ls: PeServer, params: lsp.DefinitionParams) -> list[lsp.Location]:
    return ls.session.definition(params.text_document.uri, params.position)


@request(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbol(ls: PeServer, params: lsp.DocumentSymbolParams) -> list[lsp.DocumentSymbol]:
    return ls.session.symbols(params.text_document.uri)


@request(lsp.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: PeServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit] | None:
    return ls.session.formatting(params.text_document.uri)


@request(lsp.TEXT_DOCUMENT_CODE_ACTION, lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix]))
def code_action(ls: PeServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
    return ls.session.code_actions(params.text_document.uri, params.range)


class _OneLine(logging.Formatter):
    """pygls's own log records as one line each: never a traceback on the editor's stderr."""

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().splitlines() or [""]
        return f"pedsl lsp: {record.levelname.lower()}: {lines[0][:300]}"


def _not_refused(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], RefusedError))


def quiet_logging() -> None:
    """pygls logs warnings and failures with tracebacks through the root logger; here they are one line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.addFilter(_not_refused)
    handler.setLevel(logging.WARNING)
    log = logging.getLogger("pygls")
    log.handlers[:] = [handler]
    log.propagate = False


def main() -> int:
    """Serve over standard input and output until the client says exit; the process's exit code."""
    quiet_logging()
    return server.start_io()
