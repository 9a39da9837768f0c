"""Shared helpers for the language front-end tests (not a test module)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ROOT / "schemes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BAD = FIXTURES / "bad"

LIBRARY = sorted(SCHEMES.glob("*.pe"))
BAD_FILES = sorted(BAD.glob("*.pe"))

_EXPECT = re.compile(r"^# expect: (?P<code>[EW]\d{3}) (?P<line>\d+):(?P<col>\d+)(?: \(hint: (?P<hint>.*)\))?\s*$", re.M)
_PARAMS = re.compile(r"^# params: (.*)$", re.M)


def expectation(path: Path) -> dict:
    """The `# expect: CODE LINE:COL (hint: ...)` header of a bad fixture, and its `# params:`."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    m = _EXPECT.search(text)
    assert m, f"{path.name} has no '# expect: CODE LINE:COL' header"
    p = _PARAMS.search(text)
    params = dict(kv.split("=", 1) for kv in p.group(1).split()) if p else None
    return {"code": m["code"], "line": int(m["line"]), "col": int(m["col"]), "hint": m["hint"], "params": params}
