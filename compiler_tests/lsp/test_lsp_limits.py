"""The language server's reading rules in-process: the wire's frames (bounded headers and bodies, an
oversized body skipped), malformed messages classified, and the session's documents - unopened files read
as `pedsl check` reads them, documents over the size limit not held, names the OS refuses, symlink loops
and lone surrogates - each answered without a failure inside pedsl."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from lsprotocol import types as lsp

from pedsl.lang import api
from pedsl.lang.parser import MAX_BYTES
from pedsl.lsp import transport
from pedsl.lsp.session import REQUEST_FAILED, Refused, Session
from pedsl.lsp.transport import Frame, Problem

TEXT = 'import "rope.pe"\nscheme r extends rope {\n  param f: float = 2.0\n  let w = geometric(base)\n}\n'


def _frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class _Counting(io.BytesIO):
    """A stream that records the largest single read asked of it."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.largest = 0

    def read(self, n=-1):
        self.largest = max(self.largest, n if n is not None and n >= 0 else len(self.getvalue()))
        return super().read(n)


# ------------------------------------------------------------------ the wire


def test_a_huge_content_length_is_skipped_in_chunks_and_the_next_frame_lines_up():
    body = b'{"jsonrpc": "2.0", "method": "initialized", "params": {}}'
    skipped = transport.MAX_MESSAGE + 10
    stream = _Counting(b"Content-Length: %d\r\n\r\n" % skipped + b" " * skipped + _frame(body))
    frames = list(transport.frames(stream))
    assert "over the limit" in frames[0].problem and frames[1].body == body and frames[2].end
    assert stream.largest <= 1 << 20  # never one read of the whole announced length


def test_a_content_length_of_100_gb_ends_with_the_input_not_with_memory():
    stream = _Counting(b"Content-Length: 100000000000\r\n\r\n" + b"x" * 1000)
    frames = list(transport.frames(stream))
    assert "100000000000" in frames[0].problem and frames[-1].end and len(frames) == 2
    assert stream.largest <= 1 << 20


@pytest.mark.parametrize("head", [b"X" * 20000 + b"\r\n\r\n", b"Content-Length: x\r\n\r\n", b"Hello\r\n\r\n",
                                  b"Content-Length: " + b"9" * 40 + b"\r\n\r\n"])
def test_bad_headers_are_reported_and_reading_goes_on(head):
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}'
    frames = list(transport.frames(io.BytesIO(head + _frame(body))))
    assert frames[0].problem and frames[0].body is None
    assert frames[1].body == body and frames[2].end


@pytest.mark.parametrize("body, code, msg_id", [
    (b"not json", transport.PARSE_ERROR, None),
    (b"[" * 50000 + b"]" * 50000, transport.PARSE_ERROR, None),
    (b"\xff\xfe\x00x", transport.PARSE_ERROR, None),
    (b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "x"}', transport.PARSE_ERROR, None),  # duplicate key
    (b"[1]", transport.INVALID_REQUEST, None),
    (b'{"id": 3, "method": "shutdown"}', transport.INVALID_REQUEST, 3),
    (b'{"jsonrpc": "2.0", "id": true, "method": "shutdown"}', transport.INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "id": 4, "method": 5}', transport.INVALID_REQUEST, 4),
    (b"{" * 10 + b"}" * 10 + b"{}" * transport.MAX_CONTAINERS, transport.PARSE_ERROR, None),
])
def test_malformed_messages_are_classified_with_their_json_rpc_code(body, code, msg_id):
    with pytest.raises(Problem) as got:
        transport.parse(body)
    assert (got.value.code, got.value.msg_id) == (code, msg_id)


def test_params_of_the_wrong_shape_are_invalid_params_naming_the_field():
    from pygls.lsp.server import LanguageServer

    proto = LanguageServer("t", "0").protocol
    data = {"jsonrpc": "2.0", "id": 7, "method": "textDocument/hover",
            "params": {"textDocument": {"uri": "file:///a.pe"}, "position": {"line": "x", "character": 0}}}
    with pytest.raises(Problem) as got:
        transport.decode(data, proto.get_message_type, lambda i: None, proto._converter.structure)
    assert got.value.code == transport.INVALID_PARAMS and got.value.msg_id == 7 and got.value.is_request
    assert "position.line" in got.value.message
    unknown = transport.decode({"jsonrpc": "2.0", "id": 8, "method": "x/y"}, proto.get_message_type,
                               lambda i: None, proto._converter.structure)
    assert unknown.method == "x/y" and unknown.params is None  # answered MethodNotFound by pygls


# ------------------------------------------------------------------ the session's documents


@pytest.mark.parametrize("what", ["missing", "folder", "fifo", "/dev/zero", "/dev/urandom", "long name", "big"])
def test_an_unopened_document_is_read_as_pedsl_check_reads_it_or_refused(tmp_path, what):
    path = {"missing": tmp_path / "gone.pe", "folder": tmp_path, "fifo": tmp_path / "pipe.pe",
            "long name": tmp_path / ("n" * 300 + ".pe"), "big": tmp_path / "big.pe"}.get(what, Path(what))
    if what == "fifo":
        os.mkfifo(path)
    if what == "big":
        path.write_text("#" * (MAX_BYTES + 1))
    s = Session()
    start = time.monotonic()
    for request in (lambda u: s.hover(u, lsp.Position(0, 0)), lambda u: s.completion(u, lsp.Position(0, 0)),
                    lambda u: s.definition(u, lsp.Position(0, 0)), s.symbols, s.diagnostics):
        with pytest.raises(Refused) as got:
            request(path.as_uri())
        assert got.value.code == REQUEST_FAILED
    assert time.monotonic() - start < 5 and not s.failures


def test_an_unopened_regular_file_is_answered_from_the_disk(tmp_path):
    (tmp_path / "r.pe").write_text(TEXT)
    s = Session()
    hover = s.hover((tmp_path / "r.pe").as_uri(), lsp.Position(3, 12))
    assert "geometric(base" in hover.contents.value and not s.texts


def test_a_document_over_the_size_limit_is_not_held_and_says_so(tmp_path):
    said = []
    s = Session(report=lambda message, level: said.append((level, message)))
    uri = (tmp_path / "big.pe").as_uri()
    start = time.thread_time()
    s.update(uri, "scheme s { let w = geometric(10000) * position }\n" * 100_000)  # 4.9 MB
    [d] = s.diagnostics(uri)
    assert d.code == "E102" and "file too large (4.9 MB; the limit is 1 MB)" in d.message
    assert s.hover(uri, lsp.Position(10, 5)) is None and s.completion(uri, lsp.Position(10, 5)) == []
    assert time.thread_time() - start < 2 and uri not in s.texts and not s.failures
    assert said == [("warning", f"pedsl: {uri} is not checked: file too large (4.9 MB; the limit is 1 MB)")]
    assert not s.edit(uri, lsp.Position(0, 0), lsp.Position(0, 0), "x")  # not held: an edit cannot apply
    s.update(uri, TEXT)  # the whole text again, under the limit
    assert s.diagnostics(uri) == [] and s.texts[uri] == TEXT


def test_a_document_of_too_many_tokens_is_held_but_not_scanned():
    """Under the byte limit but over check's token limit (E102 'file too long'): answered at once, edits apply."""
    s = Session()
    uri = "file:///tmp/dense.pe"
    s.update(uri, ("scheme s { let w = geometric(10000) * position }\n" * 20000)[:MAX_BYTES - 1000])
    start = time.thread_time()
    [d] = s.diagnostics(uri)
    assert d.code == "E102" and "file too long" in d.message
    assert s.hover(uri, lsp.Position(500, 25)) is None and s.completion(uri, lsp.Position(500, 25)) == []
    assert s.edit(uri, lsp.Position(0, 0), lsp.Position(0, 0), "# ") and s.texts[uri].startswith("# scheme")
    assert s.symbols(uri) == [] and time.thread_time() - start < 1 and not s.failures


def test_incremental_edits_apply_in_the_clients_units():
    s = Session()
    uri = "file:///tmp/e.pe"
    s.update(uri, "a\U0001F600b\ncd\n")
    assert s.edit(uri, lsp.Position(0, 3), lsp.Position(1, 1), "X")  # the emoji is two UTF-16 units
    assert s.texts[uri] == "a\U0001F600Xd\n"


def test_a_file_name_over_255_bytes(tmp_path):
    s = Session()
    uri = (tmp_path / ("n" * 300 + ".pe")).as_uri()
    s.update(uri, TEXT.replace("base)", "bsae)"))
    assert [d.code for d in s.diagnostics(uri)] == ["E201"]
    assert "geometric(base" in s.hover(uri, lsp.Position(3, 12)).contents.value and not s.failures
    assert api.check(api.load_text(TEXT, str(tmp_path / ("n" * 300 + ".pe")))) == []


def test_an_import_of_a_name_over_255_bytes_is_no_such_file(tmp_path):
    s = Session()
    uri = (tmp_path / "r.pe").as_uri()
    s.update(uri, f'import "{"m" * 300}.pe"\nscheme r {{}}\n')
    [d] = s.diagnostics(uri)
    assert d.code == "E209" and "no such file" in d.message and not s.failures


def test_import_completion_over_a_symlink_loop(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    (tmp_path / "ok.pe").write_text("scheme ok {}\n")
    s = Session()
    uri = (tmp_path / "r.pe").as_uri()
    s.update(uri, 'import "')
    labels = {i.label for i in s.completion(uri, lsp.Position(0, 8))}
    assert "ok.pe" in labels and not {"a/", "b/"} & labels and not s.failures
    s.update(uri, 'import "a/')
    assert s.completion(uri, lsp.Position(0, 10)) == [] and not s.failures


def test_lone_surrogates_in_the_text_are_a_positioned_e101(tmp_path):
    s = Session()
    uri = (tmp_path / "s.pe").as_uri()
    s.update(uri, TEXT + "# \udc80\n")
    [d] = s.diagnostics(uri)
    assert d.code == "E101" and d.range.start == lsp.Position(5, 2) and "surrogate" in d.message
    assert "geometric(base" in s.hover(uri, lsp.Position(3, 12)).contents.value
    assert s.formatting(uri) is None and not s.failures


def test_a_uri_with_a_lone_surrogate_or_a_nul_is_an_unsaved_buffer():
    s = Session()
    for uri in ("file:///tmp/\ud800.pe", "file:///tmp/a%00b.pe"):
        s.update(uri, TEXT)
        assert s.diagnostics(uri) == [] and s.symbols(uri)
        s.close(uri)
        with pytest.raises(Refused):
            s.hover(uri, lsp.Position(0, 0))
    assert not s.failures


def test_the_open_documents_together_are_bounded(tmp_path, monkeypatch):
    from pedsl.lsp import session

    monkeypatch.setattr(session, "MAX_OPEN_TEXT", 3 * len(TEXT))
    s = Session()
    uris = [(tmp_path / f"d{i}.pe").as_uri() for i in range(4)]
    for uri in uris:
        s.update(uri, TEXT)
    assert list(s.texts) == uris[:3] and "the open documents hold" in s.diagnostics(uris[3])[0].message
    s.close(uris[0])
    s.update(uris[3], TEXT)
    assert uris[3] in s.texts and s.diagnostics(uris[3]) == []


def test_the_frame_reader_never_blocks_the_process_at_exit():
    """The reader is a daemon thread: a client that never closes its pipe cannot hold the exit."""
    import asyncio
    import threading

    r, w = os.pipe()
    stream = os.fdopen(r, "rb")
    stop = threading.Event()
    got: list[Frame] = []

    async def run():
        task = asyncio.ensure_future(transport.serve(stream, got.append, stop))
        os.write(w, _frame(b"{}"))
        await asyncio.sleep(0.3)
        task.cancel()

    asyncio.run(run())
    assert got and got[0].body == b"{}"
    assert all(t.daemon for t in threading.enumerate() if t.name == "pedsl-lsp-reader")
    os.close(w)
