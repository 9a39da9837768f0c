"""`pedsl compare` end to end on two schemes with a tiny budget: report.md / report.html, the
tables and the plot files exist and carry the runs' numbers; a rerun reuses everything, an
interrupted run is resumed; eval of a run whose checkpoint was corrupted fails with a
diagnostic (exit 1, no traceback)."""

from __future__ import annotations

import json

import pytest

from compiler_helpers import run_cli as _cli

TINY = ["--steps", "12", "--lengths", "32,64,128", "--windows", "2", "--analyze-max", "64", "--threads", "1",
        "--set", "context=32", "--set", "batch_size=4", "--set", "n_layers=1", "--set", "d_model=32",
        "--set", "n_heads=2", "--set", "data.max_bytes=100000", "--set", "eval_every=12",
        "--set", "eval_batches=1", "--set", "warmup=2", "-q"]


@pytest.mark.slow
def test_compare_two_schemes_end_to_end(tmp_path, monkeypatch):
    monkeypatch.delenv("PEDSL_DEBUG", raising=False)
    out = tmp_path / "study"
    code, stdout, err = _cli("compare", "rope", "alibi", "--out", str(out), *TINY)
    assert code == 0, err
    for name in ("report.md", "report.html", "results.json", "ppl_ratio.png", "ppl_ratio.svg", "far_mass.png",
                 "far_mass.svg", "freq_energy.png", "retrieval.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())["results"]
    assert set(results) == {"rope", "alibi"}
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    for name in ("rope", "alibi"):
        run = out / "runs" / name
        ev = json.loads((run / "eval.json").read_text())
        an = json.loads((run / "analysis.json").read_text())
        assert set(ev["ppl"]) == {"32", "64", "128"} and ev["ppl"]["32"]["ratio"] == 1.0
        assert an["lengths"] == [32, 64]
        for L in ("64", "128"):  # the runs' numbers are in both pages, as the tables print them
            cell = f"{ev['ppl'][L]['ratio']:.3f}"
            assert cell in md and cell in page
        assert f"{an['summary']['far_mass']['64']:.3f}" in md
        assert f"{json.loads((run / 'DONE.json').read_text())['val_loss']:.3f}" in md
    assert "ppl_ratio.png" in md and "<img src='ppl_ratio.png'" in page
    assert "pedsl compare rope alibi" in md and "torch" in md
    assert "Perplexity ratio" in stdout

    # a rerun reuses the runs, their eval.json and analysis.json
    code, _, err = _cli("compare", "rope", "alibi", "--out", str(out), *TINY[:-1])
    assert code == 0, err
    assert err.count("reusing the finished run") == 2 and "reusing eval.json" in err

    # an interrupted run (checkpoints, no DONE.json) is resumed, not retrained
    (out / "runs" / "alibi" / "DONE.json").unlink()
    code, _, err = _cli("compare", "rope", "alibi", "--out", str(out), *TINY[:-1])
    assert code == 0, err
    assert "alibi: resuming" in err and (out / "runs" / "alibi" / "DONE.json").is_file()

    # eval of a run whose checkpoint is corrupt: a diagnostic, exit 1, no traceback
    ckpt = sorted((out / "runs" / "rope" / "checkpoints").iterdir())[-1]
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    code, _, err = _cli("eval", str(out / "runs" / "rope"), "--lengths", "32", "-q")
    assert code == 1 and "corrupt" in err and "Traceback" not in err

    # analyze prints its table
    code, stdout, err = _cli("analyze", str(out / "runs" / "alibi"), "--lengths", "32,64", "-q")
    assert code == 0, err
    assert "far mass" in stdout


def test_compare_unknown_scheme_is_a_clear_error(tmp_path):
    code, _, err = _cli("compare", "ropee", "--out", str(tmp_path / "s"))
    assert code == 1 and "rope" in err and "Traceback" not in err


def test_set_of_a_setting_with_an_option_of_its_own_reaches_the_runs():
    """`compare --set steps=150` (no --steps): the --set value, not a clash of two keyword arguments."""
    from pedsl.study import driver

    assert driver.given({"steps": 150}, preset="tiny", steps=None, seed=None, data=None) == {"preset": "tiny",
                                                                                           "steps": 150}
    assert driver.given(None, preset="tiny", steps=3) == {"preset": "tiny", "steps": 3}
