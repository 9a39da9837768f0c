"""Regenerate the text generated from pedsl's registries: the tables of docs/language.md (the
builtin functions of ``pedsl.lang.builtins.FUNCTIONS``, the error codes of ``pedsl.diagnostic_codes.CODES``)
and the builtin names and statement keywords of the editor grammar (``editors/vscode/syntaxes/pedsl.tmLanguage.json``,
the keywords from ``pedsl.lang.statements.RECORDS``).

    python -m tools.doc_tables            # rewrite both files in place (only when they change)
    python -m tools.doc_tables --check    # exit 1 when either is stale, changing nothing
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pedsl.diagnostic_codes import CODES
from pedsl.fsio import atomic_write_text
from pedsl.lang.builtins import CATEGORIES, CONSTANTS, FUNCTIONS
from pedsl.lang.statements import HIGHLIGHT, RECORDS, highlighted

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "language.md"
GRAMMAR = ROOT / "editors" / "vscode" / "syntaxes" / "pedsl.tmLanguage.json"
BEGIN, END = "<!-- builtins:begin (generated: python -m tools.doc_tables) -->", "<!-- builtins:end -->"
CODES_BEGIN = "<!-- codes:begin (generated from pedsl.diagnostic_codes.CODES: python -m tools.doc_tables) -->"
CODES_END = "<!-- codes:end -->"


def builtin_tables() -> str:
    """The builtin-function tables, one per category."""
    out = []
    for cat, title in CATEGORIES:
        out += [f"#### {title}", "", "| signature | meaning |", "|---|---|"]
        out += [f"| `{b.signature()}` | {b.doc} |" for b in FUNCTIONS.values() if b.category == cat]
        out.append("")
    return "\n".join(out)


def codes_table() -> str:
    """Every error code (warnings have their own table, with their allow names)."""
    rows = [f"| {code} | {stage} | {meaning} |" for code, (stage, meaning) in CODES.items() if code[0] == "E"]
    return "\n".join(["| code | stage | meaning |", "|---|---|---|", *rows])


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + body + end + tail


def doc_with_tables(text: str) -> str:
    """``text`` (docs/language.md) with both generated tables replaced by the current ones."""
    text = _replace_block(text, BEGIN, END, "\n\n" + builtin_tables() + "\n")
    return _replace_block(text, CODES_BEGIN, CODES_END, "\n" + codes_table() + "\n")


def grammar_with_builtins(text: str) -> str:
    """The TextMate grammar with its builtin-function and fixed-name patterns and its statement keywords from the
    registries."""
    grammar = json.loads(text)
    grammar["repository"]["builtin"]["patterns"] = [
        {"name": "support.function.builtin.pedsl", "match": "\\b(" + "|".join(FUNCTIONS) + ")\\b(?=\\s*\\()"},
        {"name": "support.constant.pedsl", "match": "\\b(" + "|".join(CONSTANTS) + ")\\b"},
    ]
    keyword = grammar["repository"]["keyword"]["patterns"]
    by_scope = {p["name"]: p for p in keyword}
    for cls, (_, scope) in HIGHLIGHT.items():  # a statement keyword is never called: `normalize(` is a builtin
        words = sorted(highlighted(cls), key=lambda w: (-len(w), w))  # qkv before qk
        by_scope[scope]["match"] = "\\b(" + "|".join(words) + ")\\b(?!\\s*\\()"
    choices = [w for r in RECORDS for w in r.choices]
    by_scope["constant.language.pedsl"]["match"] = "\\b(" + "|".join(["true", "false", *choices]) + ")\\b"
    return json.dumps(grammar, indent=2) + "\n"


GENERATED = ((lambda: DOC, doc_with_tables), (lambda: GRAMMAR, grammar_with_builtins))


def main(argv: list[str]) -> int:
    stale = 0
    for where, regenerate in GENERATED:
        path = where()
        text = path.read_text(encoding="utf-8")
        new = regenerate(text)
        if "--check" in argv:
            if new != text:
                print(f"{path} is stale: run python -m tools.doc_tables", file=sys.stderr)
                stale = 1
            continue
        if new != text:
            atomic_write_text(path, new)
        print(f"{'updated' if new != text else 'unchanged:'} {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
