"""One table of diagnostic codes (pedsl.diagnostic_codes.CODES): every code used in pedsl/ is in it, every
entry is used, documented in docs/language.md, and names a real stage."""

from __future__ import annotations

import ast
import re

from compiler_helpers import ROOT
from tools.doc_tables import DOC
from pedsl import errors
from pedsl.diagnostic_codes import CODES
from pedsl.errors import PedslError
from pedsl.lang.builtins import WARNINGS

CODE = re.compile(r"[EW]\d{3}")


def _codes_in_source() -> dict[str, list[str]]:
    """Every string constant shaped like a code in pedsl/**/*.py (the CODES table itself left out)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "pedsl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.name == "errors.py":
            tree.body = [s for s in tree.body
                         if not (isinstance(s, ast.AnnAssign) and getattr(s.target, "id", "") == "CODES")]
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.fullmatch(node.value):
                found.setdefault(node.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_code_used_is_in_the_table():
    used = _codes_in_source()
    missing = {c: where for c, where in used.items() if c not in CODES}
    assert not missing, f"add these to pedsl.diagnostic_codes.CODES: {missing}"
    assert {"E209", "E500", "E900", "E950"} <= set(used)


def test_every_table_entry_is_used_and_well_formed():
    used = _codes_in_source()
    assert [c for c in CODES if c not in used] == [], "a code in the table that nothing reports"
    assert list(CODES) == sorted(CODES), "keep the table in code order"
    stages = {c.stage for c in [PedslError, *_subclasses(PedslError)]} | {"lint"}
    for code, (stage, meaning) in CODES.items():
        assert CODE.fullmatch(code) and stage in stages and meaning and "\n" not in meaning, code


def test_error_classes_default_codes_match_their_stage():
    for cls in [PedslError, *_subclasses(PedslError)]:
        assert cls.default_code in CODES, cls.__name__
        assert CODES[cls.default_code][0] == cls.stage, (cls.__name__, cls.default_code)
    assert {c for c in CODES if c[0] == "W"} == set(WARNINGS.values())


def test_every_code_is_documented():
    text = DOC.read_text(encoding="utf-8")
    for code in CODES:
        assert f"| {code} |" in text, f"{code} is not in docs/language.md: run python -m tools.doc_tables"
    assert errors.__doc__  # the module documents the diagnostics it renders
