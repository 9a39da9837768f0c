"""`pedsl lsp` under hostile traffic, driven over stdio by a raw client (bytes, not a well-behaved library):
malformed frames, wrong types, requests before initialize, unopened, missing, special and huge files,
names the OS refuses, lone surrogates, a thousand rapid edits. Every request is answered within 5 s with
a result or a proper error code (never -32603), stderr carries no traceback, memory stays under 500 MB,
and the server shuts down and exits cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSWER_S = 5.0
STARTUP_S = 60.0  # the first answer waits for Python to start and import pedsl
RSS_LIMIT_MB = 500
SERVER_NOT_INITIALIZED, INVALID_REQUEST, INVALID_PARAMS, PARSE_ERROR = -32002, -32600, -32602, -32700
METHOD_NOT_FOUND, REQUEST_FAILED, INTERNAL_ERROR = -32601, -32803, -32603
TEXT = 'import "rope.pe"\nscheme r extends rope {\n  param f: float = 2.0\n  let w = geometric(base)\n}\n'


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Wire:
    """A `pedsl lsp --stdio` process and a raw JSON-RPC client: what it sent, what came back and when."""

    def __init__(self, cwd: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "pedsl", "lsp", "--stdio"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.answers: dict[object, tuple[dict, float]] = {}  # the first answer to each id
        self.responses: list[dict] = []  # every response, in order (several may have the id null)
        self.notes: list[dict] = []
        self.sent: dict[object, float] = {}
        self.stderr = b""
        self.cond = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if not line.strip():
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            msg = json.loads(out.read(length))
            with self.cond:
                if "method" in msg:
                    self.notes.append(msg)
                else:
                    self.responses.append(msg)
                    self.answers.setdefault(msg.get("id"), (msg, time.monotonic()))
                self.cond.notify_all()

    def _drain(self) -> None:
        for chunk in iter(lambda: os.read(self.proc.stderr.fileno(), 4096), b""):  # as it comes, not 4 KB at once
            self.stderr += chunk

    def raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict) -> None:
        self.raw(frame(json.dumps({"jsonrpc": "2.0", **message}).encode()))

    def request(self, method: str, params=None, **extra) -> int:
        self.next_id += 1
        self.sent[self.next_id] = time.monotonic()
        self.send({"id": self.next_id, "method": method, "params": params, **extra})
        return self.next_id

    def answer(self, msg_id, timeout: float = ANSWER_S) -> dict:
        """The response to ``msg_id``, which must come within ``timeout`` seconds of the request."""
        start = self.sent.get(msg_id, time.monotonic())
        with self.cond:
            self.cond.wait_for(lambda: msg_id in self.answers, timeout=max(0.0, start + timeout - time.monotonic()))
            assert msg_id in self.answers, f"no answer to request {msg_id} within {timeout} s"
            return self.answers[msg_id][0]

    def call(self, method: str, params=None) -> dict:
        return self.answer(self.request(method, params))

    def note(self, pred, timeout: float = ANSWER_S) -> dict:
        with self.cond:
            self.cond.wait_for(lambda: any(pred(n) for n in self.notes), timeout=timeout)
            found = [n for n in self.notes if pred(n)]
        assert found, "no such notification"
        return found[-1]

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) / 1024

    def initialize(self, root: Path) -> None:
        """The first request; its answer may take the process's start-up too (imports on a loaded machine)."""
        got = self.answer(self.request("initialize", {"processId": None, "rootUri": root.as_uri(),
                                                      "capabilities": {}}), STARTUP_S)
        assert "capabilities" in got["result"], got
        self.send({"method": "initialized", "params": {}})

    def close(self) -> int:
        """Shut down and exit as an editor does; the exit code."""
        assert self.call("shutdown")["result"] is None
        self.send({"method": "exit"})
        return self.proc.wait(timeout=ANSWER_S)  # its input still open: the server ends on its own

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def error_code(msg: dict) -> int | None:
    return msg.get("error", {}).get("code")


def doc(uri: str, line: int = 0, character: int = 0) -> dict:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wire")
    w = Wire(tmp)
    w.tmp = tmp
    w.initialize(tmp)
    yield w
    w.kill()


# ------------------------------------------------------------------ the reproducers, one each


def test_a_request_before_initialize_is_refused_with_server_not_initialized(tmp_path):
    w = Wire(tmp_path)
    try:
        first = w.request("textDocument/hover", doc((tmp_path / "a.pe").as_uri()))
        assert error_code(w.answer(first, STARTUP_S)) == SERVER_NOT_INITIALIZED
        w.initialize(tmp_path)
        assert error_code(w.call("initialize", {"processId": None, "capabilities": {}})) == INVALID_REQUEST
        assert w.close() == 0 and b"Traceback" not in w.stderr
    finally:
        w.kill()


def test_a_huge_content_length_is_skipped_without_reading_it_whole(tmp_path):
    w = Wire(tmp_path)
    try:
        w.initialize(tmp_path)
        w.raw(b"Content-Length: 100000000000\r\n\r\n" + b"x" * (8 << 20))  # 8 MB of the 100 GB it announces
        shown = w.note(lambda n: n["method"] == "window/showMessage" and "100000000000" in n["params"]["message"])
        assert "over the limit" in shown["params"]["message"]
        time.sleep(0.5)
        assert w.proc.poll() is None and w.peak_rss_mb() < RSS_LIMIT_MB
        w.proc.stdin.close()  # the client goes away in the middle of the body
        assert w.proc.wait(timeout=ANSWER_S) == 0 and b"Traceback" not in w.stderr, w.stderr.decode()
    finally:
        w.kill()


def test_an_unopened_file_is_read_as_pedsl_check_reads_it(wire):
    small = wire.tmp / "small.pe"
    small.write_text(TEXT)
    got = wire.call("textDocument/hover", doc(small.as_uri(), 3, 12))
    assert "geometric(base" in got["result"]["contents"]["value"]
    big = wire.tmp / "big.pe"
    big.write_text("# " + "x" * 2_000_000 + "\n")
    got = wire.call("textDocument/hover", doc(big.as_uri()))
    assert error_code(got) == REQUEST_FAILED and "file too large" in got["error"]["message"]


def test_malformed_json_and_wrong_params_are_answered_not_dropped(wire):
    wire.raw(frame(b"this is not json"))
    assert error_code(wire.answer(None)) == PARSE_ERROR
    got = wire.call("textDocument/hover", {"textDocument": {"uri": "file:///x.pe"}, "position": {"line": "x"}})
    assert error_code(got) == INVALID_PARAMS and "position" in got["error"]["message"]
    assert error_code(wire.call("pedsl/noSuchMethod", {})) == METHOD_NOT_FOUND


def test_a_file_name_over_255_bytes_is_a_document_like_any_other(wire):
    uri = (wire.tmp / ("n" * 300 + ".pe")).as_uri()
    assert error_code(wire.call("textDocument/hover", doc(uri))) == REQUEST_FAILED  # not open: no such file
    wire.send({"method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "pedsl", "version": 1, "text": TEXT.replace("base)", "bsae)")}}})
    diags = wire.note(lambda n: n["method"] == "textDocument/publishDiagnostics" and n["params"]["uri"] == uri)
    assert [d["code"] for d in diags["params"]["diagnostics"]] == ["E201"]
    assert "geometric(base" in wire.call("textDocument/hover", doc(uri, 3, 12))["result"]["contents"]["value"]


def test_lone_surrogates_in_a_uri_and_in_the_text(wire):
    for uri, text in [("file:///tmp/\ud800x.pe", TEXT), ((wire.tmp / "s.pe").as_uri(), TEXT + "# \udc80 \ud83d\n")]:
        wire.send({"method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "pedsl", "version": 1, "text": text}}})
        wire.note(lambda n: n["method"] == "textDocument/publishDiagnostics" and n["params"]["uri"] == uri)
        for method in ("textDocument/hover", "textDocument/completion", "textDocument/definition",
                       "textDocument/documentSymbol", "textDocument/formatting"):
            params = doc(uri, 3, 12) if "Symbol" not in method and "formatting" not in method else \
                {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}}
            got = wire.call(method, params)
            assert "error" not in got, (method, got)
    assert not [n for n in wire.notes if n["method"] == "window/logMessage" and n["params"]["type"] == 1]


def test_import_completion_over_a_symlink_loop(wire):
    folder = wire.tmp / "loops"
    folder.mkdir(exist_ok=True)
    for a, b in (("a", "b"), ("b", "a")):
        if not os.path.lexists(folder / a):
            os.symlink(folder / b, folder / a)
    uri = (folder / "r.pe").as_uri()
    wire.send({"method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "pedsl", "version": 1, "text": 'import "'}}})
    got = wire.call("textDocument/completion", doc(uri, 0, 8))
    labels = {i["label"] for i in got["result"]["items"]}
    assert "rope.pe" in labels and not {"a/", "b/"} & labels
    assert not [n for n in wire.notes if n["method"] == "window/logMessage" and n["params"]["type"] == 1]


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/urandom", "missing", "folder"])
def test_a_request_on_an_unreadable_unopened_file_fails_with_request_failed(wire, special):
    if special == "fifo":
        path = wire.tmp / "pipe.pe"
        if not path.exists():
            os.mkfifo(path)
    else:
        path = {"missing": wire.tmp / "nowhere" / "x.pe", "folder": wire.tmp}.get(special, Path(special))
    for method in ("textDocument/hover", "textDocument/definition", "textDocument/completion"):
        got = wire.call(method, doc(path.as_uri()))
        assert error_code(got) == REQUEST_FAILED, got
    assert wire.peak_rss_mb() < RSS_LIMIT_MB


def test_no_traceback_reached_stderr(wire):
    assert b"Traceback" not in wire.stderr, wire.stderr.decode(errors="replace")


# ------------------------------------------------------------------ everything at once


def _malformed(w: Wire) -> None:
    """Frames and messages no server should trust: each answered with its error or reported, never fatal."""
    w.raw(b"Garbage-Header: 1\r\n\r\n")  # no Content-Length: reported, skipped
    w.raw(b"Content-Length: abc\r\n\r\n")
    w.raw(frame(b"{not json"))
    w.raw(frame(b"[" * 100_000 + b"]" * 100_000))  # nesting deep enough to break a recursive parser
    w.raw(frame(b"[1, 2]"))  # a batch: not part of LSP
    w.raw(frame(b'{"jsonrpc": "2.0", "id": [1], "method": "textDocument/hover"}'))
    w.raw(frame(b"\xff\xfe\x00garbage"))
    w.raw(frame(b'{"jsonrpc": "2.0", "id": 9001, "method": 5}'))
    w.send({"method": "textDocument/didOpen", "params": {"textDocument": "not an object"}})
    w.send({"method": "$/unknownNotification", "params": {}})
    oversize = (32 << 20) + 1
    w.raw(b"Content-Length: %d\r\n\r\n" % oversize + b" " * oversize)  # skipped whole, the next frame lines up
    for params in ({"textDocument": {"uri": 5}, "position": {"line": -1, "character": 0}},
                   {"textDocument": None}, [1, 2, 3], "text", None):
        assert error_code(w.call("textDocument/hover", params)) == INVALID_PARAMS
    assert error_code(w.call("no/suchMethod", {})) == METHOD_NOT_FOUND


def _special_files(w: Wire, tmp: Path) -> None:
    os.mkfifo(tmp / "fifo.pe")
    (tmp / "dir.pe").mkdir()
    for target in (tmp / "fifo.pe", Path("/dev/zero"), Path("/dev/urandom"), tmp / "dir.pe", tmp / "gone.pe",
                   tmp / ("y" * 300 + ".pe")):
        for method in ("textDocument/hover", "textDocument/definition", "textDocument/completion",
                       "textDocument/documentSymbol"):
            assert error_code(w.call(method, doc(target.as_uri()))) == REQUEST_FAILED


def _open(w: Wire, uri: str, text: str, version: int = 1) -> None:
    w.send({"method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "pedsl", "version": version, "text": text}}})


def _published(w: Wire, uri: str, version: int, timeout: float = ANSWER_S) -> list[dict]:
    got = w.note(lambda n: n["method"] == "textDocument/publishDiagnostics" and n["params"]["uri"] == uri
                 and n["params"].get("version") == version, timeout)
    return got["params"]["diagnostics"]


def _huge_document(w: Wire, tmp: Path) -> None:
    uri = (tmp / "huge.pe").as_uri()
    line = "scheme s { let w = geometric(10000) * position }  # " + "x" * 40 + "\n"
    _open(w, uri, line * (24_000_000 // len(line)))  # 24 MB
    [d] = _published(w, uri, 1)
    assert d["code"] == "E102" and "file too large" in d["message"]
    for method in ("textDocument/hover", "textDocument/completion", "textDocument/definition"):
        assert "error" not in w.call(method, doc(uri, 100, 5))


def _rapid_edits(w: Wire, tmp: Path) -> None:
    uri = (tmp / "edits.pe").as_uri()
    _open(w, uri, TEXT)
    text = TEXT
    for version in range(2, 1002):  # type a comment at the end, a character at a time, then a typo
        line = text.count("\n")
        new = "#" if version == 2 else "x"
        col = len(text) - text.rfind("\n") - 1
        w.send({"method": "textDocument/didChange", "params": {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": {"line": line, "character": col},
                                          "end": {"line": line, "character": col}}, "text": new}]}})
        text += new
    w.send({"method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 1002},
                                                           "contentChanges": [{"text": text.replace("base)", "bsae)")}]}})
    got = w.call("textDocument/hover", doc(uri, 3, 12))
    assert "geometric(base" in got["result"]["contents"]["value"]
    assert [d["code"] for d in _published(w, uri, 1002)] == ["E201"]


def test_the_server_survives_hostile_traffic(tmp_path):
    start = time.monotonic()
    w = Wire(tmp_path)
    try:
        first = w.request("textDocument/hover", doc((tmp_path / "a.pe").as_uri()))
        assert error_code(w.answer(first, STARTUP_S)) == SERVER_NOT_INITIALIZED
        assert error_code(w.call("shutdown")) == SERVER_NOT_INITIALIZED
        w.initialize(tmp_path)
        _malformed(w)
        _special_files(w, tmp_path)
        _huge_document(w, tmp_path)
        _rapid_edits(w, tmp_path)
        peak = w.peak_rss_mb()
        assert w.call("shutdown")["result"] is None
        assert error_code(w.call("textDocument/hover", doc((tmp_path / "edits.pe").as_uri()))) == INVALID_REQUEST
        w.send({"method": "exit"})
        assert w.proc.wait(timeout=ANSWER_S) == 0  # its input still open: the server ends on its own
        for msg_id in w.sent:
            w.answer(msg_id, STARTUP_S)  # every request was answered, each within ANSWER_S of being sent
            assert w.answers[msg_id][1] - w.sent[msg_id] < (STARTUP_S if msg_id == first else ANSWER_S)
        codes = [error_code(m) for m in w.responses]
        assert INTERNAL_ERROR not in codes
        assert codes.count(PARSE_ERROR) == 3 and codes.count(INVALID_REQUEST) == 4  # 3 malformed, 1 after shutdown
        assert b"Traceback" not in w.stderr and b"Fatal" not in w.stderr, w.stderr.decode(errors="replace")
        assert peak < RSS_LIMIT_MB, f"peak RSS {peak:.0f} MB"
        errors = [n["params"]["message"] for n in w.notes if n["method"] == "window/logMessage"
                  and n["params"]["type"] == 1 and "failed" in n["params"]["message"]]
        assert not errors, errors[:3]  # no request failed inside pedsl
    finally:
        w.kill()
    assert time.monotonic() - start < 60
