"""The language server's requests in-process (pedsl.lsp.session.Session, what `pedsl lsp` runs behind pygls):
completion, hover, definition, symbols, quick fixes on known texts, and a thousand random edits of the
library's schemes answered without a failure and each within a second."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types as lsp

from compiler_helpers import SCHEMES, library
from lang_helpers import BAD_FILES, expectation
from pedsl.errors import PedslError
from pedsl.lang import api
from pedsl.lsp.scan import cursor, outline
from pedsl.lsp.session import Session
from pedsl.lsp.text import Text


def _pos(text: str, sub: str, k: int = 0) -> lsp.Position:
    """The protocol position (UTF-16) of the k-th character of the first ``sub`` in ``text``."""
    i = text.index(sub) + k
    return lsp.Position(*Text(text).position(i))


def _open(session: Session, path: Path, text: str | None = None) -> str:
    uri = path.resolve().as_uri()
    session.update(uri, path.read_text() if text is None else text)
    return uri


def test_completion_in_a_call_offers_the_arguments_and_the_names_in_scope():
    s = Session()
    uri = _open(s, SCHEMES / "yarn.pe")
    text = s.texts[uri]
    labels = [i.label for i in s.completion(uri, _pos(text, "yarn(base", 5))]
    assert labels[:6] == ["base =", "factor =", "original =", "beta_fast =", "beta_slow =", "truncate ="]
    assert {"factor", "w", "m"} <= set(labels)  # own params and lets
    assert "train_length" in labels and "base" in labels  # inherited from rope
    assert {"geometric", "span", "position"} <= set(labels)
    help_ = s.signature_help(uri, _pos(text, "yarn(base, factor", 11))
    assert help_.signatures[0].label.startswith("yarn(base, factor, original") and help_.active_parameter == 1


@pytest.mark.parametrize("typed, expect, absent", [
    ("scheme r extends ", {"rope", "yarn"}, {"r"}),
    ("scheme r {\n  ", {"param", "let", "qk", "channels", "train", "allow"}, {"geometric"}),
    ("scheme r {\n  layout ", {"halves", "interleaved"}, {"param"}),
    ("scheme r {\n  allow ", {"frayed_frequencies", "unused"}, {"param"}),
    ("scheme r {\n  param p: ", {"float", "int"}, {"geometric"}),
    ("scheme r {\n  train {\n    ", {"context", "steps", "lr"}, {"param"}),
    ("scheme r {\n  channels { rot = fraction(0.5) }\n  qk on ", {"rot"}, {"param"}),
    ('import "', {"rope.pe", "yarn.pe"}, {"scheme"}),
    ("", {"scheme", "import"}, {"param"}),
    ("scheme r {\n  let w = geometric(base) # a comment ", set(), {"geometric"}),
])
def test_completion_knows_where_it_is(typed, expect, absent, tmp_path):
    s = Session()
    uri = _open(s, tmp_path / "r.pe", typed)
    labels = {i.label for i in s.completion(uri, lsp.Position(*Text(typed).position(len(typed))))}
    assert expect <= labels and not (absent & labels), labels


def test_import_completion_walks_subfolders_but_not_out_of_the_allowed_tree(tmp_path):
    (tmp_path / "work" / "variants").mkdir(parents=True)
    (tmp_path / "work" / "variants" / "long.pe").write_text("scheme long {}\n")
    (tmp_path / "secret.pe").write_text("scheme secret {}\n")
    s = Session()
    for typed, expect, absent in [('import "', {"variants/", "rope.pe"}, {"r.pe"}),
                                  ('import "variants/', {"variants/long.pe"}, {"rope.pe"}),
                                  ('import "../', set(), {"../secret.pe"})]:
        uri = _open(s, tmp_path / "work" / "r.pe", typed)
        labels = {i.label for i in s.completion(uri, lsp.Position(0, len(typed)))}
        assert expect <= labels and not (absent & labels), labels


def test_extends_offers_library_schemes_with_their_import(tmp_path):
    s = Session()
    text = "scheme r extends "
    uri = _open(s, tmp_path / "r.pe", text)
    item = next(i for i in s.completion(uri, lsp.Position(0, len(text))) if i.label == "alibi")
    assert item.additional_text_edits[0].new_text == 'import "alibi.pe"\n'


def test_hover_on_a_parameter_a_builtin_and_a_frequency():
    s = Session()
    uri = _open(s, SCHEMES / "yarn.pe")
    text = s.texts[uri]
    h = s.hover(uri, _pos(text, "base, factor", 1)).contents.value  # base: declared in rope, inherited
    assert "param base: float (> 1) = 10000.0" in h and "`> 1`" in h and "declared in `rope (rope.pe)`" in h
    assert "resolves to **`10000.0`** in `yarn`" in h
    h = s.hover(uri, _pos(text, "yarn(base", 1)).contents.value
    assert "yarn(base, factor, original, beta_fast = 32.0" in h and "Frequency grids (num[pair]" in h
    assert "periods 6.283 .. 1.41e+05 tokens over 16 pairs; 5 of 16 complete a cycle" in h
    assert "**Frayed RoPE** (W101, allowed here by `allow frayed_frequencies`): 11 of 16 pairs" in h
    h = s.hover(uri, _pos(text, "w * position")).contents.value  # a let built on a grid
    assert "let w = yarn(" in h and "Frequencies of `yarn`" in h
    h = s.hover(uri, _pos(text, "qk: rotate")).contents.value  # the transport
    assert "a transport of queries and keys" in h and "Frequencies of `yarn`" in h


def test_hover_on_a_statement_keyword_comes_from_its_record(tmp_path):
    """Every statement's keyword hovers with its record's words (a new statement's comes with its record)."""
    from pedsl.lang.statements import RECORDS

    s = Session()
    text = ("scheme s {\n  param layers: int = 2\n  qk: none\n  window = 4\n  sink = logit\n"
            "  normalize = stick_breaking\n}\n")
    uri = _open(s, tmp_path / "s.pe", text)
    for keyword in ("window", "sink", "normalize", "param", "qk"):
        record = next(r for r in RECORDS if keyword in r.keywords)
        h = s.hover(uri, _pos(text, "  " + keyword, 2)).contents.value
        assert h.startswith(record.hover(keyword)) and record.completions[0][2] in h
    assert "a scheme per layer" not in s.hover(uri, _pos(text, "layers:")).contents.value  # a param's name


def test_hover_on_train_and_eval_settings():
    s = Session()
    uri = _open(s, SCHEMES / "rope.pe")
    text = s.texts[uri]
    h = s.hover(uri, _pos(text, "context =")).contents.value
    assert "train { context: int = 128 }" in h and "bounds: >= 2" in h
    h = s.hover(uri, _pos(text, "lengths =")).contents.value
    assert "eval { lengths: list[int] | None = None }" in h


def test_hover_says_a_span_grid_is_not_frayed():
    s = Session()
    uri = _open(s, SCHEMES / "rope_id.pe")
    text = s.texts[uri]
    h = s.hover(uri, _pos(text, "span(")).contents.value
    assert "**not frayed**, every pair completes a cycle within the training length" in h


def test_definition_follows_extends_params_and_lets_across_files():
    s = Session()
    uri = _open(s, SCHEMES / "pi.pe")
    text = s.texts[uri]
    rope = (SCHEMES / "rope.pe").read_text()
    [loc] = s.definition(uri, _pos(text, "extends rope", 9))
    assert loc.uri == (SCHEMES / "rope.pe").resolve().as_uri() and loc.range.start == _pos(rope, "rope \"Rot")
    [loc] = s.definition(uri, _pos(text, "w * position"))
    assert loc.uri.endswith("rope.pe") and loc.range.start == _pos(rope, "w = geometric")
    [loc] = s.definition(uri, _pos(text, 'import "rope.pe"', 8))
    assert loc.uri == (SCHEMES / "rope.pe").resolve().as_uri()
    assert s.definition(uri, _pos(text, "rotate")) == []  # a builtin has no source


def test_symbols_outline_schemes_params_lets_and_groups():
    s = Session()
    uri = _open(s, SCHEMES / "rope_id.pe")
    syms = s.symbols(uri)
    scheme = next(x for x in syms if x.name == "rope_id")
    kinds = {c.name: c.kind for c in scheme.children}
    assert kinds["train_length"] == lsp.SymbolKind.Property and kinds["w"] == lsp.SymbolKind.Variable
    assert kinds["rot"] == lsp.SymbolKind.Field and kinds["plain"] == lsp.SymbolKind.Field


def test_quick_fixes_replace_a_misspelling_and_silence_a_lint(tmp_path):
    s = Session()
    text = ('scheme r {\n  param base: float = 10000.0\n  train { context = 64 }\n'
            '  let w = geometric(bsae)\n  qk: rotate(w * position)\n}\n')
    uri = _open(s, tmp_path / "r.pe", text)
    [d] = s.diagnostics(uri)
    assert d.code == "E201" and d.range.start == _pos(text, "bsae") and d.range.end == _pos(text, "bsae", 4)
    [fix] = s.code_actions(uri, d.range)
    assert fix.title == "Replace 'bsae' with 'base'"
    edit = fix.edit.changes[uri][0]
    lines = text.split("\n")
    fixed_line = lines[edit.range.start.line]
    lines[edit.range.start.line] = (fixed_line[:edit.range.start.character] + edit.new_text
                                    + fixed_line[edit.range.end.character:])
    fixed = "\n".join(lines)
    s.update(uri, fixed)
    [w] = s.diagnostics(uri)
    assert w.code == "W101" and w.severity == lsp.DiagnosticSeverity.Warning
    [allow] = s.code_actions(uri, w.range)
    s.update(uri, fixed.replace("\n}\n", "\n" + allow.edit.changes[uri][0].new_text + "}\n"))
    assert s.diagnostics(uri) == [] and api.check(s.texts[uri]) == []


@pytest.mark.parametrize("path", [p for p in BAD_FILES if expectation(p)["params"] is None], ids=lambda p: p.stem)
def test_diagnostics_are_pedsl_checks_codes_positions_and_hints(path):
    """Every bad fixture: the editor shows what `pedsl check FILE` prints, at the same line and column."""
    try:
        expected = api.check(path)
    except PedslError as err:
        expected = err.diagnostics
    s = Session()
    uri = _open(s, path, path.read_bytes().decode("utf-8", errors="replace"))
    got = s.diagnostics(uri)
    assert [d.code for d in got] == [d.code for d in expected]
    for lsp_diag, d in zip(got, expected):
        if d.file in (None, str(path)) and d.line is not None:
            assert (lsp_diag.range.start.line, lsp_diag.range.start.character) == (d.line - 1, (d.col or 1) - 1)
            if d.end_col is not None:
                assert lsp_diag.range.end.character == d.end_col - 1
        assert d.message in lsp_diag.message  # found in an imported file: prefixed with where
        assert d.hint is None or f"hint: {d.hint}" in lsp_diag.message


def test_diagnostics_in_an_imported_file_are_shown_on_the_import(tmp_path):
    (tmp_path / "base.pe").write_text("scheme base {\n  let w = geometric(bsae)\n  qk: rotate(w * position)\n}\n")
    s = Session()
    text = 'import "base.pe"\nscheme child extends base {}\n'
    uri = _open(s, tmp_path / "child.pe", text)
    [d] = s.diagnostics(uri)
    assert d.code == "E201" and d.range.start == lsp.Position(0, 7) and "base.pe:2:" in d.message
    assert d.related_information[0].location.uri == (tmp_path / "base.pe").resolve().as_uri()


def test_a_save_checks_the_importing_documents_again(tmp_path):
    base = tmp_path / "base.pe"
    base.write_text("scheme base {\n  qk: rotate(geometric(10000) * position)\n}\n")
    s = Session()
    uri = _open(s, tmp_path / "child.pe", 'import "base.pe"\nscheme child extends base {}\n')
    assert s.diagnostics(uri) == []
    base.write_text("scheme base {\n  qk: rotate(geometric(bsae) * position)\n}\n")
    s.saved()
    assert [d.code for d in s.diagnostics(uri)] == ["E201"]


def test_imports_are_confined_like_pedsl_check(tmp_path):
    outside = tmp_path / "outside"
    inside = tmp_path / "work"
    outside.mkdir()
    inside.mkdir()
    (outside / "secret.pe").write_text("scheme secret {}\n")
    s = Session()
    text = 'import "../outside/secret.pe"\nscheme r extends secret {}\n'
    (inside / "r.pe").write_text(text)
    uri = _open(s, inside / "r.pe")
    [d] = s.diagnostics(uri)
    with pytest.raises(PedslError) as err:  # what `pedsl check` says of the same file
        api.check(inside / "r.pe")
    assert d.code == "E209" == err.value.code and d.message.startswith(err.value.diagnostics[0].message)
    assert s.definition(uri, _pos(text, "secret.pe")) == []  # the editor does not open what pedsl refuses
    assert s.definition(uri, _pos(text, "extends secret", 9)) == []


def test_positions_count_utf16_units_beyond_the_basic_plane(tmp_path):
    s = Session()
    text = 'scheme r "\U0001F600 doc" { let w = bsae; qk: rotate(w * position) }\n'
    uri = _open(s, tmp_path / "r.pe", text)
    d = next(d for d in s.diagnostics(uri) if d.code == "E201")
    assert d.range.start == lsp.Position(0, text.index("bsae") + 1)  # the emoji is two UTF-16 units


def test_formatting_is_pedsl_fmt_and_leaves_broken_text_alone(tmp_path):
    s = Session()
    text = "scheme r { let w = geometric(10000)\n qk: rotate(w*position) }"
    uri = _open(s, tmp_path / "r.pe", text)
    [edit] = s.formatting(uri)
    assert edit.new_text == api.format_text(text) and edit.range.start == lsp.Position(0, 0)
    s.update(uri, api.format_text(text))
    assert s.formatting(uri) == []
    s.update(uri, "scheme r { let w = ")
    assert s.formatting(uri) is None and not s.failures


def test_the_outline_survives_an_unclosed_scheme():
    o = outline('import "rope.pe"\nscheme a extends rope {\n  param p: int = 1\n  let q = p *\nscheme b { let z = 1 }')
    assert [s.name for s in o.schemes] == ["a", "b"] and o.schemes[0].base == "rope"
    assert [d.name for d in o.schemes[0].members] == ["p", "q"] and o.schemes[0].close is None
    c = cursor(o, o.text.index("p *") + 3)
    assert c.scheme.name == "a" and c.statement == "let" and not c.at_statement_start


# ------------------------------------------------------------------ random edits

EDIT_TOKENS = ["(", ")", "{", "}", "[", "]", ",", ";", "=", ":", "**", "-", "0", "1e999", '"', "#", "\n", " ",
               "x", "token", "position", "rest", "qk", "qkv", "scheme", "extends", "import", '"rope.pe"', "param",
               "let", "heads", "geometric(", "span(", "fraction(0.3)", "allow ", "on ", "\U0001F600", "\t", "\\"]


def _edit(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text) + 1)
    j = min(len(text), i + rng.randrange(12))
    op = rng.random()
    if op < 0.35:
        return text[:i] + text[j:]  # delete a run
    if op < 0.75:
        return text[:i] + rng.choice(EDIT_TOKENS) + text[i:]  # type something
    if op < 0.9:
        return text[:i]  # a file cut short, as while typing at its end
    k = rng.randrange(len(text) + 1)
    return text[:i] + text[k:k + 20] + text[i:]  # paste a piece of itself


def test_a_thousand_random_edits_never_fail_and_each_answer_comes_within_a_second():
    rng = random.Random(1234)
    s = Session()
    texts = {p: p.read_text() for p in library()}
    slowest = 0.0
    for n in range(1000):
        path = rng.choice(sorted(texts))
        text = texts[path] if rng.random() < 0.3 else _edit(rng, texts[path])
        for _ in range(rng.randrange(3)):
            text = _edit(rng, text)
        texts[path] = text if len(text) > 20 else path.read_text()  # keep something to edit
        uri = _open(s, path, text)
        t = Text(text)
        pos = lsp.Position(*t.position(rng.randrange(len(text) + 1)))
        requests = [lambda: s.diagnostics(uri), lambda: s.completion(uri, pos), lambda: s.hover(uri, pos),
                    lambda: s.definition(uri, pos), lambda: s.signature_help(uri, pos),
                    lambda: s.code_actions(uri, lsp.Range(start=pos, end=pos))]
        if n % 10 == 0:
            requests += [lambda: s.symbols(uri), lambda: s.formatting(uri)]
        for request in requests:
            # the request's own CPU time: wall time on a loaded machine measures the other processes too
            start = time.thread_time()
            request()
            slowest = max(slowest, time.thread_time() - start)
    assert not s.failures, s.failures[:5]
    assert slowest < 1.0, f"the slowest request took {slowest:.2f} s"


def test_without_the_extra_pedsl_lsp_says_which_extra_in_one_line():
    code = "import sys; sys.modules['pygls'] = None\nfrom pedsl.cli import main\nmain(['lsp'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "pip install 'pedsl[lsp]'" in r.stderr and "error[E980]" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_command_line_does_not_import_the_server_unless_asked():
    code = ("import sys\nfrom pedsl.cli import main\ntry:\n    main(['check', %r])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pygls', 'lsprotocol', 'pygments', 'pedsl.lsp') if m in sys.modules))"
            % str(library()[0]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


def test_a_bug_inside_a_request_is_logged_and_answered_with_nothing(monkeypatch, tmp_path):
    from pedsl.lsp import features

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    logged = []
    s = Session(report=lambda message, level: logged.append((level, message)))
    uri = _open(s, tmp_path / "r.pe", "scheme r { let w = geometric(")
    monkeypatch.setattr(features, "completions", broken)
    assert s.completion(uri, lsp.Position(0, 5)) == []
    assert s.failures == ["completion: RuntimeError: a bug"]
    assert logged[0][0] == "error" and "Traceback" in logged[0][1]
    assert "geometric(base" in s.hover(uri, lsp.Position(0, 20)).contents.value  # the other requests go on
