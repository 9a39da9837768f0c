"""Shared helpers for the language front-end tests (not a test module)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ROOT / "schemes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
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


# ------------------------------------------------------------------ docs/language.md builtin tables

DOC = ROOT / "docs" / "language.md"
BEGIN, END = "<!-- builtins:begin (generated: python compiler_tests/lang_helpers.py) -->", "<!-- builtins:end -->"
def builtin_tables() -> str:
    """The builtin-function tables of docs/language.md, from pedsl.lang.builtins.FUNCTIONS."""
    from pedsl.lang.builtins import CATEGORIES, FUNCTIONS

    out = []
    for cat, title in CATEGORIES:
        out += [f"#### {title}", "", "| signature | meaning |", "|---|---|"]
        out += [f"| `{b.signature()}` | {b.doc} |" for b in FUNCTIONS.values() if b.category == cat]
        out.append("")
    return "\n".join(out)


CODES_BEGIN = "<!-- codes:begin (generated from pedsl.diagnostic_codes.CODES: python compiler_tests/lang_helpers.py) -->"
CODES_END = "<!-- codes:end -->"


def codes_table() -> str:
    """Every error code of pedsl.diagnostic_codes.CODES (warnings have their own table, with their allow names)."""
    from pedsl.diagnostic_codes import CODES

    rows = [f"| {code} | {stage} | {meaning} |" for code, (stage, meaning) in CODES.items() if code[0] == "E"]
    return "\n".join(["| code | stage | meaning |", "|---|---|---|", *rows])


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + body + end + tail


def doc_with_tables(text: str) -> str:
    text = _replace_block(text, BEGIN, END, "\n\n" + builtin_tables() + "\n")
    return _replace_block(text, CODES_BEGIN, CODES_END, "\n" + codes_table() + "\n")


# ------------------------------------------------------------------ the VS Code extension's TextMate grammar

GRAMMAR = ROOT / "editors" / "vscode" / "syntaxes" / "pedsl.tmLanguage.json"


def grammar_with_builtins(text: str) -> str:
    """The TextMate grammar with its builtin-function and fixed-name patterns from the registry."""
    import json

    from pedsl.lang.builtins import CONSTANTS, FUNCTIONS

    grammar = json.loads(text)
    grammar["repository"]["builtin"]["patterns"] = [
        {"name": "support.function.builtin.pedsl", "match": "\\b(" + "|".join(FUNCTIONS) + ")\\b(?=\\s*\\()"},
        {"name": "support.constant.pedsl", "match": "\\b(" + "|".join(CONSTANTS) + ")\\b"},
    ]
    return json.dumps(grammar, indent=2) + "\n"


if __name__ == "__main__":  # regenerate the tables in docs/language.md and the editor grammar's builtins
    DOC.write_text(doc_with_tables(DOC.read_text()))
    GRAMMAR.write_text(grammar_with_builtins(GRAMMAR.read_text()))
    print(f"updated {DOC} and {GRAMMAR}")
