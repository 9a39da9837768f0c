"""`softcap = c` (Gemma 2's logit soft-capping): parsed, checked with positioned diagnostics, inherited
and dropped, formatted, refused where it has no lowering, and shown by show / diff (docs/language.md
§3, docs/semantics.md §11)."""

from __future__ import annotations

import pytest

from compiler_helpers import SCHEMES, first_error, run_cli
from pedsl.lang.api import format_text, load

ROPE = f'import "{SCHEMES / "rope.pe"}"\n'


def _scheme(body: str, name: str = "s", base: str = "rope") -> str:
    return ROPE + f"scheme {name} extends {base} {{\n{body}\n}}\n"


def test_the_cap_resolves_from_literals_params_and_arithmetic():
    assert load(_scheme("softcap = 50")).softcap == 50.0
    s = load(_scheme("param cap: float (> 0) = 30.0\nsoftcap = cap / 2"))
    assert s.softcap == 15.0 and load(_scheme("param cap: float (> 0) = 30.0\nsoftcap = cap"),
                                      params={"cap": "7.5"}).softcap == 7.5
    assert load(ROPE + "scheme s extends rope { }").softcap is None


def test_a_child_replaces_or_drops_the_cap():
    text = _scheme("softcap = 20.0\nwindow = 4", name="a") + "scheme b extends a { softcap = 5 }\n" + \
        "scheme c extends a { softcap = none }\n"
    assert load(text, scheme="b").softcap == 5.0 and load(text, scheme="b").window == 4
    assert load(text, scheme="c").softcap is None


@pytest.mark.parametrize("body, line, col, words", [
    ("softcap = 0", 3, 11, "finite number > 0"),
    ("softcap = -2.5", 3, 11, "finite number > 0"),
    ("softcap = position", 3, 11, "known when the scheme is checked"),
    ("softcap = true", 3, 11, "known when the scheme is checked"),
    ("param p: float = 1.0\nsoftcap = p - 1", 4, 11, "finite number > 0"),
])
def test_bad_caps_are_positioned_diagnostics(body, line, col, words):
    err = first_error(_scheme(body))
    assert err.code == "E240" and (err.line, err.col) == (line, col)
    assert words in err.message and err.hint


def test_twice_in_one_scheme_and_beside_path_or_in_a_layers_shell_are_refused():
    err = first_error(_scheme("softcap = 2\nsoftcap = 3"))
    assert err.code == "E205" and err.line == 4
    path = f'import "{SCHEMES / "path.pe"}"\nscheme s extends path {{\n  softcap = 2\n}}\n'
    err = first_error(path)
    assert err.code == "E240" and err.line == 3 and "PaTH" in err.message
    err = first_error(ROPE + "scheme m {\n  layers { default = rope }\n  softcap = 2\n}\n")
    assert err.code == "E250" and err.line == 4 and "not 'softcap'" in err.message


def test_format_round_trip():
    text = _scheme("softcap   =  50.0   # Gemma 2")
    out = format_text(text)
    assert "  softcap = 50.0  # Gemma 2\n" in out and format_text(out) == out


def test_show_and_diff_name_the_cap(tmp_path):
    a, b = tmp_path / "a.pe", tmp_path / "b.pe"
    a.write_text(_scheme("softcap = 50.0"))
    b.write_text(_scheme("softcap = 30.0"))
    code, out, err = run_cli("show", a)
    assert code == 0 and "softcap: 50.0" in out, out + err
    code, out, err = run_cli("diff", a, b)
    assert "softcap" in out and "50" in out and "30" in out, out + err
