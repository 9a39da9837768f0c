"""The generated tables of docs/language.md (builtins, error codes) are current, and the tool that
regenerates them and the editor grammar (``python -m tools.doc_tables``) notices a stale table and
repairs it."""

from __future__ import annotations

from tools import doc_tables as dt

from pedsl.diagnostic_codes import CODES
from pedsl.lang.builtins import CATEGORIES, FUNCTIONS


def test_generated_tables_in_the_language_reference_are_current():
    text = dt.DOC.read_text(encoding="utf-8")
    assert dt.doc_with_tables(text) == text, "regenerate with: python -m tools.doc_tables"
    assert {b.category for b in FUNCTIONS.values()} <= {c for c, _ in CATEGORIES}
    for code in (c for c in CODES if c[0] == "E"):
        assert f"| {code} |" in text


def test_check_fails_on_a_stale_table_and_regenerating_repairs_it(tmp_path, monkeypatch, capsys):
    text = dt.DOC.read_text(encoding="utf-8")
    first = next(b for b in FUNCTIONS.values() if b.category == "grid")
    row = f"| `{first.signature()}` | {first.doc} |\n"
    assert row in text
    stale = tmp_path / "language.md"
    stale.write_text(text.replace(row, ""), encoding="utf-8")
    monkeypatch.setattr(dt, "DOC", stale)
    grammar = tmp_path / "grammar.json"
    grammar.write_text(dt.GRAMMAR.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(dt, "GRAMMAR", grammar)  # never write the repository's files
    assert dt.main(["--check"]) == 1 and "language.md is stale" in capsys.readouterr().err
    assert stale.read_text(encoding="utf-8") != text  # --check never writes
    assert dt.main([]) == 0
    assert stale.read_text(encoding="utf-8") == text
    assert dt.main(["--check"]) == 0
