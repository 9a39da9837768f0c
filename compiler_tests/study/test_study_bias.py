"""`pedsl compare --study bias`: the claims table judged from min-max ranges (synthetic spreads with known
answers), the study's defaults (its schemes, seeds 0, 1, 2, its budget), one end-to-end run at a toy
budget, and its bad input as usage errors."""

from __future__ import annotations

import json

import pytest
import yaml

from compiler_helpers import run_cli
from pedsl.study import parallel
from pedsl.study.bias import recipe
from pedsl.study.bias.claims import claims_table, judge, verdict
from pedsl.study.seeded.run import study_settings


def _s(lo, hi, n=3):
    return {"mean": (lo + hi) / 2, "min": lo, "max": hi, "n": n}


def _result(ratios: dict[int, dict]) -> dict:
    """A scheme's aggregated result with these ratio spreads by length (length 128 the training length)."""
    ppl = {str(L): {"ratio": s["mean"]} for L, s in ratios.items()}
    spread = {str(L): {"ratio": s} for L, s in ratios.items()}
    return {"mean": {"eval": {"ppl": ppl}}, "spread": {"eval": {"ppl": spread}}}


@pytest.mark.parametrize("claimant, baseline, word", [
    (_s(1.0, 1.1), _s(1.2, 1.5), "flatter"),
    (_s(1.3, 1.6), _s(1.0, 1.2), "steeper"),
    (_s(1.0, 1.3), _s(1.2, 1.5), "within spread"),
    (_s(1.0, 1.0, n=1), _s(2.0, 2.0, n=1), "lower (1 seed)"),
    (_s(3.0, 3.0, n=1), _s(2.0, 2.0, n=1), "higher (1 seed)"),
    (None, _s(1.0, 1.1), "-"),
])
def test_a_cell_is_judged_by_the_ranges(claimant, baseline, word):
    assert judge(claimant, baseline) == word


@pytest.mark.parametrize("words, want", [
    (["flatter", "flatter"], "reproduces (flatter at 2/2)"),
    (["flatter", "within spread", "-"], "partly (flatter at 1/2)"),
    (["steeper", "within spread"], "no (steeper at 1/2)"),
    (["flatter", "steeper", "steeper"], "mixed (flatter at 1/3, steeper at 2/3)"),
    (["within spread", "within spread"], "not beyond the spread (0/2)"),
    (["lower (1 seed)"], "no claim (one seed)"),
])
def test_a_verdict_counts_its_cells(words, want):
    assert verdict(words) == want


def test_the_claims_table_has_a_row_per_pair_present_and_a_column_per_length_past_training():
    results = {
        "alibi": _result({128: _s(1, 1), 256: _s(0.95, 0.97), 512: _s(0.95, 0.97)}),
        "t5_bias": _result({128: _s(1, 1), 256: _s(1.2, 1.4), 512: _s(2.0, 3.0)}),
        "fire": _result({128: _s(1, 1), 256: _s(0.9, 1.0), 512: _s(1.5, 1.9)}),
        "rope": _result({128: _s(1, 1), 256: _s(1.5, 2.0), 512: _s(3.0, 4.0)}),
    }
    t = claims_table(results, {"context": 128, "seeds": [0, 1, 2]})
    assert t.header == ["claim: flatter than", "256 (2x)", "512 (4x)", "verdict"]
    rows = {r[0]: r[1:] for r in t.rows}
    assert list(rows) == ["fire vs t5_bias", "fire vs alibi"]  # no KERPLE run: its pairs are left out
    assert rows["fire vs t5_bias"] == ["flatter (0.950 vs 1.300)", "flatter (1.700 vs 2.500)",
                                       "reproduces (flatter at 2/2)"]
    assert rows["fire vs alibi"] == ["within spread (0.950 vs 0.960)", "steeper (1.700 vs 0.960)",
                                     "no (steeper at 1/2)"]
    assert claims_table({"rope": results["rope"], "fire": results["fire"]}, {"context": 128}) is None


def test_the_study_defaults_are_its_schemes_seeds_and_budget(tmp_path):
    st = study_settings("bias", quick=False, windows=None, analyze_max=None)
    assert st["schemes"] == recipe.SCHEMES and st["seeds"] == (0, 1, 2) and st["train"] == recipe.TRAIN
    m = st["measures"]
    assert m.eval_lengths(128) == [128 * k for k in (1, 2, 4, 8, 16, 32)] and m.tasks == ("ppl",)
    units = parallel.seeded_units("bias", [], tmp_path, seeds=None)
    names = ["alibi", "t5_bias", "t5_bias_init", "kerple_log", "kerple_power", "fire"]  # the study's own file by stem
    assert sorted(u.label for u in units) == sorted(f"{s} seed {k}" for s in names for k in (0, 1, 2))
    units = parallel.seeded_units("bias", ["fire", "t5_bias_init"], tmp_path, seeds=[7])
    assert [u.label for u in units] == ["fire seed 7", "t5_bias_init seed 7"]


TOY = ["--steps", "2", "--lengths", "16,32", "--windows", "1", "--analyze-max", "16", "--threads", "1", "-q",
       "--set", "context=16", "--set", "batch_size=2", "--set", "n_layers=1", "--set", "d_model=16",
       "--set", "n_heads=1", "--set", "head_dim=16", "--set", "max_bytes=65536", "--set", "eval_batches=1"]


def test_bias_study_end_to_end_over_its_default_seeds(tmp_path):
    out = tmp_path / "bias"
    code, stdout, err = run_cli("compare", "--study", "bias", "alibi", "kerple_log", "--out", out, *TOY)
    assert code == 0, err
    assert "Claims: FIRE and KERPLE extrapolate flatter than T5 and ALiBi" in stdout and "kerple_log vs alibi" in stdout
    for name in ("alibi", "kerple_log"):
        for seed in (0, 1, 2):
            cfg = yaml.safe_load((out / "runs" / name / f"seed{seed}" / "config.yaml").read_text())
            assert cfg["seed"] == seed and cfg["steps"] == 2  # --steps over the study's budget
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["study"] == "bias" and res["meta"]["seeds"] == [0, 1, 2]
    md = (out / "report.md").read_text()
    assert "## Claims" in md and "ppl_ratio.png" in md and (out / "ppl_ratio.png").stat().st_size > 0
    row = next(line for line in md.splitlines() if line.startswith("| kerple_log vs alibi"))
    spreads = [res["results"][n]["spread"]["eval"]["ppl"]["32"]["ratio"] for n in ("kerple_log", "alibi")]
    assert judge(*spreads) in row
    # one seed (its run reused): the table makes no claim
    code, stdout, err = run_cli("compare", "--study", "bias", "alibi", "kerple_log", "--seed", "0", "--out", out, *TOY)
    assert code == 0, err
    assert "no claim (one seed)" in stdout and any(w in stdout for w in ("lower (1 seed)", "higher (1 seed)"))
    assert sorted(p.name for p in (out / "runs" / "alibi").iterdir()) == ["seed0", "seed1", "seed2"]


@pytest.mark.parametrize("args, words", [
    (["--quick", "--steps", "2", "--lengths", "16", "--windows", "1", "--analyze-max", "16"], "--quick: not used here"),
    (["--seed", "1", "--seeds", "0,1"], "--seed"),
    (["--seeds", "0,0"], "names a seed twice"),
    (["kerple"], "kerple"),
])
def test_bad_input_is_a_usage_error(args, words, tmp_path):
    code, _, err = run_cli("compare", "--study", "bias", *args, "--out", tmp_path / "s", "--threads", "1")
    assert code in (1, 2) and words in err and "error" in err, err
    assert not (tmp_path / "s" / "runs").exists() or not any((tmp_path / "s" / "runs").iterdir())
