"""Regenerate the generated tables of docs/language.md: the builtin functions (from
``pedsl.lang.builtins.FUNCTIONS``) and the error codes (from ``pedsl.errors.CODES``).

    python -m tools.doc_tables            # rewrite docs/language.md in place
    python -m tools.doc_tables --check    # exit 1 when the tables are stale (what the test checks)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pedsl.errors import CODES
from pedsl.fsio import atomic_write_text
from pedsl.lang.builtins import FUNCTIONS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "language.md"
BEGIN, END = "<!-- builtins:begin (generated: python -m tools.doc_tables) -->", "<!-- builtins:end -->"
CODES_BEGIN = "<!-- codes:begin (generated from pedsl.errors.CODES: python -m tools.doc_tables) -->"
CODES_END = "<!-- codes:end -->"
CATEGORIES = [
    ("math", "Math (elementwise; broadcast by axis)"),
    ("grid", "Frequency grids (num[pair]; rot_dim = the group's channel count)"),
    ("bias", "Biases"),
    ("temperature", "Temperatures"),
    ("channels", "Channel groups (inside `channels { ... }`)"),
    ("transport", "Transports and steps"),
    ("source", "Step sources (data-dependent or learned)"),
]


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


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    new = doc_with_tables(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC} is stale: run python -m tools.doc_tables", file=sys.stderr)
            return 1
        return 0
    if new != text:
        atomic_write_text(DOC, new)
    print(f"{'updated' if new != text else 'unchanged:'} {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
