"""`pedsl compare --study grid` (pedsl.study.grid) end to end at a tiny budget, its attention maps
against the module's own attention matrix, its data-driven scheme list, its executor units and the
options it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from compiler_helpers import F32_EPS, float32_bound, run_cli
from pedsl.data import grids
from pedsl.study import parallel
from pedsl.study.common import open_run
from pedsl.study.grid import measure as gm
from pedsl.study.grid import run as gr

SETS = {"context": 16, "batch_size": 2, "n_layers": 1, "d_model": 16, "n_heads": 2, "eval_every": 3,
        "eval_batches": 1, "warmup": 1, "sizes": "4,6"}
TINY = ["--steps", "3", "--windows", "1", "--threads", "1", "-q", *[a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "study"
    code, stdout, err = run_cli("compare", "--study", "grid", "rope", "alibi", "--out", out, "--seeds", "0,1", *TINY)
    assert code == 0, err
    return out, stdout


def test_study_writes_its_report_and_numbers(study):
    out, stdout = study
    assert "Accuracy on the determined cells vs grid side" in stdout
    res = json.loads((out / "results.json").read_text())
    assert set(res["results"]) == {"rope", "alibi"}
    meta = res["meta"]
    assert meta["sizes"] == [4, 6] and meta["train_side"] == 4 and meta["seeds"] == [0, 1]
    for name in ("rope", "alibi"):
        spread = res["results"][name]["spread"]["6"]["accuracy"]
        per_seed = [json.loads((out / "runs" / name / f"seed{s}" / "grid.json").read_text()) for s in (0, 1)]
        accs = [g["sizes"]["6"]["accuracy"] for g in per_seed]
        assert spread["n"] == 2 and spread["min"] == min(accs) and spread["max"] == max(accs)
        g = per_seed[0]
        assert set(g["maps"]) == {"4", "6"}                        # the training side and the largest
        row = g["maps"]["6"][0][0]
        t = gm.query_index(6)
        assert len(row) == 36 and all(v is None for v in row[t:]) and all(v is not None for v in row[:t])
        # a float32 softmax row (a score over D channels, then t + 1 keys) sums to 1 within (t + 1 + D) eps32;
        # grid.json rounds each of its t + 1 weights to 6 decimals (half a unit each)
        D = SETS["d_model"] // SETS["n_heads"]
        bound = (t + 1) * 0.5e-6 + (t + 1 + D) * F32_EPS
        assert abs(sum(row[:t]) + g["start"]["6"][0][0] - 1.0) <= bound
    md = (out / "report.md").read_text()
    for f in ("accuracy.png", "ppl.png", "attention_rope.png", "attention_alibi.png", "loss_curves.png"):
        assert (out / f).is_file() and f in md
    assert "(n.s.)" in md or "]" in md


def test_rerun_reuses_every_run_and_measure(study):
    out, _ = study
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/grid.json")}
    code, _, err = run_cli("compare", "--study", "grid", "rope", "alibi", "--out", out, "--seeds", "0,1",
                           *[a for a in TINY if a != "-q"])
    assert code == 0, err
    assert "reusing the finished run" in err and "reusing grid.json" in err and "training" not in err
    assert before == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/grid.json")}


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_query_row_is_the_modules_attention_row(study, name):
    """The maps read the module's forward with one-hot values; the same row from its materialised
    attention matrix (probs) of the full sequence."""
    out, _ = study
    model, cfg, _ = open_run(out / "runs" / name / "seed0")
    tokens = grids.image_batch(1, 6, 6, g=torch.Generator().manual_seed(0))["tokens"][:, :30]
    cap = model.capture(tokens)[0]
    pe = model.blocks[0].attn.pe
    row = gm.query_row(pe, cap, None)[0]                              # (H, 30)
    full = pe.probs(cap["q"], cap["k"])[0, :, -1].double()            # (H, 30)
    # two float32 computations of the same weights, each within float32's rounding of a score over D channels
    # and a softmax and weighted sum over the 30 keys
    D = cap["q"].shape[-1]
    torch.testing.assert_close(row, full, atol=2 * float32_bound(2 * 30 + D, full), rtol=0)


def test_candidates_join_when_they_load(monkeypatch, tmp_path):
    (tmp_path / "later.pe").write_text("scheme later {\n  axis_that_does_not_exist h\n}\n")
    monkeypatch.setattr(gr, "CANDIDATES", (gr.Candidate("rope", "rope", "1-D"),
                                           gr.Candidate("later", str(tmp_path / "later.pe"), "not yet"),
                                           gr.Candidate("nothere", "no_such_library_scheme", "missing")))
    items, skipped = gr.study_schemes([])
    assert items == ["rope"] and set(skipped) == {"later", "nothere"}
    assert "no_such_library_scheme" in skipped["nothere"]
    assert gr.study_schemes(["alibi"]) == (["alibi"], {})              # named schemes are never filtered
    assert gr.study_schemes(["later"]) == ([str(tmp_path / "later.pe")], {})  # a candidate by its name


def test_units_are_the_runs_of_the_study(monkeypatch):
    monkeypatch.setattr(gr, "CANDIDATES", (gr.Candidate("rope", "rope", "1-D"), gr.Candidate("alibi", "alibi", "b")))
    units = parallel.grid_units([], "out", seeds=None, steps=3)
    assert [u.label for u in units] == [f"{n} seed {s}" for s in gr.SEEDS for n in ("rope", "alibi")]
    assert all(u.kwargs["steps"] == 3 for u in units)


@pytest.mark.parametrize("args,needle", [
    (("--lengths", "16"), "--lengths"),
    (("--analyze-max", "64"), "--analyze-max"),
    (("--data", "stdlib"), "grid task"),
    (("--set", "seed=3"), "--set seed"),
    (("--set", "sizes=1"), "sizes"),
])
def test_refused(args, needle, tmp_path):
    code, _, err = run_cli("compare", "--study", "grid", "rope", "--out", tmp_path / "s", *args)
    assert code == 2 and needle in err, err
    assert not (tmp_path / "s" / "runs").exists()


def test_a_study_with_every_candidate_left_out_is_refused_not_a_traceback(tmp_path):
    from pedsl.errors import UsageError
    from pedsl.study.candidates import train_each

    with pytest.raises(UsageError, match="no scheme to train"):
        train_each([], tmp_path, [0], {}, key="grid", measured=lambda run, done: {}, preset="tiny", steps=1,
                   say=lambda m: None, quiet=True)
