"""`pedsl compare --study retrieval --seeds 0,1` end to end at a toy budget: every run per seed,
retrieval.json by task / length / depth, the report's mean [min, max] cells and n.s. flags, the
heatmaps and loss curves; a rerun reuses everything."""

from __future__ import annotations

import json

import pytest
import yaml

from compiler_helpers import run_cli as _cli
from pedsl.study import seeds as sd
from pedsl.study.retrieval import recipe as sr

TOY = ["--quick", "--steps", "6", "--lengths", "72,144", "--windows", "1", "--analyze-max", "72", "--threads", "1",
       "--set", "context=72", "--set", "batch_size=4", "--set", "n_layers=1", "--set", "d_model=32",
       "--set", "n_heads=2", "--set", "data.max_bytes=100000", "--set", "eval_every=6",
       "--set", "eval_batches=1", "--set", "warmup=2", "--set", "multikey_keys=1"]


@pytest.mark.slow
def test_retrieval_study_two_seeds_end_to_end(tmp_path):
    out = tmp_path / "study"
    args = ["compare", "rope", "alibi", "--study", "retrieval", "--seeds", "0,1", "--out", str(out), *TOY]
    code, stdout, err = _cli(*args)
    assert code == 0, err
    assert "Retrieval accuracy vs length" in stdout and "study 100%" in err and "left" in err
    for name in ("report.md", "report.html", "results.json", "acc_vs_length.png", "acc_vs_depth.png",
                 "niah_all.png", "niah_passkey.png", "niah_kv.png", "ppl_ratio.png", "loss_curves.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    per = {}
    for name in ("rope", "alibi"):
        for seed in (0, 1):
            run = out / "runs" / name / f"seed{seed}"
            rt = json.loads((run / "retrieval.json").read_text())
            assert set(rt["tasks"]) == {"passkey", "multikey", "kv"}
            assert set(rt["tasks"]["kv"]) == {"72", "144"} and set(rt["tasks"]["kv"]["72"]["depths"]) == {"0", "0.5", "1"}
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["seed"] == seed and cfg["data"]["source"] == sr.MIXTURE and cfg["steps"] == 6  # --steps wins
            assert cfg["data"]["answer_weight"] == sr.TRAIN["answer_weight"] > 0
            assert cfg["data"]["train_digits"] == sr.TRAIN["train_digits"]
            per[name, seed] = rt["overall"]["144"]["digit_accuracy"]
    results = json.loads((out / "results.json").read_text())["results"]
    s = results["alibi"]["spread"]["retrieval"]["overall"]["144"]["digit_accuracy"]
    assert s["n"] == 2 and s["min"] == min(per["alibi", 0], per["alibi", 1]) and s["max"] == max(per["alibi", 0], per["alibi", 1])
    md = (out / "report.md").read_text()
    assert sd.fmt(results["alibi"]["spread"]["eval"]["ppl"]["144"]["ratio"], ".2f") in md
    assert "niah_all.png" in md and "loss_curves.png" in md and "seeds [0, 1]" in md
    code, _, err = _cli(*args)
    assert code == 0, err
    assert err.count("reusing the finished run") == 4 and "study 100%" not in err
    # the tasks on one run through `pedsl eval --tasks retrieval`
    run = out / "runs" / "rope" / "seed0"
    code, stdout, err = _cli("eval", run, "--tasks", "retrieval", "--lengths", "72", "--windows", "1",
                             "--out", tmp_path / "e.json", "--threads", "1")
    assert code == 0, err
    ev = json.loads((tmp_path / "e.json").read_text())
    assert set(ev["retrieval"]["tasks"]) == {"passkey", "multikey", "kv"} and "retrieval" in stdout


def test_the_perplexity_heading_names_what_was_measured():
    from pedsl.study.seeded.series import ppl_source

    assert ppl_source({"data": "passkey:0.4,multikey:0.2,kv:0.2,copy:0.2"}) == "passkey rows (the mixture has no text)"
    assert ppl_source({"data": "stdlib:0.7,kv:0.3"}) == "the text corpus"
    assert ppl_source({"data": None}) == "the text corpus"
