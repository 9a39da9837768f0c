"""A diagnostic names the file whose text it quotes: a let that a child scheme overrides is reported in the
child, even when the statement that uses it was written in the base file."""

from __future__ import annotations

import pytest

from pedsl.errors import PedslError
from pedsl.lang.api import check

BASE = 'scheme base_s "base" {\n  layout halves\n  let w = geometric(10000.0)\n  qk: rotate(w * position)\n}\n'


def _errors(path):
    try:
        diags = check(path)
    except PedslError as err:
        diags = err.diagnostics
    return [d for d in diags if d.severity == "error"]


@pytest.mark.parametrize("pad", [0, 3], ids=["same line as the base's let", "another line"])
def test_an_overridden_let_is_reported_in_the_child_file(tmp_path, pad):
    (tmp_path / "base.pe").write_text(BASE)
    child = tmp_path / "child.pe"
    child.write_text('import "base.pe"\n' + "\n" * pad + 'scheme s extends base_s {\n'
                     '  let w = llama3(500000.0, 16.0, 8192, 4.0, 1.0)\n}\n')
    (err,) = _errors(child)
    assert err.code == "E217"
    assert err.file == str(child), err.render()
    assert (err.line, err.col) == (3 + pad, 11)
    assert "llama3(500000.0" in err.render()


def test_an_error_in_the_base_statement_itself_stays_in_the_base(tmp_path):
    (tmp_path / "base.pe").write_text(BASE.replace("rotate(w * position)", "rotate(w * position / 0)"))
    child = tmp_path / "child.pe"
    child.write_text('import "base.pe"\nscheme s extends base_s {\n  let w = geometric(500000.0)\n}\n')
    errors = _errors(child)
    assert errors and all(e.file == str(tmp_path / "base.pe") for e in errors), [e.render() for e in errors]
