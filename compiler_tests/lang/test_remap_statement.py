"""`remap { REGIME ... }`: parsed, checked with positioned diagnostics (E243: overlapping or missing
regimes, bounds that are not on the distance, positions that are not per token, transports the regimes
have no meaning for), inherited, formatted, shown, and refused by export-hf, pedsl compile and the raw-score
instruments (docs/language.md §3, docs/semantics.md §2d)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import SCHEMES, first_error, run_cli
from pedsl.compiler import compile_scheme
from pedsl.errors import PedslError
from pedsl.hf.rope import export_rope
from pedsl.lang.api import format, load

def _scheme(body: str, name: str = "s", base: str = "rope") -> str:
    return f'import "{SCHEMES / (base + ".pe")}"\n' + f"scheme {name} extends {base} {{\n{body}\n}}\n"


def test_regimes_resolve_sorted_with_their_integer_bounds():
    s = load(_scheme("param w: int = 8\nremap {\n distance >= w: query = w, key = 0\n distance < w\n}"))
    (near, far) = s.remap.regimes
    assert (near.low, near.high, far.low, far.high) == (0, 8, 8, None)
    assert near.source() == "distance < w" and far.source() == "distance >= w: query = w, key = 0"
    # bounds fold to whole distances: d > 2.5 starts at 3, d <= 2.5 ends before 3
    s = load(_scheme("remap { distance <= 2.5; distance > 2.5, distance < 9: key = 1; distance >= 9 }"))
    assert [(r.low, r.high) for r in s.remap.regimes] == [(0, 3), (3, 9), (9, None)]


def test_the_library_schemes_check_and_set_their_defaults():
    rerope = load(SCHEMES / "rerope.pe")
    assert rerope.params["reach"] == 32 and [(r.low, r.high) for r in rerope.remap.regimes] == [(0, 32), (32, None)]
    se = load(SCHEMES / "self_extend.pe", params={"factor": 16})
    # the paper's rule: (L0 - w) * G + w >= factor * L0 with the smallest group G
    L0, w, G = 128, se.params["neighbours"], se.params["group"]
    assert (L0 - w) * G + w >= 16 * L0 > (L0 - w) * (G - 1) + w
    leaky = load(SCHEMES / "leaky_rerope.pe", params={"factor": 16})
    reach, leak = leaky.params["reach"], leaky.params["leak"]
    assert reach + (16 * L0 - reach) / leak == pytest.approx(L0)


def test_dca_bounds_its_regimes_by_the_chunk_difference():
    dca = load(SCHEMES / "dca.pe")
    c = dca.params["chunk_size"] - dca.params["local_window"]
    assert (dca.params["chunk_size"], dca.params["local_window"], dca.remap.chunk) == (96, 8, 88) and c == 88
    assert [(r.low, r.high) for r in dca.remap.regimes] == [(0, 1), (1, 2), (2, None)]
    assert dca.remap.source().startswith("remap(chunk = 88) { chunks < 1: query = ")
    assert load(_scheme("remap(chunk = 3 * 4) { chunks >= 0: query = 1 }")).remap.chunk == 12


def test_a_child_replaces_what_it_inherits():
    text = _scheme("remap { distance < 4; distance >= 4: query = 4, key = 0 }", name="a") + \
        "scheme b extends a { remap { distance >= 0: query = position / 2, key = position / 2 } }\n"
    assert len(load(text, scheme="a").remap.regimes) == 2
    assert [(r.low, r.high) for r in load(text, scheme="b").remap.regimes] == [(0, None)]


@pytest.mark.parametrize("body, line, col, words", [
    ("remap { distance < 8; distance >= 4: key = 0 }", 3, 23, "overlap (distance 4 is in both)"),
    ("remap { distance < 8; distance >= 9: key = 0 }", 3, 23, "no regime covers distance 8"),
    ("remap { distance < 8; distance >= 12: key = 0 }", 3, 23, "distance 8 to 11"),
    ("remap { distance < 8 }", 3, 1, "distance 8 and above"),
    ("remap { distance >= 0; distance >= 5: key = 0 }", 3, 24, "overlap"),
    ("remap { }", 3, 1, "no regime"),
    ("remap { distance >= 3, distance < 3; distance >= 0 }", 3, 9, "covers no distance"),
    ("remap { position < 8; distance >= 8 }", 3, 9, "bounded by the distance"),
    ("remap { distance != 8 }", 3, 9, "a number known"),
    ("remap { distance < position; distance >= 0 }", 3, 9, "a number known"),
    ("remap { distance < 8; distance >= 8: query = distance }", 3, 46, "reads distance"),
    ("remap { distance < 8; distance >= 8: query = query_position }", 3, 46, "reads query_position"),
    ("remap { distance < 8; distance >= 8: key = n }", 3, 44, "reads n"),
    ("remap { distance < 8; distance >= 8: key = linear(x) }", 3, 44, "not a position per token"),
    ("remap { distance < 8; distance >= 8: key = learned(1.0) * position }", 3, 44, "not a position per token"),
    ("remap { distance < 8; distance >= 8: quary = 1 }", 3, 38, "did you mean 'query'"),
    ("remap { distance < 8; distance >= 8: key = 1, key = 2 }", 3, 47, "once each"),
    ("remap(chunk = 0) { chunks >= 0 }", 3, 15, "an int >= 1 known"),
    ("remap(chunk = 2.5) { chunks >= 0 }", 3, 15, "an int >= 1 known"),
    ("remap(chunk = position) { chunks >= 0 }", 3, 15, "an int >= 1 known"),
    ("remap(size = 4) { chunks >= 0 }", 3, 7, "takes the chunk length"),
    ("remap(chunk = 4) { distance < 3; distance >= 3 }", 3, 20, "bounded by the chunk difference"),
    ("remap { chunks < 1; chunks >= 1 }", 3, 9, "bounded by the distance"),
    ("remap(chunk = 4) { chunks < 1; chunks >= 2: query = 4 }", 3, 32, "no regime covers chunks 1"),
    ("remap(chunk = 4) { chunks < 2; chunks >= 1: query = 4 }", 3, 32, "overlap (chunks 1 is in both)"),
])
def test_bad_regimes_are_positioned_diagnostics(body, line, col, words):
    err = first_error(_scheme(body))
    assert err.code == "E243", err
    assert (err.line, err.col) == (line, col), err
    assert words in err.message and err.hint


@pytest.mark.parametrize("base, extra, words", [
    ("nope", "", "no rotation"),
    ("acc_random_qk", "", "accumulated transport"),
    ("path", "", "accumulated transport"),
    ("xpos", "", "xPos"),
    ("rope", "qkv: rotate(w * position)", "values (qkv)"),
    ("rope_2d", "", "several position axes"),
    ("rope", "normalize = stick_breaking", "softmax only"),
    ("rope", "contextual = cope(max_pos = 4)", "softmax only"),
    ("rope", "normalize = sigmoid", "softmax only"),
    ("rope", "normalize = softmax1", "softmax only"),
    ("rope", "mask = bidirectional", "keys after the query"),
    ("rope", "mask = prefix(4)", "keys after the query"),
])
def test_transports_without_a_union_of_regimes_are_refused(base, extra, words):
    if not (SCHEMES / f"{base}.pe").exists():
        pytest.fail(f"library scheme {base} is gone: pick another of its kind")
    err = first_error(_scheme(f"{extra}\nremap {{ distance < 4; distance >= 4: query = 4, key = 0 }}", base=base))
    assert err.code == "E243" and words in err.message, err


def test_format_is_canonical_and_keeps_the_regimes():
    text = _scheme("remap {distance<8 ;distance>=8:query=8,key=0}")
    out = format(text)
    assert "  remap {\n    distance < 8\n    distance >= 8: query = 8, key = 0\n  }\n" in out
    assert format(out) == out and load(out).remap.source() == load(text).remap.source()
    text = _scheme("remap(chunk=4){chunks<1;chunks>=1:query=4}")
    assert "  remap(chunk = 4) {\n    chunks < 1\n    chunks >= 1: query = 4\n  }\n" in format(text)
    for name in ("rerope", "leaky_rerope", "self_extend", "dca"):
        src = (SCHEMES / f"{name}.pe").read_text()
        assert format(src) == src


def test_show_explain_graph_and_diff_name_it():
    path = str(SCHEMES / "self_extend.pe")
    code, out, err = run_cli("show", path)
    assert code == 0 and "remap: distance < neighbours; distance >= neighbours: query = floor(" in out, err
    code, out, err = run_cli("graph", path)
    assert code == 0 and "remapped positions, carried as one rotated score block per regime" in out, err
    code, out, err = run_cli("diff", str(SCHEMES / "rope.pe"), str(SCHEMES / "rerope.pe"))
    assert code == 1 and "+ remap = remap { distance < reach; distance >= reach: query = reach, key = 0 }" in out, err
    code, out, err = run_cli("explain", path)
    assert code == 0 and "positions remapped per distance regime" in out, err
    code, out, err = run_cli("graph", str(SCHEMES / "dca.pe"))
    assert code == 0 and "one rotated score block per regime of the chunk difference (chunk = 88)" in out, err


def test_export_hf_compile_and_raw_scores_refuse_it(tmp_path):
    with pytest.raises(PedslError, match="remapped per distance regime"):
        export_rope(load(SCHEMES / "rerope.pe"))
    code, out, err = run_cli("compile", str(SCHEMES / "rerope.pe"), "-o", str(tmp_path / "out"))
    assert code == 1 and "E400" in err and "does not generate" in err and "Traceback" not in err
    mod = compile_scheme((SCHEMES / "rerope.pe").read_text(), num_heads=2, head_dim=8)
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(PedslError, match="no single rotation"):
        mod.raw_scores(q, q)
