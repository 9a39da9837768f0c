"""``pedsl lsp``: the pygls server over stdio, each request handed to a :class:`~pedsl.lsp.session.Session`.

Diagnostics are published when a document opens or changes, and for every open document when one is
saved (it may be imported by the others).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from pedsl.lsp.session import Session, uri_path


def _version() -> str:
    try:
        return version("pedsl")
    except PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        return "0"


class PeServer(LanguageServer):
    def __init__(self):
        super().__init__("pedsl", _version(), text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental)
        self.session = Session(report=self._log)

    def _log(self, message: str, level: str) -> None:
        kind = lsp.MessageType.Error if level == "error" else lsp.MessageType.Log
        self.window_log_message(lsp.LogMessageParams(type=kind, message=message))

    def publish(self, uri: str) -> None:
        doc = self.workspace.get_text_document(uri)
        self.session.update(uri, doc.source)
        self.text_document_publish_diagnostics(
            lsp.PublishDiagnosticsParams(uri=uri, diagnostics=self.session.diagnostics(uri), version=doc.version))


server = PeServer()


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
    ls.publish(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: PeServer, params: lsp.DidChangeTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: PeServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.session.saved()
    for uri in list(ls.session.texts):
        ls.publish(uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: PeServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.session.close(params.text_document.uri)
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _sync(ls: PeServer, uri: str) -> None:
    ls.session.update(uri, ls.workspace.get_text_document(uri).source)


@server.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=["(", '"', ","]))
def completion(ls: PeServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    _sync(ls, params.text_document.uri)
    return lsp.CompletionList(is_incomplete=False, items=ls.session.completion(params.text_document.uri,
                                                                               params.position))


@server.feature(lsp.TEXT_DOCUMENT_SIGNATURE_HELP, lsp.SignatureHelpOptions(trigger_characters=["(", ","]))
def signature_help(ls: PeServer, params: lsp.SignatureHelpParams) -> lsp.SignatureHelp | None:
    _sync(ls, params.text_document.uri)
    return ls.session.signature_help(params.text_document.uri, params.position)


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: PeServer, params: lsp.HoverParams) -> lsp.Hover | None:
    _sync(ls, params.text_document.uri)
    return ls.session.hover(params.text_document.uri, params.position)


@server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
def definition(ls: PeServer, params: lsp.DefinitionParams) -> list[lsp.Location]:
    _sync(ls, params.text_document.uri)
    return ls.session.definition(params.text_document.uri, params.position)


@server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbol(ls: PeServer, params: lsp.DocumentSymbolParams) -> list[lsp.DocumentSymbol]:
    _sync(ls, params.text_document.uri)
    return ls.session.symbols(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: PeServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit] | None:
    _sync(ls, params.text_document.uri)
    return ls.session.formatting(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION,
                lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix]))
def code_action(ls: PeServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
    _sync(ls, params.text_document.uri)
    return ls.session.code_actions(params.text_document.uri, params.range)


def main() -> None:
    """Serve over standard input and output until the client says exit."""
    server.start_io()
