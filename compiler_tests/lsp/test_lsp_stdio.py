"""`pedsl lsp` driven over stdio as an editor drives it (pytest-lsp starts the real server in a subprocess):
diagnostics at the right range, completion after `geometric(`, hover on a parameter, go to the base
scheme, formatting, quick fixes, and random edits answered within a second each."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from compiler_helpers import ROOT, SCHEMES
from pedsl.lang import api
from pedsl.lsp.session import Session
from pedsl.lsp.text import Text

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, "-m", "pedsl", "lsp"]


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER), scope="module")
async def client(lsp_client: LanguageClient):
    markdown = [lsp.MarkupKind.Markdown, lsp.MarkupKind.PlainText]
    caps = lsp.ClientCapabilities(text_document=lsp.TextDocumentClientCapabilities(
        completion=lsp.CompletionClientCapabilities(completion_item=lsp.ClientCompletionItemOptions(
            snippet_support=True, documentation_format=markdown)),
        hover=lsp.HoverClientCapabilities(content_format=markdown),
        signature_help=lsp.SignatureHelpClientCapabilities(signature_information=lsp.ClientSignatureInformationOptions(
            documentation_format=markdown))))
    await lsp_client.initialize_session(lsp.InitializeParams(capabilities=caps, root_uri=ROOT.as_uri()))
    yield
    await lsp_client.shutdown_session()


async def _published(client: LanguageClient, send, uri: str, version: int) -> list[lsp.Diagnostic]:
    """Send a notification (open or change) and return the diagnostics published for that version."""
    waiting = client.protocol.wait_for_notification_async(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)  # before sending
    send()
    while True:
        params = await asyncio.wait_for(waiting, 20)
        if params.uri == uri and params.version == version:
            return list(params.diagnostics)
        waiting = client.protocol.wait_for_notification_async(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)


async def _open(client: LanguageClient, path: Path, text: str) -> tuple[str, list[lsp.Diagnostic]]:
    uri = path.resolve().as_uri()
    item = lsp.TextDocumentItem(uri=uri, language_id="pedsl", version=1, text=text)
    diags = await _published(client, lambda: client.text_document_did_open(lsp.DidOpenTextDocumentParams(
        text_document=item)), uri, 1)
    return uri, diags


async def _change(client: LanguageClient, uri: str, text: str, version: int) -> list[lsp.Diagnostic]:
    params = lsp.DidChangeTextDocumentParams(
        text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)])
    return await _published(client, lambda: client.text_document_did_change(params), uri, version)


def _at(text: str, sub: str, k: int = 0) -> lsp.Position:
    i = text.index(sub) + k
    return lsp.Position(text.count("\n", 0, i), i - (text.rfind("\n", 0, i) + 1))


async def test_a_file_with_an_error_gets_its_diagnostic_at_the_right_range(client, tmp_path):
    text = ('scheme r "a typo" {\n  param base: float (> 1) = 10000.0\n'
            '  qk: rotate(geometric(bsae) * position)\n}\n')
    uri, [d] = await _open(client, tmp_path / "typo.pe", text)
    assert d.code == "E201" and d.severity == lsp.DiagnosticSeverity.Error and d.source == "pedsl"
    assert d.range == lsp.Range(start=_at(text, "bsae"), end=_at(text, "bsae", 4))
    assert "unknown name 'bsae'" in d.message and "did you mean 'base'?" in d.message
    [fix] = await client.text_document_code_action_async(lsp.CodeActionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), range=d.range,
        context=lsp.CodeActionContext(diagnostics=[d])))
    assert fix.edit.changes[uri][0].new_text == "base"
    assert await _change(client, uri, text.replace("bsae", "base"), 2) == []
    [d] = await _change(client, uri, text.replace("bsae", "base").replace("}\n", ""), 3)  # half-typed
    assert d.code == "E112" and "'}' missing" in d.message


async def test_completion_after_geometric_paren(client, tmp_path):
    text = "import \"rope.pe\"\nscheme r extends rope {\n  param f: float = 2.0\n  let w = geometric("
    uri, _ = await _open(client, tmp_path / "complete.pe", text)
    end = _at(text, "geometric(", len("geometric("))
    result = await client.text_document_completion_async(lsp.CompletionParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=end))
    items = {i.label: i for i in (result.items if isinstance(result, lsp.CompletionList) else result)}
    assert items["base ="].sort_text < items["f"].sort_text  # the call's own argument first
    assert {"f", "base", "train_length", "position", "span"} <= set(items)  # own, inherited, fixed, builtins
    assert items["span"].insert_text == "span(${1:length})$0" and items["span"].detail.startswith("span(length")
    sig = await client.text_document_signature_help_async(lsp.SignatureHelpParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=end))
    assert sig.signatures[0].label == "geometric(base = 10000.0)"


async def test_hover_on_a_parameter(client):
    text = (SCHEMES / "yarn.pe").read_text()
    uri, _ = await _open(client, SCHEMES / "yarn.pe", text)
    hover = await client.text_document_hover_async(lsp.HoverParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=_at(text, "original: int", 2)))
    value = hover.contents.value
    assert "param original: int (>= 8) = train_length" in value and "- type: `int`" in value
    assert "- bounds: `>= 8`" in value and "resolves to **`128`** in `yarn`" in value
    assert hover.range == lsp.Range(start=_at(text, "original: int"), end=_at(text, "original: int", 8))


async def test_go_to_the_base_schemes_definition(client, tmp_path):
    text = 'import "rope.pe"\nscheme longer extends rope {\n  param train_length: int = 512\n}\n'
    uri, _ = await _open(client, tmp_path / "longer.pe", text)
    for where in (_at(text, "extends rope", 10), _at(text, "train_length")):
        [loc] = await client.text_document_definition_async(lsp.DefinitionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=where))
        rope = (SCHEMES / "rope.pe").read_text()
        assert loc.uri == (SCHEMES / "rope.pe").resolve().as_uri()
        assert loc.range.start in (_at(rope, 'rope "Rotary'), _at(rope, "train_length: int"))
    symbols = await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri)))
    assert [s.name for s in symbols] == ['import "rope.pe"', "longer"]


async def test_formatting_returns_pedsl_fmts_text(client, tmp_path):
    text = "scheme r {let w = geometric(10000)\n   qk: rotate(w*position)}"
    uri, _ = await _open(client, tmp_path / "fmt.pe", text)
    [edit] = await client.text_document_formatting_async(lsp.DocumentFormattingParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), options=lsp.FormattingOptions(tab_size=2,
                                                                                         insert_spaces=True)))
    assert edit.new_text == api.format_text(text)


async def test_random_incremental_edits_over_stdio_are_each_answered_within_a_second(client):
    rng = random.Random(7)
    path = SCHEMES / "rope_id.pe"
    text = path.read_text()
    uri, _ = await _open(client, path, text)
    doc = lsp.TextDocumentIdentifier(uri=uri)
    slowest = 0.0
    for version in range(2, 42):
        i = rng.randrange(len(text))
        j = min(len(text), i + rng.randrange(4))
        new = rng.choice(["(", "}", " span(", "\n", "let ", "", '"', "qk: ", "\U0001F600"])
        change = lsp.TextDocumentContentChangePartial(range=lsp.Range(start=_unit_pos(text, i), end=_unit_pos(text, j)),
                                                      text=new)
        text = text[:i] + new + text[j:]
        params = lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version), content_changes=[change])
        await _published(client, lambda: client.text_document_did_change(params), uri, version)
        pos = _unit_pos(text, i)
        for call in (client.text_document_completion_async(lsp.CompletionParams(text_document=doc, position=pos)),
                     client.text_document_hover_async(lsp.HoverParams(text_document=doc, position=pos)),
                     client.text_document_definition_async(lsp.DefinitionParams(text_document=doc, position=pos))):
            start = time.perf_counter()
            await call
            slowest = max(slowest, time.perf_counter() - start)
    assert slowest < 1.0, f"the slowest request took {slowest:.2f} s"
    # the server applied every edit as the editor did: it sees the same text
    got = await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(text_document=doc))
    session = Session()
    session.update(uri, text)
    def flat(symbols):
        return [(x.name, x.range, x.detail, flat(x.children or [])) for x in symbols]

    assert flat(got) == flat(session.symbols(uri))


def _unit_pos(text: str, offset: int) -> lsp.Position:
    return lsp.Position(*Text(text).position(offset))
