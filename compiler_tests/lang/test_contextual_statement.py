"""`contextual = cope(max_pos = N, shared = BOOL)`: parsed, checked with positioned diagnostics (E241),
inherited, formatted, shown by explain/diff/graph and refused by export-hf (docs/language.md §3,
docs/semantics.md §1c)."""

from __future__ import annotations

import pytest

from compiler_helpers import SCHEMES, first_error, run_cli
from pedsl.errors import PedslError
from pedsl.hf.rope import export_rope
from pedsl.lang.api import format, load

NOPE = f'import "{SCHEMES / "nope.pe"}"\n'


def _scheme(body: str, name: str = "s", base: str = "nope") -> str:
    return NOPE + f"scheme {name} extends {base} {{\n{body}\n}}\n"


def test_statement_resolves_to_the_scheme_field():
    c = load(_scheme("param m: int (>= 1) = 4\ncontextual = cope(max_pos = m * 2, shared = false)")).contextual
    assert (c.kind, c.max_pos, c.shared) == ("cope", 8, False)
    assert load(_scheme("contextual = cope(max_pos = 3)")).contextual.shared is True
    lib = load(SCHEMES / "cope.pe")
    assert lib.contextual.max_pos == 16 and lib.params["max_pos"] == 16
    assert load(SCHEMES / "cope.pe", params={"max_pos": 64}).contextual.max_pos == 64


def test_a_child_replaces_or_drops_what_it_inherits():
    text = _scheme("contextual = cope(max_pos = 4)", name="a") + \
        "scheme b extends a { contextual = cope(max_pos = 9) }\nscheme c extends a { contextual = none }\n"
    assert load(text, scheme="b").contextual.max_pos == 9
    assert load(text, scheme="c").contextual is None


@pytest.mark.parametrize("body, line, col, words", [
    ("contextual = cope(max_pos = 0)", 3, 29, "from 1 to"),
    ("contextual = cope(max_pos = 2.5)", 3, 29, "integer"),
    ("contextual = cope(max_pos = 100000)", 3, 29, "from 1 to 65,536"),
    ("contextual = cope(max_pos = position)", 3, 29, "known when"),
    ("contextual = cope(16)", 3, 19, "by name"),
    ("contextual = cope()", 3, 14, "needs max_pos"),
    ("contextual = cop(max_pos = 4)", 3, 14, "did you mean 'cope'"),
    ("contextual = 3", 3, 14, "takes cope"),
    ("contextual = cope(max_pos = 4, shard = true)", 3, 32, "did you mean 'shared'"),
    ("contextual = cope(max_pos = 4, shared = 2)", 3, 41, "true"),
    ("contextual = cope(max_pos = 4)\nsink = logit", 3, 1, "sink"),
])
def test_bad_declarations_are_positioned_diagnostics(body, line, col, words):
    err = first_error(_scheme(body))
    assert err.code == "E241", err
    assert (err.line, err.col) == (line, col), err
    assert words in err.message and err.hint


def test_cope_beside_path_is_refused():
    text = f'import "{SCHEMES / "path.pe"}"\nscheme s extends path {{\n  contextual = cope(max_pos = 4)\n}}\n'
    err = first_error(text)
    assert err.code == "E241" and err.line == 3 and "PaTH" in err.message


def test_a_duplicate_statement_is_reported():
    assert first_error(_scheme("contextual = cope(max_pos = 4)\ncontextual = none")).code == "E205"


def test_format_keeps_the_statement():
    text = _scheme("contextual   =   cope( max_pos=4 ,shared=false )")
    assert "  contextual = cope(max_pos = 4, shared = false)\n" in format(text)


def test_explain_graph_and_diff_show_it(tmp_path):
    path = str(SCHEMES / "cope.pe")
    code, out, err = run_cli("explain", path)
    assert code == 0, err
    assert "Contextual positions" in out and "clamped to 15" in out and "CoPE (gates, counts, embedding)" in out
    code, out, err = run_cli("graph", path)
    assert code == 0, err
    assert "contextual" in out and "contextual_embedding (16 x head_dim)" in out
    code, out, err = run_cli("diff", str(SCHEMES / "rope.pe"), path)
    assert code == 1, err  # not equivalent
    assert "+ contextual = cope(max_pos = 16)" in out and "contextual positions:" in out
    other = tmp_path / "per_head.pe"
    other.write_text(f'import "{path}"\nscheme per_head extends cope {{ contextual = cope(max_pos = 8, shared = false) }}\n')
    code, out, err = run_cli("diff", path, str(other))
    assert code == 1, err
    assert "contextual: cope(max_pos = 16) -> cope(max_pos = 8, shared = false)" in out, out


def test_export_hf_refuses_with_the_reason():
    with pytest.raises(PedslError, match="CoPE"):
        export_rope(load(SCHEMES / "cope.pe"))
