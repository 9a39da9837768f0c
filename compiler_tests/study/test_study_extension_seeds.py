"""`pedsl compare --study extension --seeds`: every seed's study in its own folders, the summary as
mean [min, max] over seeds with (n.s.) where a method is within RoPE's spread; checked on
synthetic per-seed results with known spreads, through the CLI with the per-seed study replaced,
and end to end at a tiny budget."""

from __future__ import annotations

import json
import math

import pytest

from compiler_helpers import run_cli
from pedsl.study.extension import seeds as es
from pedsl.study.extension import seeds_report as esr

L0 = 32
LENS = [32, 128]


def _ev(ratios: dict[int, float], base_nll: float = 1.0) -> dict:
    return {"ppl": {str(L): {"nll": base_nll + math.log(r)} for L, r in ratios.items()}}


def _rec(rope_zs: dict, pi_zs: dict, rope_ft: dict, pi_ft: dict) -> dict:
    """One seed's text results: ratios to its own base (RoPE zero-shot at L0 is the base, ratio 1)."""
    return {"base": {"context": L0, "run": "runs/rope/seed0", "train": {}}, "lengths": LENS, "samples": 2,
            "ft_steps": 2,
            "zero_shot": {"rope": {"4": _ev(rope_zs)}, "pi": {"4": _ev(pi_zs)}},
            "fine_tuned": {"rope": {"4": _ev(rope_ft)}, "pi": {"4": _ev(pi_ft)}}}


PER_SEED = {
    # at 128 zero-shot: rope 10, 12, 14 and pi 2, 3, 4 -> apart; fine-tuned: rope 1.5-1.7, pi 1.6-1.8 -> overlap
    0: {"text": _rec({32: 1.0, 128: 10.0}, {32: 1.2, 128: 2.0}, {32: 1.1, 128: 1.5}, {32: 1.1, 128: 1.6})},
    1: {"text": _rec({32: 1.0, 128: 12.0}, {32: 1.3, 128: 3.0}, {32: 1.1, 128: 1.6}, {32: 1.2, 128: 1.7})},
    2: {"text": _rec({32: 1.0, 128: 14.0}, {32: 1.4, 128: 4.0}, {32: 1.1, 128: 1.7}, {32: 1.3, 128: 1.8})},
}


def test_aggregate_gives_mean_and_range_per_cell():
    agg = es.aggregate(PER_SEED)["text"]
    assert agg["seeds"] == 3 and agg["context"] == L0
    zs = agg["zero_shot"]["pi"]["4"]["128"]
    assert zs["n"] == 3 and zs["min"] == pytest.approx(2.0) and zs["max"] == pytest.approx(4.0)
    assert zs["mean"] == pytest.approx(3.0)
    assert agg["fine_tuned"]["rope"]["4"]["128"]["mean"] == pytest.approx(1.6)
    assert list(agg["zero_shot"]["rope"]) == ["4"]  # zero-shot RoPE: one model, kept once


def test_tables_and_findings_flag_differences_within_the_spread():
    agg = es.aggregate(PER_SEED)
    by_title = {t: rows for t, _, rows, _ in esr.tables(agg, {})}
    zs = next(rows for t, rows in by_title.items() if "zero-shot" in t)
    ft = next(rows for t, rows in by_title.items() if "fine-tune" in t)
    pi_zs = next(r for r in zs if r[0] == "pi")
    pi_ft = next(r for r in ft if r[0] == "pi")
    assert pi_zs[3] == "3.000 [2.000, 4.000]"  # apart from RoPE's [10, 14]: no flag
    assert pi_ft[3] == "1.700 [1.600, 1.800] (n.s.)"  # overlaps fine-tuned RoPE's [1.5, 1.7]
    f = esr.findings(agg)
    assert any("zero-shot" in x and "best pi" in x and "beyond the spread" in x for x in f), f
    assert any("fine-tuned" in x and "best rope" in x and "not significant" in x for x in f), f
    header, rows = esr.summary(agg)
    pi = next(r for r in rows if r[0] == "pi")
    assert pi[header.index("zero-shot @ target")] == "3.000 [2.000, 4.000]"
    assert pi[header.index("fine-tuned @ target")].endswith("(n.s.)")


def test_cli_runs_every_seed_in_its_own_folders_and_writes_the_summary(tmp_path, monkeypatch):
    from pedsl.study.extension import run as study_extension

    calls = []

    def fake(out, *, seed, base_run, ext_dir, say, **kw):
        calls.append((seed, base_run, ext_dir, kw["methods"]))
        return {"results": PER_SEED[seed], "meta": {"methods": ["rope", "pi"], "git": "abc"}, "files": []}

    monkeypatch.setattr(study_extension, "run_extension", fake)
    out = tmp_path / "s"
    code, stdout, err = run_cli("compare", "--study", "extension", "pi", "--seeds", "0,1,2", "--out", str(out))
    assert code == 0, err
    assert [(s, b.relative_to(out).as_posix(), e.relative_to(out).as_posix()) for s, b, e, _ in calls] == [
        (k, f"runs/rope/seed{k}", f"extension/seed{k}") for k in (0, 1, 2)]
    assert calls[0][3] == ["pi"]
    md = (out / "extension" / "report.md").read_text()
    assert "3.000 [2.000, 4.000]" in md and "(n.s.)" in md and "--seeds 0,1,2" in md
    assert (out / "extension" / "extension_seeds_text.png").stat().st_size > 0
    res = json.loads((out / "extension" / "results.json").read_text())
    assert set(res["per_seed"]) == {"0", "1", "2"} and res["results"]["text"]["seeds"] == 3
    assert "mean [min, max]" in stdout and "3.000 [2.000, 4.000]" in stdout


@pytest.mark.slow
def test_two_seeds_end_to_end(tmp_path):
    sets = {"context": 32, "batch_size": 8, "n_layers": 1, "d_model": 32, "n_heads": 1, "data.max_bytes": 100000,
            "eval_every": 12, "eval_batches": 1, "warmup": 2, "threads": 1}
    res = es.run_extension_seeds(tmp_path, seeds=[0, 1], methods=["pi"], steps=12, lengths=[32, 64], windows=2,
                                 targets=(2,), ft_steps=2, blocks_task=False, sets=sets, quiet=True)
    for k in (0, 1):
        assert (tmp_path / "runs" / "rope" / f"seed{k}" / "DONE.json").is_file()
        assert (tmp_path / "extension" / f"seed{k}" / "report.md").is_file()
    nll = [res["per_seed"][k]["text"]["zero_shot"]["pi"]["2"]["ppl"]["64"]["nll"] for k in (0, 1)]
    assert nll[0] != nll[1]  # the seeds trained different models
    cell = res["results"]["text"]["zero_shot"]["pi"]["2"]["64"]
    assert cell["n"] == 2 and cell["min"] < cell["max"]
    assert (tmp_path / "extension" / "report.html").is_file()
