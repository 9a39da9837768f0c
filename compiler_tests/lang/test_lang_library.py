"""The scheme library (schemes/*.pe): every file parses, loads, checks clean, is canonical,
and resolves to the structure its scheme is meant to have."""

from __future__ import annotations

import math

import pytest

from lang_helpers import LIBRARY, SCHEMES
from pedsl.lang.api import check, format, load, parse
from pedsl.lang.frequencies import rotary_frequencies

# name -> (groups with sizes, transports (kind, targets, group), bias kinds, temperature?, bases)
EXPECTED = {
    "nope": ({"all": 32}, [], [], False, ()),
    "rope": ({"all": 32}, [("rotate", "qk", "all")], [], False, ()),
    "rope_interleaved": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_partial": ({"rot": 8, "plain": 24}, [("rotate", "qk", "rot")], [], False, ("rope",)),
    "rope_local": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_chunked": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_sink": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_sink_token": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_sigmoid": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_softmax1": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_differential": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "pi": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "ntk": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "dynamic_ntk": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "yarn": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rerope": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "leaky_rerope": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "self_extend": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "dca": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "yarn_wavelength": ({"all": 32}, [("rotate", "qk", "all")], [], True, ("rope",)),
    "llama3": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "longrope": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "rope_id": ({"rot": 16, "plain": 16}, [("rotate", "qk", "rot")], [], True, ()),
    "rope_accumulated": ({"all": 32}, [("accumulate_rotation", "qk", "all")], [], False, ("rope",)),
    "alibi": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "fox": ({"all": 32}, [], ["gate"], False, ("nope",)),
    "path": ({"all": 32}, [("accumulate_householder", "qk", "all")], [], False, ("nope",)),
    "path_fox": ({"all": 32}, [("accumulate_householder", "qk", "all")], ["gate"], False, ("path", "nope")),
    "path_fox_fla": ({"all": 32}, [("accumulate_householder", "qk", "all")], ["gate"], False,
                     ("path_fox", "path", "nope")),
    "acc_random_qk": ({"all": 32}, [("accumulate_rotation", "qk", "all")], [], False, ("nope",)),
    "acc_random_qkv": ({"all": 32}, [("accumulate_rotation", "qkv", "all")], [], False, ("acc_random_qk", "nope")),
    "acc_random_position": ({"all": 32}, [("accumulate_rotation", "qk", "all")], [], False,
                            ("acc_random_qk", "nope")),
    "acc_learned_qk": ({"all": 32}, [("accumulate_rotation", "qk", "all")], [], False, ("nope",)),
    "acc_learned_qkv": ({"all": 32}, [("accumulate_rotation", "qkv", "all")], [], False, ("nope",)),
    "rope_id_alibi": ({"rot": 16, "plain": 16}, [("rotate", "qk", "rot")], ["distance"], True, ("rope_id",)),
    "acc_random_alibi": ({"all": 32}, [("accumulate_rotation", "qk", "all")], ["distance"], False,
                         ("acc_random_qk", "nope")),
    "xpos": ({"all": 32}, [("rotate", "qk", "all")], [], False, ()),
    "stick_breaking": ({"all": 32}, [], [], False, ()),
    "alibi_learned": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "alibi_partial": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "dynamic_position_bias": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "fire": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "kerple_log": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "kerple_power": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "sandwich": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "t5_bias": ({"all": 32}, [], ["distance"], False, ("nope",)),
    "cope": ({"all": 32}, [], [], False, ("nope",)),
    "shaw": ({"all": 32}, [], [], False, ("nope",)),
    "transformer_xl": ({"all": 32}, [], [], False, ("nope",)),
    "deberta_v2": ({"all": 32}, [], [], False, ("nope",)),
    "mrope": ({"all": 32}, [("rotate", "qk", "all")], [], False, ()),
    "mrope_interleaved": ({"all": 32}, [("rotate", "qk", "all")], [], False, ()),
    "rope_2d": ({"row": 16, "col": 16}, [("rotate", "qk", "row"), ("rotate", "qk", "col")], [], False, ()),
    "rope_3d": ({"time": 8, "row": 12, "col": 12},
                [("rotate", "qk", "time"), ("rotate", "qk", "row"), ("rotate", "qk", "col")], [], False, ()),
    "rope_mixed": ({"first": 16, "second": 16}, [("rotate", "qk", "first"), ("rotate", "qk", "second")], [], False,
                   ()),
    "alibi_2d": ({"all": 32}, [], ["distance"], False, ()),
    # bidirectional encoders and a prefix-LM (the mask statement)
    "liere": ({"all": 32}, [("dense_rotation", "qk", "all")], [], False, ()),
    "comrope": ({"all": 32}, [("dense_rotation", "qk", "all")], [], False, ()),
    "comrope_ap": ({"all": 32}, [("dense_rotation", "qk", "all")], [], False, ("comrope",)),
    "string": ({"all": 32}, [("dense_rotation", "qk", "all")], [], False, ()),
    "rope_2d_encoder": ({"row": 16, "col": 16}, [("rotate", "qk", "row"), ("rotate", "qk", "col")], [], False,
                        ("rope_2d",)),
    "rope_mixed_encoder": ({"first": 16, "second": 16}, [("rotate", "qk", "first"), ("rotate", "qk", "second")], [],
                           False, ("rope_mixed",)),
    "alibi_2d_encoder": ({"all": 32}, [], ["distance"], False, ("alibi_2d",)),
    "prefix_lm": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "t5_encoder": ({"all": 32}, [], ["distance"], False, ()),
    "modernbert_global": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "modernbert_local": ({"all": 32}, [("rotate", "qk", "all")], [], False, ("rope",)),
    "pixtral_vision": ({"row": 16, "col": 16}, [("rotate", "qk", "row"), ("rotate", "qk", "col")], [], False, ()),
    "qwen2_vl_vision": ({"row": 16, "col": 16}, [("rotate", "qk", "row"), ("rotate", "qk", "col")], [], False, ()),
    "video_rope": ({"row": 12, "col": 12, "time": 8},
                   [("rotate", "qk", "row"), ("rotate", "qk", "col"), ("rotate", "qk", "time")], [], False, ()),
}
# Schemes of several position axes train on grids: their training length is a grid's token count (16 x 16,
# 8 x 8 x 8 frames), and they are evaluated at grid sizes, not at token lengths (no eval block).
GRID_LENGTH = {"rope_2d": 256, "rope_3d": 512, "rope_mixed": 256, "alibi_2d": 256, "rope_2d_encoder": 256,
               "rope_mixed_encoder": 256, "alibi_2d_encoder": 256, "pixtral_vision": 256, "qwen2_vl_vision": 256,
               "liere": 256, "comrope": 256, "comrope_ap": 256, "string": 256}


def test_library_is_what_the_issue_lists():
    names = {p.stem for p in LIBRARY}
    assert set(EXPECTED) == names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_file_declares_one_scheme_named_like_it(path):
    module = parse(path)
    assert [d.name for d in module.schemes] == [path.stem]
    assert module.schemes[0].doc, "every library scheme has a one-line description"
    assert module.comments, "every library file is commented"
    assert len(path.read_text().splitlines()) <= 30, "library files stay small"


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_file_checks_clean_and_is_canonical(path):
    diags = check(path)
    assert diags == [], [d.render() for d in diags]
    assert format(path) == path.read_text()


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_structure(path):
    groups, transports, biases, temperature, bases = EXPECTED[path.stem]
    s = load(path)
    assert s.name == path.stem
    assert {g.name: len(g.channels) for g in s.groups} == groups
    assert [(t.kind, t.targets, t.group) for t in s.transports] == transports
    assert [b.kind for b in s.biases] == biases
    assert (s.temperature is not None) == temperature
    assert s.bases == bases
    length = GRID_LENGTH.get(path.stem, 128)
    assert s.train == {"context": length}
    assert s.params["train_length"] == length
    if s.axes:
        assert s.eval == {}
    else:
        assert s.eval == {"lengths": [128, 256, 512, 1024, 2048, 4096]}


def test_rope_details():
    s = load(SCHEMES / "rope.pe")
    assert s.layout == "halves" and s.params["base"] == 10000.0
    assert s.allow == ("frayed_frequencies",)
    assert load(SCHEMES / "rope_interleaved.pe").layout == "interleaved"
    freqs = rotary_frequencies(s)["all"]
    assert freqs == pytest.approx([10000 ** (-2 * k / 32) for k in range(16)], rel=1e-12)


def test_xpos_details():
    s = load(SCHEMES / "xpos.pe")
    (t,) = s.transports
    assert s.layout == "interleaved" and (t.xpos_gamma, t.xpos_zeta) == (512.0, 0.4) and t.scale == 1.0
    assert rotary_frequencies(s)["all"] == pytest.approx([10000 ** (-2 * k / 32) for k in range(16)], rel=1e-12)


def test_rope_id_details():
    s = load(SCHEMES / "rope_id.pe")
    assert s.layout == "halves"
    assert s.group("rot").channels == tuple(range(0, 8)) + tuple(range(16, 24))
    assert s.group("plain").channels == tuple(range(8, 16)) + tuple(range(24, 32))
    assert s.allow == ()  # RoPE-ID does not fray: the lint is active and silent
    w = rotary_frequencies(s)["rot"]
    assert len(w) == 8
    assert 2 * math.pi / max(w) == pytest.approx(32)
    assert min(w) * 128 / (2 * math.pi) == pytest.approx(2)  # two full cycles in the training length
    assert s.temperature.kind == "call" and s.temperature.func == "log_length"


def test_rope_partial_fraction():
    s = load(SCHEMES / "rope_partial.pe")
    assert s.group("rot").channels == tuple(range(8))
    assert load(SCHEMES / "rope_partial.pe", {"rotated": 0.5}).group("rot").channels == tuple(range(16))


def test_value_transports_and_flags():
    assert load(SCHEMES / "acc_random_qkv.pe").value_transport
    assert not load(SCHEMES / "acc_random_qk.pe").value_transport
    t = load(SCHEMES / "acc_random_qk.pe").transports[0]
    assert t.data and not t.learned
    t = load(SCHEMES / "acc_random_position.pe").transports[0]
    assert not t.data and not t.learned
    t = load(SCHEMES / "acc_learned_qk.pe").transports[0]
    assert t.data and t.learned
    s = load(SCHEMES / "acc_learned_qkv.pe")
    assert s.needs_x and s.value_transport
    assert load(SCHEMES / "acc_learned_qk.pe").needs_tokens
    p = load(SCHEMES / "path.pe").transports[0]
    assert not p.orthogonal
    assert load(SCHEMES / "dynamic_ntk.pe").transports[0].dynamic
    assert not load(SCHEMES / "ntk.pe").transports[0].dynamic


def test_alibi_slope_is_extracted():
    b = load(SCHEMES / "alibi.pe").biases[0]
    assert b.slope is not None
    from pedsl.lang.exprs import to_source

    assert to_source(b.slope) == "-slopes(heads)"


def test_library_loads_with_other_lengths():
    for path in LIBRARY:
        s = load(path, {"train_length": 512})
        assert s.train["context"] == 512
        assert s.axes or s.eval["lengths"][-1] == 512 * 32


def test_longrope_needs_16_pairs():
    from pedsl.errors import CheckError

    with pytest.raises(CheckError) as info:
        load(SCHEMES / "longrope.pe", head_dim=64)
    assert info.value.code == "E217" and "16 values for 32 rotary pairs" in str(info.value)


def test_language_reference_documents_every_code_and_lint():
    """docs/language.md documents every code the front end raises and every lint (its generated tables
    are checked by test_doc_tables.py)."""
    import re

    from pedsl.lang.builtins import WARNINGS

    text = (SCHEMES.parent / "docs" / "language.md").read_text()
    root = SCHEMES.parent / "pedsl"
    codes = set()
    for py in [*(root / "lang").glob("*.py"), root / "cli" / "frontend.py"]:
        codes |= set(re.findall(r'"([EW]\d{3})"', py.read_text()))
    codes -= {"E100", "E200", "E300"}  # the stage defaults, never raised bare
    missing = sorted(c for c in codes if f"| {c} |" not in text)
    assert not missing, f"undocumented diagnostics: {missing}"
    for name in WARNINGS:
        assert f"`{name}`" in text


def test_allowed_fraying_is_real_and_rope_id_does_not_fray():
    """Every scheme that allows frayed_frequencies does fray (the allow hides a true W101),
    and RoPE-ID, which does not allow it, has no pair slower than the training length."""
    for path in LIBRARY:
        s = load(path)
        if s.axes and s.bases and s.transports == load(SCHEMES / f"{s.bases[0]}.pe").transports:
            continue  # an encoder of a grid scheme: the allow (and the rotation) is its base's, checked there
        if s.axes:  # fraying along each axis: a W101 per axis once the allow is taken away
            text = path.read_text().replace("allow frayed_frequencies", "")
            frays = any(d.code == "W101" for d in check(text))
            assert frays == ("frayed_frequencies" in s.allow), path.stem
            continue
        slow = sum(2 * math.pi / w > s.train["context"] for f in rotary_frequencies(s).values() for w in f if w > 0)
        if "frayed_frequencies" in s.allow:
            assert slow > 0, path.stem
        elif path.stem.startswith("rope"):
            assert slow == 0, path.stem
