"""`window = N`, `chunk = N`, `sink = logit | token`: parsed, checked with positioned diagnostics,
inherited, formatted and shown (docs/language.md §3, docs/semantics.md §11)."""

from __future__ import annotations

import pytest

from compiler_helpers import SCHEMES, first_error, run_cli
from pedsl.lang.api import check, format, load

ROPE = f'import "{SCHEMES / "rope.pe"}"\n'


def _scheme(body: str, name: str = "s", base: str = "rope") -> str:
    return ROPE + f"scheme {name} extends {base} {{\n{body}\n}}\n"


def test_statements_resolve_to_the_scheme_fields():
    s = load(_scheme("param w: int (>= 1) = 4\nwindow = w * 2\nsink = logit"))
    assert (s.window, s.chunk, s.sink) == (8, None, "logit")
    s = load(_scheme("chunk = 3; sink = token"))
    assert (s.window, s.chunk, s.sink) == (None, 3, "token")
    assert load(_scheme("window = 4"), params={}).window == 4
    assert load(ROPE + "scheme s extends rope { }").window is None


def test_params_override_the_width():
    s = load(_scheme("param w: int (>= 1) = 4\nwindow = w"), params={"w": 9})
    assert s.window == 9


def test_a_child_replaces_or_drops_what_it_inherits():
    text = _scheme("window = 4\nsink = logit", name="a") + "scheme b extends a { window = 7 }\n" + \
        "scheme c extends a { window = none\nsink = none\nchunk = 5 }\n"
    assert (load(text, scheme="b").window, load(text, scheme="b").sink) == (7, "logit")
    c = load(text, scheme="c")
    assert (c.window, c.chunk, c.sink) == (None, 5, None)


@pytest.mark.parametrize("body, line, col, words", [
    ("window = 4\nchunk = 3", 4, 1, "not both"),
    ("window = 1.5", 3, 10, "integer"),
    ("window = 0", 3, 10, "between 1 and"),
    ("chunk = 2000000", 3, 9, "between 1 and"),
    ("window = position", 3, 10, "known when the scheme is checked"),
    ("window = true", 3, 10, "known when the scheme is checked"),
    ("sink = logti", 3, 8, "did you mean 'logit'"),
    ("sink = tokens", 3, 8, "did you mean 'token'"),
])
def test_bad_declarations_are_positioned_diagnostics(body, line, col, words):
    err = first_error(_scheme(body))
    assert err.code == "E240"
    assert (err.line, err.col) == (line, col)
    assert words in err.message and err.hint


def test_window_and_chunk_inherited_together_point_at_the_later():
    err = first_error(_scheme("window = 4", name="a") + "scheme b extends a {\n  chunk = 3\n}\n")
    assert err.code == "E240" and err.line == 6


def test_a_sink_token_with_a_value_transport_is_refused():
    text = f'import "{SCHEMES / "acc_learned_qkv.pe"}"\nscheme s extends acc_learned_qkv {{\n  sink = token\n}}\n'
    err = first_error(text)
    assert err.code == "E240" and err.line == 3 and "qkv" in err.message


def test_a_duplicate_statement_is_reported():
    assert first_error(_scheme("window = 4\nwindow = 5")).code == "E205"


def test_a_let_read_only_by_the_window_is_used():
    diags = check(_scheme("let w = 6\nwindow = w"))
    assert not [d for d in diags if d.code == "W105"]


def test_the_words_are_reserved_and_the_text_round_trips():
    text = _scheme("window = 2 * 3\nsink = token")
    again = format(text)
    assert "  window = 2 * 3\n  sink = token\n" in again
    assert format(again) == again
    err = first_error(ROPE + "scheme s extends rope { let window = 3 }")
    assert err.code == "E205" and "keyword" in err.message


def test_show_prints_the_shape(tmp_path):
    f = tmp_path / "w.pe"
    f.write_text(_scheme("chunk = 8\nsink = logit"))
    code, out, _ = run_cli("show", f)
    assert code == 0 and "chunk: 8" in out and "sink: logit" in out


@pytest.mark.parametrize("name, field, value", [("rope_local", "window", 512), ("rope_chunked", "chunk", 8192),
                                                ("rope_sink", "sink", "logit"),
                                                ("rope_sink_token", "sink", "token")])
def test_library_schemes(name, field, value):
    assert getattr(load(SCHEMES / f"{name}.pe"), field) == value
