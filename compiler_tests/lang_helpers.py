"""Shared helpers for the language front-end tests (not a test module): the library's texts, token-level
mutants, the bad fixtures and their expectations. The generated tables of docs/language.md are
``tools/doc_tables.py``'s."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ROOT / "schemes"
FIXTURES = Path(__file__).resolve().parent / "lang" / "fixtures"
BAD = FIXTURES / "bad"

LIBRARY = sorted(SCHEMES.glob("*.pe"))
BAD_FILES = sorted(BAD.glob("*.pe"))


# ------------------------------------------------------------------ token-level mutants (hypothesis)

TEXTS = {p.stem: p.read_text() for p in LIBRARY}
_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\*\*|>=|<=|!=|\"[^\"\n]*\"|#[^\n]*|.",
                    re.S)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


@st.composite
def token_mutant(draw):
    toks = tokens(TEXTS[draw(st.sampled_from(sorted(TEXTS)))])
    for _ in range(draw(st.integers(1, 3))):
        if not toks:
            break
        i = draw(st.integers(0, len(toks) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace"]))
        if op == "delete":
            del toks[i]
        elif op == "duplicate":
            toks.insert(i, toks[i])
        elif op == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        else:
            toks[i] = draw(st.sampled_from(["(", ")", "{", "}", "[", "]", ",", ";", "=", ":", "**", "-", "0",
                                            "1e999", "x", "token", "position", "rest", "none", "qk", "qkv",
                                            "scheme", "extends", "import", '"rope.pe"', "param", "let", "heads",
                                            "fraction(0.3)", "quarters(5)", "slopes(heads)", "#"]))
    return "".join(toks)


# ------------------------------------------------------------------ bad fixtures

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
