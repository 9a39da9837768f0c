"""Every checker rule has a bad-input fixture (compiler_tests/fixtures/bad/*.pe) whose header
`# expect: CODE LINE:COL (hint: ...)` names the first error; load() and check() must both agree."""

from __future__ import annotations

import pytest

from lang_helpers import BAD_FILES, expectation
from pedsl.errors import CheckError, ParamError, ParseError, PedslError
from pedsl.lang.api import check, load


def first_error(path, params=None):
    try:
        diags = check(path, params)
    except PedslError as err:
        diags = err.diagnostics
    errors = [d for d in diags if d.severity == "error"]
    assert errors, f"{path.name}: expected an error, got {[d.render() for d in diags]}"
    return errors[0]


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_fixture_check(path):
    exp = expectation(path)
    d = first_error(path, exp["params"])
    assert (d.code, d.line, d.col) == (exp["code"], exp["line"], exp["col"]), d.render()
    if exp["hint"]:
        assert d.hint == exp["hint"]
    assert d.file is not None
    rendered = d.render()
    assert f":{d.line}:{d.col}: error[{d.code}]" in rendered


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_fixture_load_raises_positioned(path):
    exp = expectation(path)
    with pytest.raises(PedslError) as info:
        load(path, exp["params"])
    err = info.value
    assert err.line is not None and err.col is not None
    assert isinstance(err, (ParseError, CheckError))
    if exp["code"].startswith("E3"):
        assert isinstance(err, ParamError)
        assert (err.code, err.line, err.col) == (exp["code"], exp["line"], exp["col"])
    elif exp["code"].startswith("E1"):
        assert isinstance(err, ParseError)


def test_every_rule_has_a_fixture():
    codes = {expectation(p)["code"] for p in BAD_FILES}
    wanted = {"E101", "E103", "E110", "E111", "E112", "E201", "E202", "E203", "E204", "E205", "E206", "E207",
              "E208", "E209", "E210", "E211", "E212", "E213", "E214", "E215", "E216", "E217", "E301", "E302",
              "E303"}
    assert wanted <= codes, sorted(wanted - codes)


def test_several_errors_reported_in_one_run():
    text = """scheme s {
  param base: float = 10000.0
  let a = bsae
  let b = geometirc(2)
  train { contxt = 128 }
}
"""
    diags = check(text)
    codes = [(d.code, d.line) for d in diags if d.severity == "error"]
    assert ("E201", 3) in codes and ("E202", 4) in codes and ("E213", 5) in codes


def test_several_syntax_errors_reported():
    text = "scheme a {\n  param x int = 1\n}\nscheme b {\n  let = 2\n}\n"
    with pytest.raises(ParseError) as info:
        load(text)
    assert len(info.value.diagnostics) >= 2
    assert [d.line for d in info.value.diagnostics][:2] == [2, 5]


def test_diagnostic_renders_source_line_and_caret():
    text = "scheme s {\n  param base: float = 10000.0\n  qk: rotate(geometric(bsae) * position)\n}\n"
    with pytest.raises(CheckError) as info:
        load(text)
    out = info.value.render()
    lines = out.splitlines()
    assert lines[0] == "<text>:3:24: error[E201]: unknown name 'bsae'"
    assert lines[1].strip() == "qk: rotate(geometric(bsae) * position)"
    assert lines[2].index("^") == lines[1].index("bsae") and lines[2].count("^") == 4
    assert lines[3] == "  hint: did you mean 'base'?"


def test_unknown_scheme_name_selected():
    with pytest.raises(CheckError) as info:
        load("scheme rope { qk: none }\n", scheme="rpoe")
    assert info.value.code == "E215" and info.value.hint == "did you mean 'rope'?"


def test_param_overrides_apply_and_coerce():
    text = "scheme s {\n  param f: float (>= 1) = 4.0\n  param k: int = 3\n  qk: none\n}\n"
    s = load(text, {"f": "8", "k": "5"})
    assert s.params == {"f": 8.0, "k": 5}
    assert isinstance(s.params["f"], float)
    assert load(text, {"f": 2}).params["f"] == 2.0
    with pytest.raises(ParamError) as info:
        load(text, {"k": "2.5"})
    assert info.value.code == "E302" and info.value.line == 3


def test_structural_overrides():
    s = load("scheme s { qk: rotate(geometric(10000) * position) }\n", heads=8, head_dim=64)
    assert (s.heads, s.head_dim) == (8, 64)
    assert s.groups[0].channels == tuple(range(64))
    with pytest.raises(CheckError) as info:
        load("scheme s { channels { a = quarters(1) } qk on a: rotate(geometric(10000) * position) }\n", head_dim=36)
    assert info.value.code == "E210"


def test_structural_names_from_param_overrides():
    from lang_helpers import SCHEMES

    assert load(SCHEMES / "alibi.pe", {"heads": "8"}).heads == 8
    assert load(SCHEMES / "rope_id.pe", {"head_dim": 64}).group("rot").channels == tuple(range(16)) + tuple(
        range(32, 48))
    with pytest.raises(ParamError) as info:
        load(SCHEMES / "alibi.pe", {"heads": "x"})
    assert info.value.code == "E302" and info.value.line == 5
    with pytest.raises(ParamError) as info:
        load(SCHEMES / "alibi.pe", {"heads": 0})
    assert info.value.code == "E303"


def test_a_bad_group_does_not_cascade():
    from lang_helpers import SCHEMES

    diags = check(SCHEMES / "rope_id.pe", {"head_dim": 36})
    assert [(d.code, d.line, d.col) for d in diags] == [("E210", 10, 11)]


def _chain(k: int, body: str, reverse: bool = False) -> str:
    lets = [f"  let a{i} = {body.format(p=f'a{i - 1}')}\n" for i in range(1, k + 1)]
    if reverse:
        lets.reverse()
    return "scheme a {\n  let a0 = 1\n" + "".join(lets) + f"  qk: rotate(geometric(a{k} + 2) * position)\n}}\n"


def test_doubling_lets_are_refused_quickly():
    import time

    t0 = time.process_time()  # CPU time: a guard against blow-ups, robust to a loaded machine
    diags = check(_chain(40, "{p} + {p}"))
    assert time.process_time() - t0 < 2.0
    assert [(d.code, d.line) for d in diags] == [("E217", 14)]  # a12 (8,191 nodes) is the first over 5,000
    assert "expands to" in diags[0].message


def test_long_let_chains_are_fully_inlined():
    from pedsl.lang.exprs import names_in

    s = load(_chain(80, "{p} + 1"))
    assert names_in(s.transports[0].phase) == {"position"}


def test_very_deep_definitions_end_in_a_diagnostic():
    diags = check(_chain(2000, "{p} + 1", reverse=True))
    assert diags and diags[0].code in ("E103", "E217") and diags[0].line is not None


def test_long_extends_chains_are_cut_and_fast():
    import time

    text = "scheme s0 { qk: none }\n" + "".join(f"scheme s{i} extends s{i - 1} {{ qk: none }}\n" for i in range(1, 300))
    t0 = time.process_time()  # CPU time: a guard against blow-ups, robust to a loaded machine
    diags = check(text)
    assert time.process_time() - t0 < 3.0
    assert diags[0].code == "E207" and diags[0].line == 65 and "longer than 64" in diags[0].message
    assert check(text.split("scheme s64")[0]) == []  # 64 schemes in a chain are fine


def test_keywords_cannot_name_lets_or_params():
    for name in ("true", "train", "on"):
        for decl in (f"let {name} = 1", f"param {name}: int = 1"):
            diags = check("scheme s {\n  " + decl + "\n  qk: none\n  allow unused\n}\n")
            assert [(d.code, d.line) for d in diags] == [("E205", 2)], (decl, diags)


def test_library_schemes_import_from_any_folder(tmp_path):
    variant = tmp_path / "rope_id_512.pe"
    variant.write_text('import "rope_id.pe"\n\nscheme rope_id_512 extends rope_id {\n'
                       '  param train_length: int (>= 64) = 512\n}\n')
    s = load(variant)
    assert s.bases == ("rope_id",) and s.params["train_length"] == 512 and s.train["context"] == 512
    # a file next to the importer wins over the library's
    (tmp_path / "rope_id.pe").write_text('scheme rope_id "local" {\n  param train_length: int = 64\n  qk: none\n}\n')
    assert load(variant).transports == ()


@pytest.mark.parametrize("call, col", [
    ("slopes(heads, firstfirst = 1)", 25), ("slopes(heads, 0, 1)", 11), ("slopes(heads, first = 1, first = 2)", 36),
    ("log(1 + learned(1.0, per = head, bogus = 2))", 44), ("table(bucket(distance, buckets = 8, spread = 2))", 47),
])
def test_a_call_outside_its_signature_is_one_positioned_e203(call, col):
    """Folding a static call (its values are checked before the type checker runs) must not bind an
    argument the builtin does not take: the one diagnostic is the type checker's E203, at the argument."""
    diags = [d for d in check(f"scheme x {{\n  bias = -{call} * distance\n}}\n") if d.severity == "error"]
    assert [(d.code, d.line, d.col) for d in diags] == [("E203", 2, col)], [d.render() for d in diags]
