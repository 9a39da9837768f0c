"""`keep_first = k`: parsed, checked by the registry's rule for known numbers (E218, positioned, with a hint),
inherited and dropped, formatted, shown, compared and said in words - all read off its record."""

from __future__ import annotations

import pytest

from compiler_helpers import SCHEMES, first_error, run_cli
from pedsl.lang.api import format_text, load
from pedsl.lang.statements import attention_words, shown

ROPE = f'import "{SCHEMES / "rope.pe"}"\n'


def _scheme(body: str, name: str = "s") -> str:
    return ROPE + f"scheme {name} extends rope {{\n{body}\n}}\n"


def test_it_resolves_from_literals_params_and_arithmetic_and_is_inherited_or_dropped():
    assert load(_scheme("window = 8\nkeep_first = 4")).keep_first == 4
    assert load(_scheme("param k: int (>= 1) = 2\nchunk = 8\nkeep_first = k * 2"), params={"k": "3"}).keep_first == 6
    assert load(ROPE + "scheme s extends rope { }").keep_first is None
    text = _scheme("window = 8\nkeep_first = 4", name="a") + "scheme b extends a { keep_first = 1 }\n" \
        + "scheme c extends a { keep_first = none }\n"
    assert load(text, scheme="b").keep_first == 1 and load(text, scheme="b").window == 8
    assert load(text, scheme="c").keep_first is None


@pytest.mark.parametrize("body, line, col, words", [
    ("window = 8\nkeep_first = 0", 4, 14, "out of its range"),
    ("window = 8\nkeep_first = 2.5", 4, 14, "must be an integer"),
    ("window = 8\nkeep_first = position", 4, 14, "known when the scheme is checked"),
    ("window = 8\nkeep_first = true", 4, 14, "known when the scheme is checked"),
    ("keep_first = 4", 3, 1, "acts with window or chunk"),
])
def test_bad_values_are_positioned_diagnostics(body, line, col, words):
    err = first_error(_scheme(body))
    assert err.code == "E218" and (err.line, err.col) == (line, col), (err.code, err.line, err.col, err.message)
    assert words in err.message and err.hint


def test_the_cli_refuses_it_without_a_traceback(tmp_path):
    f = tmp_path / "bad.pe"
    f.write_text(_scheme("keep_first = 4"))
    code, out, err = run_cli("check", str(f))  # run_cli asserts no traceback
    assert code == 1 and "E218" in out + err and "window" in out + err


def test_format_show_and_words():
    text = _scheme("window = 8\nkeep_first   =  4   # StreamingLLM")
    out = format_text(text)
    assert "  keep_first = 4  # StreamingLLM\n" in out and format_text(out) == out
    s = load(text)
    assert "keep_first: 4" in shown(s, "body")
    assert attention_words(s) == "sliding window of 8, the keys at the first 4 positions"


def test_a_param_may_still_be_named_keep_first():
    s = load(_scheme("param keep_first: int = 2\nwindow = 8"))
    assert s.params["keep_first"] == 2 and s.keep_first is None


def test_export_hf_refuses_it_by_name():
    """A carried value without a Scheme field of its own (Scheme.settings) is a statement export-hf refuses like
    any other beyond the rotation, not a KeyError."""
    from pedsl.errors import PedslError
    from pedsl.hf.rope import export_rope

    export_rope(load(ROPE + "scheme s extends rope { }"))  # the plain rotation exports
    with pytest.raises(PedslError, match=r"keep_first = 4.*rotation only"):
        export_rope(load(_scheme("window = 8\nkeep_first = 4")))
