"""The wire under ``pedsl lsp``: JSON-RPC frames read from standard input with bounded memory, and each
message decoded and checked before pygls dispatches it.

pygls's own loop trusts its input: a ``Content-Length`` of 100 GB is read whole (the process dies), a body
that is not JSON or whose params have the wrong types is logged with a traceback and never answered.
Here a frame is read by :func:`read_frame` (header lines and body each capped; an oversized body is
skipped in chunks, so the frames after it still line up), a body is parsed by :mod:`pedsl.strictparse`
(bounded nesting, no duplicate keys) and structured by :func:`decode`, and anything malformed becomes a
:class:`Problem`: an error response when the message is a request (its id known), a log line otherwise.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

from cattrs import transform_error
from lsprotocol import types as lsp

from pedsl.errors import clip
from pedsl.limits import gib
from pedsl.strictparse import StrictParseError, load_json

# One message's body. A document over the checked size (1 MB) is not analysed anyway; this bounds the
# memory one message can take (its bytes, the decoded text at up to 4 bytes a character, its objects).
MAX_MESSAGE = 32 << 20
MAX_CONTAINERS = 1_000_000  # JSON objects and arrays in one message: ~100 bytes of memory each
MAX_HEADER_LINE = 8192
MAX_HEADER_LINES = 32
_CHUNK = 1 << 20
_LENGTH = re.compile(rb"content-length:[ \t]*(\d{1,30})[ \t]*", re.IGNORECASE)

# JSON-RPC and LSP error codes used here and by the server
PARSE_ERROR = lsp.ErrorCodes.ParseError.value  # -32700
INVALID_REQUEST = lsp.ErrorCodes.InvalidRequest.value  # -32600
INVALID_PARAMS = lsp.ErrorCodes.InvalidParams.value  # -32602
SERVER_NOT_INITIALIZED = lsp.ErrorCodes.ServerNotInitialized.value  # -32002
REQUEST_FAILED = lsp.LSPErrorCodes.RequestFailed.value  # -32803


@dataclass
class Frame:
    """One frame off the wire: its body, or what was wrong with it (``problem``), or the end (``end``)."""

    body: bytes | None = None
    problem: str | None = None
    end: bool = False
    skip: int = 0  # bytes of an oversized body, dropped after the problem is reported


@dataclass
class Problem(Exception):
    """A message that cannot be dispatched: answered with ``code`` when it is a request (``msg_id`` known),
    else only reported."""

    code: int
    message: str
    msg_id: int | str | None = None
    is_request: bool = False


def _skip(stream: BinaryIO, n: int) -> bool:
    """Read and drop ``n`` bytes in chunks; False when the input ends first."""
    while n > 0:
        got = stream.read(min(n, _CHUNK))
        if not got:
            return False
        n -= len(got)
    return True


def _header_line(stream: BinaryIO) -> tuple[bytes | None, bool]:
    """One header line (None at the end of input) and whether it was cut (over MAX_HEADER_LINE bytes:
    the rest of it is read and dropped)."""
    line = stream.readline(MAX_HEADER_LINE)
    if not line:
        return None, False
    if line.endswith(b"\n") or len(line) < MAX_HEADER_LINE:
        return line, False
    while True:  # drop the rest of an over-long line, a bounded read at a time
        rest = stream.readline(MAX_HEADER_LINE)
        if not rest or rest.endswith(b"\n"):
            return line, True


def read_frame(stream: BinaryIO) -> Frame:
    """The next frame: header lines up to an empty line, then ``Content-Length`` bytes of body."""
    length: int | None = None
    problems: list[str] = []
    lines = 0
    while True:
        line, cut = _header_line(stream)
        if line is None:
            return Frame(end=True)
        lines += 1
        if cut:
            problems.append(f"a header line over {MAX_HEADER_LINE} bytes")
        elif not line.strip():
            if lines == 1:
                continue  # a stray empty line between frames
            break
        elif (m := _LENGTH.fullmatch(line.strip())) is not None:
            length = int(m[1])
        elif not line.lower().startswith(b"content-type:"):
            problems.append(f"an unknown header line {clip(repr(line[:200]), 80)}")
        if lines > MAX_HEADER_LINES:
            problems.append(f"more than {MAX_HEADER_LINES} header lines")
            break
    if length is None:
        return Frame(problem="; ".join(problems + ["a message without a valid Content-Length header: skipped"]))
    if length > MAX_MESSAGE:
        return Frame(problem=f"a message of {gib(length)} (Content-Length: {length}) is over the limit of "
                             f"{MAX_MESSAGE} bytes ({gib(MAX_MESSAGE)}): skipped (a document that large is not "
                             f"checked)", skip=length)
    body = stream.read(length)
    if len(body) < length:
        return Frame(end=True)
    return Frame(body=body)


def frames(stream: BinaryIO) -> Iterator[Frame]:
    """Every frame of ``stream`` up to and including its end (an oversized body is skipped after its
    frame is yielded, so the problem is reported before the bytes arrive)."""
    while True:
        try:
            frame = read_frame(stream)
            yield frame
            if frame.end:
                return
            if frame.skip and not _skip(stream, frame.skip):
                yield Frame(end=True)
                return
        except (OSError, ValueError):  # the input closed under the reader
            yield Frame(end=True)
            return


def _valid_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def parse(body: bytes) -> dict:
    """The JSON object of a body, or a :class:`Problem` saying why it is not a JSON-RPC message."""
    if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:
        raise Problem(PARSE_ERROR, f"a message with over {MAX_CONTAINERS:,} JSON objects and arrays: refused")
    try:
        data = load_json(body)
    except StrictParseError as exc:
        raise Problem(PARSE_ERROR, f"a message that is not JSON: {clip(str(exc), 200)}") from None
    except ValueError:  # bytes that are not UTF-8 (or UTF-16/32) text
        raise Problem(PARSE_ERROR, "a message that is not JSON: its bytes are not UTF-8 text") from None
    if not isinstance(data, dict):
        raise Problem(INVALID_REQUEST, "a JSON-RPC message is an object (batches are not part of LSP)")
    msg_id = data.get("id") if _valid_id(data.get("id")) else None
    is_request = "method" in data and "id" in data
    if data.get("jsonrpc") != "2.0":
        raise Problem(INVALID_REQUEST, 'not a JSON-RPC 2.0 message ("jsonrpc": "2.0" missing)', msg_id, is_request)
    if "method" in data and not isinstance(data["method"], str):
        raise Problem(INVALID_REQUEST, "the method is not a string", msg_id, is_request)
    if "id" in data and not _valid_id(data["id"]):
        raise Problem(INVALID_REQUEST, "the id is neither a number nor a string", None, is_request)
    return data


def decode(data: dict, message_type: Callable[[str], type | None], result_type: Callable[[Any], type | None],
           structure: Callable[[Any, type], Any]) -> Any:
    """The message as lsprotocol's class for its method (a generic record for methods it does not know);
    a :class:`Problem` (InvalidParams) for params of the wrong shape."""
    from lsprotocol.types import ResponseErrorMessage
    from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage

    msg_id, method = data.get("id"), data.get("method")
    if method is None and msg_id is None:
        raise Problem(INVALID_REQUEST, "a message with neither a method nor an id")
    if method is not None:
        kind = message_type(method) or (JsonRPCRequestMessage if msg_id is not None else JsonRPCNotification)
    else:
        kind = ResponseErrorMessage if "error" in data else (result_type(msg_id) or JsonRPCResponseMessage)
    if kind in (JsonRPCRequestMessage, JsonRPCNotification):
        data = {**data, "params": data.get("params")}
    try:
        return structure(data, kind)
    except Exception as exc:  # noqa: BLE001 - cattrs reports a wrong shape with several exception types
        try:
            why = "; ".join(transform_error(exc))
        except Exception:  # noqa: BLE001 - not a cattrs validation error
            why = f"{type(exc).__name__}: {exc}"
        raise Problem(INVALID_PARAMS, f"invalid params for {method or 'a response'}: {clip(why, 300)}",
                      msg_id, method is not None and msg_id is not None) from None


async def serve(stream: BinaryIO, receive: Callable[[Frame], None], stop: threading.Event) -> None:
    """Hand each frame of ``stream`` to ``receive`` until the input ends or ``stop`` is set.

    Frames are read by a daemon thread (a blocked read never holds the process at exit), one frame ahead
    of the handlers at most, so a client that writes faster than the server answers cannot fill memory."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Frame] = asyncio.Queue(maxsize=1)

    def reader() -> None:
        for frame in frames(stream):
            put = queue.put(frame)
            try:
                asyncio.run_coroutine_threadsafe(put, loop).result()
            except Exception:  # noqa: BLE001 - the loop has closed: the server is exiting
                put.close()
                return

    threading.Thread(target=reader, name="pedsl-lsp-reader", daemon=True).start()
    while not stop.is_set():
        frame = await queue.get()
        if frame.end:
            return
        receive(frame)
