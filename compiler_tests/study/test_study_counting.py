"""`pedsl compare --study counting` (pedsl.study.counting): its exact-answer scorer on hand-made
predictions, the study end to end at a tiny budget (report, spread over seeds, reuse), its
data-driven scheme list, its executor units and the options and inputs it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from compiler_helpers import run_cli, without_keys
from pedsl.data import counting
from pedsl.data.stream import make_generator
from pedsl.study import parallel
from pedsl.study.common import open_run
from pedsl.study.counting import measure as cm
from pedsl.study.counting import run as cr

SETS = {"context": 32, "batch_size": 2, "n_layers": 1, "d_model": 16, "n_heads": 2, "eval_every": 3,
        "eval_batches": 1, "warmup": 1, "evals": "1x1,2x2"}
TINY = ["--steps", "3", "--windows", "2", "--threads", "1", "-q", *[a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]]


def _batch() -> dict[str, torch.Tensor]:
    return counting.generate("sentence_first", 3, 96, back=3, g=torch.Generator().manual_seed(0))


def test_score_counts_exact_answers_only():
    b = _batch()
    perfect = b["tokens"][:, 1:].clone()                              # position p - 1 predicts byte p
    s = cm.score(perfect, b)
    n = int(b["answers"].sum())
    assert s == {"accuracy": 1.0, "answers": n, "right": n, "by_back": {k: 1.0 for k in s["by_back"]}}
    wrong = perfect.clone()
    wrong[~b["answers"][:, 1:]] = ord("?")                           # non-answer bytes do not count
    assert cm.score(wrong, b)["accuracy"] == 1.0
    at = b["answers"].nonzero()[:3]
    for r, p in at.tolist():                                          # three answers off by one letter
        wrong[r, p - 1] = b["tokens"][r, p] + 1
    s = cm.score(wrong, b)
    assert s["right"] == n - 3 and s["accuracy"] == pytest.approx((n - 3) / n)
    ks = b["back"][b["answers"]]
    missed: dict[int, int] = {}
    for r, p in at.tolist():
        missed[int(b["back"][r, p])] = missed.get(int(b["back"][r, p]), 0) + 1
    for k in range(1, 4):
        miss = missed.get(k, 0)
        total = int((ks == k).sum())
        assert s["by_back"][str(k)] == pytest.approx((total - miss) / total)


def test_score_refuses_misaligned_predictions_and_handles_no_answers():
    b = _batch()
    with pytest.raises(ValueError, match="shape"):
        cm.score(b["tokens"], b)
    none = {**b, "answers": torch.zeros_like(b["answers"])}
    assert cm.score(b["tokens"][:, 1:], none) == {"accuracy": None, "answers": 0, "right": 0, "by_back": {}}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("counting") / "study"
    code, stdout, err = run_cli("compare", "--study", "counting", "rope", "alibi", "--out", out, "--seeds", "0,1",
                                *TINY)
    assert code == 0, err
    return out, stdout


def test_study_writes_its_report_and_numbers(study):
    out, stdout = study
    assert "select_last: accuracy" in stdout
    res = json.loads((out / "results.json").read_text())
    assert set(res["results"]) == {"rope", "alibi"}
    meta = res["meta"]
    assert meta["evals"] == ["1x1", "2x2"] and meta["context"] == 32 and meta["seeds"] == [0, 1]
    assert meta["tasks"] == list(counting.TASKS) and meta["data"] == cr.TRAIN["data"]
    for name in ("rope", "alibi"):
        for task in counting.TASKS:
            spread = res["results"][name]["spread"][task]["2x2"]["accuracy"]
            per_seed = [json.loads((out / "runs" / name / f"seed{s}" / "counting.json").read_text()) for s in (0, 1)]
            accs = [c["tasks"][task]["2x2"]["accuracy"] for c in per_seed]
            assert spread["n"] == 2 and spread["min"] == min(accs) and spread["max"] == max(accs)
            assert all(c["tasks"][task]["2x2"]["answers"] > 0 for c in per_seed)
    md = (out / "report.md").read_text()
    for f in ("accuracy.png", "loss_curves.png"):
        assert (out / f).is_file() and f in md
    assert "L 64, segments x2" in md and "Accuracy per k" in md


def test_the_measure_is_the_scorer_on_the_runs_predictions(study):
    """counting.json of a run equals scoring that run's own greedy predictions on the same rows."""
    out, _ = study
    run = out / "runs" / "rope" / "seed1"
    model, cfg, _ = open_run(run)
    b = counting.generate("select_last", 2, 2 * 32 + 1, back=cfg.data.count_back, stretch=2,
                          g=make_generator(cr.EVAL_SEED, 0, 2, 2))
    with torch.no_grad():
        expect = cm.score(model(b["tokens"][:, :-1]).argmax(-1), b)
    saved = json.loads((run / "counting.json").read_text())["tasks"]["select_last"]["2x2"]
    assert saved == expect


def test_rerun_reuses_every_run_and_measure(study):
    out, _ = study
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/counting.json")}
    code, _, err = run_cli("compare", "--study", "counting", "rope", "alibi", "--out", out, "--seeds", "0,1",
                           *[a for a in TINY if a != "-q"])
    assert code == 0, err
    assert "reusing the finished run" in err and "reusing counting.json" in err and "training" not in err
    assert before == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/counting.json")}


def test_candidates_join_when_they_load(monkeypatch):
    monkeypatch.setattr(cr, "CANDIDATES", (cr.Candidate("rope", "rope", "t"),
                                           cr.Candidate("later", "no_such_library_scheme", "not yet")))
    items, skipped = cr.study_schemes([])
    assert items == ["rope"] and set(skipped) == {"later"} and "no_such_library_scheme" in skipped["later"]
    assert cr.study_schemes(["alibi", "nope"]) == (["alibi", "nope"], {})   # named schemes are never filtered


def test_units_are_the_runs_of_the_study(monkeypatch):
    monkeypatch.setattr(cr, "CANDIDATES", (cr.Candidate("rope", "rope", "a"), cr.Candidate("nope", "nope", "b")))
    units = parallel.counting_units([], "out", seeds=None, steps=3)
    assert [u.label for u in units] == [f"{n} seed {s}" for s in cr.SEEDS for n in ("rope", "nope")]
    assert all(u.kwargs["steps"] == 3 for u in units)


def test_parse_evals():
    assert cr.parse_evals("1x1, 4x1,2X2,1x1") == [(1, 1), (4, 1), (2, 2)]
    assert cr.parse_evals(["1x1", "4x4"]) == [(1, 1), (4, 4)]


@pytest.mark.parametrize("args,needle", [
    (("--lengths", "16"), "--lengths"),
    (("--analyze-max", "64"), "--analyze-max"),
    (("--data", "stdlib"), "counting tasks"),
    (("--data", "select_last:1,kv:1"), "'kv'"),
    (("--data", "sentence_frst"), "did you mean 'sentence_first'"),
    (("--set", "seed=3"), "--set seed"),
    (("--set", "evals=2x4"), "evals"),
    (("--set", "evals=abc"), "RxS"),
    (("--set", "evals=0x1"), "evals"),
    (("--set", "evalz=1x1"), "evalz"),
])
def test_refused(args, needle, tmp_path):
    code, _, err = run_cli("compare", "--study", "counting", "rope", "--out", tmp_path / "s", *args)
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "s" / "runs").exists()


def test_a_condition_too_short_for_its_stretch_is_one_diagnostic(tmp_path):
    """At context 15, evals=2x2 asks for rows of 31 bytes with segments stretched 2x (which need 32):
    refused with one paragraph after training, the trained run kept for the rerun."""
    sets = {**SETS, "context": 15, "evals": "2x2"}
    args = ["--steps", "1", "--windows", "1", "--threads", "1", "-q",
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    code, _, err = run_cli("compare", "--study", "counting", "rope", "--out", tmp_path / "s", "--seeds", "0", *args)
    assert code == 2 and "too short" in err and "Traceback" not in err, err
    assert (tmp_path / "s" / "runs" / "rope" / "seed0" / "DONE.json").is_file()


def test_jobs_2_gives_the_serial_numbers(tmp_path):
    """--jobs 2 trains and measures the runs in worker processes; with --threads 1 every number of
    results.json and every run's metrics equal a serial study's."""
    timing = {"wall_time_s", "cpu_time_s", "tokens_per_s", "train_cpu_s", "date", "command", "time_s", "elapsed_s"}
    got = []
    for out, extra in ((tmp_path / "serial", ()), (tmp_path / "par", ("--jobs", "2"))):
        code, _, err = run_cli("compare", "--study", "counting", "nope", "--out", out, "--seeds", "0,1", *TINY, *extra)
        assert code == 0, err
        metrics = [[without_keys(json.loads(x), timing) for x in (out / "runs" / "nope" / f"seed{s}" / "metrics.jsonl")
                    .read_text().splitlines()] for s in (0, 1)]
        got.append((without_keys(json.loads((out / "results.json").read_text())["results"], timing), metrics))
    assert got[0] == got[1]
