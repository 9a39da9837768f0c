"""pedsl.diff: exact edit lists between library schemes, renames, layout-only changes.

Like sqlglot's tests of ``diff.py``: every expected edit script is spelled out in full,
so a change to the matching or the paths shows up as a precise failure.
"""

from __future__ import annotations

import functools
import itertools

import pytest

import pedsl
from pedsl.diffing.edits import Insert, Keep, Move, Remove, Update, diff, equivalent, is_semantic
from compiler_helpers import SCHEMES

LIB = sorted(p.stem for p in SCHEMES.glob("*.pe"))


@functools.lru_cache(maxsize=None)
def _load(name: str):
    return pedsl.load(SCHEMES / f"{name}.pe")


def d(a: str, b: str, **kw):
    return diff(_load(a), _load(b), **kw)


def test_rope_vs_pi():
    assert d("rope", "pi") == [
        Update("name", "rope", "pi"),
        Update("doc", "Rotary position embedding (Su et al.), halves layout",
               "Position interpolation: RoPE at position / factor"),
        Insert("params.factor", 4.0),
        Update("transport[all].phase", "geometric(base) * position", "geometric(base) * position / factor"),
    ]


def test_rope_vs_rope_id():
    assert d("rope", "rope_id") == [
        Update("name", "rope", "rope_id"),
        Update("doc", "Rotary position embedding (Su et al.), halves layout",
               "RoPE-ID: span grid on half the channels, log-length temperature"),
        Remove("params.base", 10000.0),
        Remove("channels.all", "all: channels 0-31"),
        Insert("channels.rot", "quarters(1, 3): channels 0-7, 16-23"),
        Insert("channels.plain", "rest: channels 8-15, 24-31"),
        Move("transport[all]", "transport[rot]"),
        Update("transport[rot].phase", "geometric(base) * position",
               "span(train_length, cycles = 2, period = 32) * position"),
        Insert("temperature", "log_length(train_length)"),
        Remove("allow", "frayed_frequencies"),
    ]


def test_acc_random_qk_vs_qkv():
    assert d("acc_random_qk", "acc_random_qkv") == [
        Update("name", "acc_random_qk", "acc_random_qkv"),
        Update("doc", "Accumulated random SO(2) rotations of q and k (frozen token table)",
               "Accumulated random SO(2) rotations of q, k and v"),
        Update("transport[all].targets", "qk", "qkv"),
    ]


def test_path_vs_path_fox():
    assert d("path", "path_fox") == [
        Update("name", "path", "path_fox"),
        Update("doc", "PaTH: accumulated data-dependent Householder transport", "PaTH with a forget gate (PaTH-FoX)"),
        Insert("bias[gate]", "accumulate(log_sigmoid(linear(x, to = head, init_bias = 3)))"),
    ]


def test_alibi_vs_rope_id_alibi():
    assert d("alibi", "rope_id_alibi") == [
        Update("name", "alibi", "rope_id_alibi"),
        Update("doc", "ALiBi: per-head linear distance bias", "RoPE-ID plus ALiBi distance bias"),
        Remove("channels.all", "all: channels 0-31"),
        Insert("channels.rot", "quarters(1, 3): channels 0-7, 16-23"),
        Insert("channels.plain", "rest: channels 8-15, 24-31"),
        Insert("transport[rot]", "qk: rotate(span(train_length, cycles = 2, period = 32) * position)"),
        Insert("temperature", "log_length(train_length)"),
    ]


def test_kind_change_is_granular():
    assert d("acc_random_qk", "path")[2:] == [
        Update("transport[all].kind", "accumulate_rotation", "accumulate_householder"),
        Remove("transport[all].angle", "logspace(1.0, sqrt(8 / train_length)) * frozen_random(token, seed = 0)"),
        Insert("transport[all].w", "normalize(shortconv(linear(x, to = channel, rank = 16)))"),
        Insert("transport[all].beta", "2 * sigmoid(linear(x, to = head))"),
    ]
    assert d("rope", "rope_accumulated")[2:] == [
        Update("transport[all].kind", "rotate", "accumulate_rotation"),
        Remove("transport[all].phase", "geometric(base) * position"),
        Insert("transport[all].angle", "geometric(base)"),
    ]


def test_partial_rope_moves_the_transport_not_the_group():
    # 'all' (rotated) must not be matched to 'plain' (not rotated) just because they share channels
    assert d("rope", "rope_partial")[2:] == [
        Insert("params.rotated", 0.25),
        Remove("channels.all", "all: channels 0-31"),
        Insert("channels.rot", "fraction(rotated): channels 0-7"),
        Insert("channels.plain", "rest: channels 8-31"),
        Move("transport[all]", "transport[rot]"),
    ]


def test_biases_pair_by_kind():
    assert d("acc_random_qk", "acc_random_alibi")[2:] == [Insert("bias[distance]", "-slopes(heads) * distance")]
    assert d("fox", "alibi")[2:] == [
        Remove("bias[gate]", "accumulate(log_sigmoid(linear(x, to = head, init_bias = 3)))"),
        Insert("bias[distance]", "-slopes(heads) * distance"),
    ]


def test_reformatted_file_has_no_edits():
    src = (SCHEMES / "rope.pe").read_text()
    messy = (src.replace("\n  ", "\n        ").replace("qk: rotate(w * position)", "qk :rotate(  w*position )  # why not")
             .replace("= 10000.0", "=10000.0   # the usual base").replace("# RoPE (Su", "#  a different comment\n# RoPE (Su"))
    assert messy != src
    assert diff(src, messy) == []
    assert diff(src, pedsl.format(src)) == []


def test_let_names_do_not_matter():
    src = (SCHEMES / "rope.pe").read_text()
    other = src.replace("let w = geometric(base)", "let freqs = geometric(base)").replace("w * position", "freqs * position")
    assert diff(src, other) == []


def test_renamed_parameter_is_one_move():
    src = (SCHEMES / "rope.pe").read_text()
    renamed = src.replace("base", "theta")
    assert diff(src, renamed) == [Move("params.base", "params.theta")]
    # renamed and changed: the move plus one update of the value; expressions still match modulo the rename
    changed = renamed.replace("10000.0", "500.0")
    assert diff(src, changed) == [Move("params.base", "params.theta"), Update("params.theta", 10000.0, 500.0)]


def test_renamed_parameter_used_in_a_channel_spec():
    src = (SCHEMES / "rope_partial.pe").read_text().replace('import "rope.pe"', f'import "{SCHEMES / "rope.pe"}"')
    other = src.replace("rotated", "share")
    assert diff(src, other) == [
        Update("doc", "Partial RoPE: a quarter of the channels rotated, the rest NoPE",
               "Partial RoPE: a quarter of the channels share, the rest NoPE"),
        Move("params.rotated", "params.share"),
    ]


def test_renamed_group_is_one_move():
    src = (SCHEMES / "rope_id.pe").read_text()
    other = src.replace("rot = quarters", "turned = quarters").replace("qk on rot", "qk on turned")
    assert diff(src, other) == [Move("channels.rot", "channels.turned")]


def test_param_overrides_are_resolved():
    a = pedsl.load(SCHEMES / "rope.pe")
    b = pedsl.load(SCHEMES / "rope.pe", params={"base": "500", "train_length": "256"})
    assert diff(a, b) == [
        Update("params.base", 10000.0, 500.0),
        Update("params.train_length", 128, 256),
        Update("train.context", 128, 256),
        Update("eval.lengths", [128, 256, 512, 1024, 2048, 4096], [256, 512, 1024, 2048, 4096, 8192]),
    ]


def test_keep_lists_the_unchanged():
    edits = d("rope", "pi", keep=True)
    assert Keep("params.base", 10000.0) in edits
    assert Keep("layout", "halves") in edits
    assert [e for e in edits if not isinstance(e, Keep)] == d("rope", "pi")


def test_equivalence_ignores_metadata():
    src = (SCHEMES / "rope.pe").read_text()
    other = src.replace('"Rotary position embedding (Su et al.), halves layout"', '"RoPE"')
    edits = diff(src, other)
    assert edits == [Update("doc", "Rotary position embedding (Su et al.), halves layout", "RoPE")]
    assert equivalent(edits) and not is_semantic(edits[0])
    assert not equivalent(d("rope", "pi"))


def test_public_api_is_callable_after_importing_the_implementation():
    import pedsl.diffing.edits  # noqa: F401 - importing the implementation must not shadow pedsl.diff

    assert callable(pedsl.diff)
    assert pedsl.diff(SCHEMES / "rope.pe", SCHEMES / "rope.pe") == []


@pytest.mark.parametrize("a,b", list(itertools.permutations(["nope", "rope", "rope_id", "pi", "path", "fox",
                                                                 "acc_learned_qkv", "longrope", "dynamic_ntk"], 2)))
def test_every_pair_diffs_and_self_diff_is_empty(a, b):
    edits = d(a, b)
    assert edits and all(isinstance(e, (Insert, Remove, Move, Update)) for e in edits)
    assert d(a, a) == []
    paths = [e.path for e in edits if not (isinstance(e, (Insert, Remove)) and e.path == "allow")]
    assert len(paths) == len(set(paths)), edits


def test_library_schemes_diff_against_themselves_reloaded():
    for name in LIB:
        s = pedsl.load(SCHEMES / f"{name}.pe")
        assert diff(s, pedsl.load(s.source, scheme=name) if "import" not in s.source else s) == []
