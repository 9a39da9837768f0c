"""`pedsl profile`: the MI estimator against a loop reference, the null, the width on the block
task, the self-similarity check on sources with known structure, --suggest, and bad inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pedsl.cli import main
from pedsl.profile import mi as M
from pedsl.profile import sources as S


def cli(*args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.parametrize("r", [1, 2, 5])
def test_mi_matches_loop_reference(r):
    rng = np.random.default_rng(r)
    x = rng.integers(0, 7, 400)
    x[r:] = np.where(rng.random(400 - r) < 0.5, x[:-r], x[r:])  # some dependency at distance r
    plug, mm = M.mi_plugin_reference(x.tolist(), r)
    assert plug > mm > 0.05  # the correction removes the plug-in estimate's upward bias
    assert M.mi_at(x, 7, r) == pytest.approx(mm, abs=1e-12)
    # the circular pairing is the same estimator on the wrapped pairs
    xr = np.concatenate([x, x[:r]])
    assert M.mi_shift(x, 7, r) == pytest.approx(M.mi_plugin_reference(xr.tolist(), r)[1], abs=1e-12)


def test_distance_grid():
    r = M.distance_grid(1000, dense=64, per_octave=8)
    assert list(r[:64]) == list(range(1, 65)) and r[-1] == 1000 and np.all(np.diff(r) > 0)
    assert list(M.distance_grid(5)) == [1, 2, 3, 4, 5]


def test_iid_bytes_have_no_dependency():
    x = S.synthetic("iid", 200_000, seed=3)
    p = M.mi_profile(x.astype(np.int64), 256, M.distance_grid(256), seed=1)
    z = p.excess / p.null_std
    assert np.abs(z).max() < M.Z_SIGNIFICANT  # below the null's spread at every distance, both ways
    assert not p.significant.any() and p.width() is None
    assert abs(p.null_mean) < 3 * p.null_std  # Miller-Madow leaves no bias the null could see
    assert abs(p.permutation_mean - p.null_mean) < 3 * p.null_std  # i.i.d.: both nulls agree


@pytest.mark.parametrize("B", [8, 16, 32, 64])
def test_block_task_width(B):
    x = S.synthetic("blocks", 300_000, block_len=B, seed=B)
    p = M.mi_profile(x.astype(np.int64), 256, M.distance_grid(256), seed=0)
    assert abs(p.width() - (B - 1)) <= 0.2 * (B - 1)
    assert p.significant[p.r == B - 1].all()


def _profiles(x):
    return [M.mi_profile(*S.coarse(x, g, 256)[:2], M.distance_grid(512), name=str(g), scale=g) for g in (1, 2, 4)]


def test_self_similar_source_passes_fixed_offset_fails():
    tree = M.self_similarity(_profiles(S.synthetic("tree", 400_000, seed=1)))
    assert tree["self_similar"] is True and tree["beta"] < 0.35
    off = M.self_similarity(_profiles(S.synthetic("offset", 400_000, seed=1)))
    assert off["self_similar"] is False and off["beta"] > 0.8
    iid = M.self_similarity(_profiles(S.synthetic("iid", 100_000, seed=1)))
    assert iid["self_similar"] is None


def test_shape_overlap_is_a_histogram_intersection():
    assert M.overlap({0: 0.5, 1: 0.5}, {0: 0.5, 1: 0.5}) == pytest.approx(1.0)
    assert M.overlap({0: 1.0}, {2: 1.0}) == 0.0
    assert M.overlap({0: 0.75, 1: 0.25}, {0: 0.25, 1: 0.75}) == pytest.approx(0.5)


def test_cli_blocks_suggest_checks_and_round_trips(tmp_path, capsys):
    pe = tmp_path / "fit.pe"
    code, out, err = cli("profile", "blocks", "--block-len", "32", "--max-bytes", "100000", "--max-distance", "128",
                         "--out", tmp_path / "p", "--suggest", pe, "-q", capsys=capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert res["width_bytes"] == 31 and (tmp_path / "p" / "profile.png").stat().st_size > 1000
    law = res["law"]
    assert law["theta_star"] == pytest.approx(math.pi / 31)
    # theta* lies inside the suggested grid, whose lowest frequency completes one cycle in training
    assert law["w_low"] == pytest.approx(2 * math.pi / 128) and law["w_low"] <= law["theta_star"] <= law["w_high"]
    code, out, err = cli("check", "--strict", pe, capsys=capsys)
    assert code == 0, out + err
    code, out, err = cli("fmt", "--check", pe, capsys=capsys)
    assert code == 0, out + err
    import pedsl

    s = pedsl.load(pe)
    freqs = [f for fs in __import__("pedsl.lang.lint", fromlist=["x"]).rotary_frequencies(s).values() for f in fs]
    assert min(freqs) == pytest.approx(law["w_low"]) and max(freqs) == pytest.approx(law["w_high"], rel=1e-3)


def test_cli_json_and_text_data(tmp_path, capsys):
    f = tmp_path / "t.txt"
    rng = np.random.default_rng(0)
    names = ["alpha", "beta", "x", "total", "n"]
    f.write_text("".join(f"{names[a]} = {names[b]} + {c}\n" for a, b, c in rng.integers(0, 5, (3000, 3))))
    code, out, err = cli("profile", f, "--out", tmp_path / "o", "--max-distance", "64", "--json", capsys=capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["width_bytes"] is not None and [p["name"] for p in res["profiles"]][0] == "bytes"


@pytest.mark.parametrize("case", ["missing", "empty", "short", "out_is_file", "suggest_dir", "bad_gran",
                                  "compare_untrainable", "compare_without_suggest"])
def test_bad_inputs_are_diagnostics(case, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    short = tmp_path / "short.txt"
    short.write_bytes(b"abc" * 100)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = {"missing": [tmp_path / "nope.txt"], "empty": [empty], "short": [short],
            "out_is_file": ["iid", "--out", blocker / "sub"],
            "suggest_dir": ["iid", "--out", tmp_path / "o", "--suggest", tmp_path / "no" / "s.pe"],
            "bad_gran": ["iid", "--granularities", "1,x"],
            "compare_untrainable": ["iid", "--out", tmp_path / "o", "--suggest", tmp_path / "s.pe",
                                    "--compare", tmp_path / "c"],
            "compare_without_suggest": ["iid", "--out", tmp_path / "o", "--compare", tmp_path / "c"]}[case]
    code, out, err = cli("profile", *args, "--max-bytes", "5000", capsys=capsys)
    assert code in (1, 2) and "Traceback" not in err and "internal error" not in err
    assert code == (2 if case in ("bad_gran", "compare_untrainable", "compare_without_suggest") else 1)
    assert "error" in err
