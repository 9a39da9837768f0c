"""`pedsl compare --study extension` end to end at a tiny budget: the base RoPE trained once, the
zero-shot swaps and the fine-tunes evaluated, the report carrying their numbers; a rerun reuses
every run and evaluation; factors are set by parameter name, and a missing name is an error."""

from __future__ import annotations

import json
import math

import pytest

from compiler_helpers import run_cli
from train_helpers import loss_bound
from pedsl.config import resolve_train_config
from pedsl.errors import ConfigError

TINY = ["--steps", "20", "--lengths", "32,64,128", "--windows", "2", "--threads", "1",
        "--set", "context=32", "--set", "batch_size=8", "--set", "n_layers=1", "--set", "d_model=32",
        "--set", "n_heads=1", "--set", "data.max_bytes=100000", "--set", "eval_every=20",
        "--set", "eval_batches=1", "--set", "warmup=2"]


@pytest.mark.slow
def test_extension_study_end_to_end_and_reuse(tmp_path):
    out = tmp_path / "study"
    code, stdout, err = run_cli("compare", "--study", "extension", "pi", "yarn", "--out", str(out), *TINY)
    assert code == 0, err
    ext = out / "extension"
    for name in ("report.md", "report.html", "results.json", "extension_text.png", "extension_blocks.png"):
        assert (ext / name).is_file() and (ext / name).stat().st_size > 0, name
    assert (out / "runs" / "rope" / "DONE.json").is_file()  # the base is the default study's run
    res = json.loads((ext / "results.json").read_text())["results"]
    text = res["text"]
    assert set(text["zero_shot"]) == set(text["fine_tuned"]) == {"rope", "pi", "yarn"}
    assert text["ft_steps"] == 2
    md, page = (ext / "report.md").read_text(), (ext / "report.html").read_text()
    base = text["zero_shot"]["rope"]["4"]["ppl"]["32"]["nll"]
    pi4 = text["zero_shot"]["pi"]["4"]
    assert pi4["swap"]["params"]["factor"] == 4 and pi4["swap"]["params"]["train_length"] == 32
    for ev in (pi4, text["fine_tuned"]["yarn"]["16"]):
        cell = f"{math.exp(ev['ppl']['128']['nll'] - base):.3f}"  # ratio to the base at L0, as tabulated
        assert cell in md and cell in page
    ft = text["fine_tune_runs"]["pi"]["16"]
    cfg = (out / ft["run"] / "config.yaml").read_text()
    assert ft["context"] == 512 and ft["batch_size"] == 1 and "init_from" in cfg and "factor: 16" in cfg
    acc = res["blocks"]["zero_shot"]["pi"]["4"]["blocks"]["32"]["accuracy"]
    assert f"{acc:.2f}" in md
    assert "Self-similarity" in md and "pedsl compare pi yarn" in md and "--study extension" in md
    assert "Extension study" in stdout

    stamps = {p.name: p.stat().st_mtime_ns for p in (ext / "evals").iterdir()}
    code, _, err = run_cli("compare", "--study", "extension", "pi", "yarn", "--out", str(out), *TINY)
    assert code == 0, err
    assert err.count("reusing the finished run") == 2 + 2 * 6  # two bases, 3 methods x 2 targets x 2 tasks
    assert {p.name: p.stat().st_mtime_ns for p in (ext / "evals").iterdir()} == stamps


@pytest.mark.slow
def test_training_free_methods_are_evaluated_zero_shot_only(tmp_path):
    out = tmp_path / "study"
    code, _, err = run_cli("compare", "--study", "extension", "rerope", "self_extend", "--out", str(out), *TINY)
    assert code == 0, err
    ext = out / "extension"
    res = json.loads((ext / "results.json").read_text())
    text = res["results"]["text"]
    assert set(text["zero_shot"]) == {"rope", "rerope", "self_extend"} and set(text["fine_tuned"]) == {"rope"}
    p = text["zero_shot"]["self_extend"]["16"]["swap"]["params"]
    # the smallest group that keeps 16 x 32 within training: (32 - 8) * 21 + 8 = 512
    assert (p["train_length"], p["factor"], p["neighbours"], p["group"]) == (32, 16, 8, 21)
    at = lambda m, T: text["zero_shot"][m][T]["ppl"]["128"]["nll"]  # noqa: E731
    # within the window every method is RoPE; at 4x L0 each reads the far keys its own way
    # ReRoPE's clamped distances and RoPE's rotations compute the same logits by different float32 roundings:
    # two float32 computations of one loss, within loss_bound (the logits' chain, the vocabulary, the tokens)
    want = text["zero_shot"]["rope"]["4"]["ppl"]["32"]
    model = resolve_train_config(overrides=dict(context=32, n_layers=1, d_model=32, n_heads=1)).model
    bound = loss_bound(model, 32, want["tokens"], want["nll"])
    assert abs(text["zero_shot"]["rerope"]["4"]["ppl"]["32"]["nll"] - want["nll"]) <= bound
    assert len({round(at("rope", "4"), 6), round(at("rerope", "4"), 6), round(at("self_extend", "4"), 6)}) == 3
    assert any("zero-shot only" in n for n in res["meta"]["notes"])
    assert "self_extend" in (ext / "report.md").read_text()


def test_extension_rejects_other_schemes_and_analysis_options(tmp_path):
    code, _, err = run_cli("compare", "--study", "extension", "alibi", "--out", str(tmp_path / "s"))
    assert code == 2 and "not one of them" in err and "yarn" in err
    code, _, err = run_cli("compare", "--study", "extension", "--analyze-max", "64", "--out", str(tmp_path / "s"))
    assert code == 2 and "--analyze-max" in err


def test_factor_is_set_by_parameter_name(monkeypatch):
    from pedsl.study.extension import run as st

    assert st.method_params("pi", 4, 128) == ({"train_length": 128, "factor": 4}, None)
    assert st.method_params("rope", 16, 64) == ({"train_length": 64}, None)
    assert st.method_params("self_extend", 16, 64) == ({"train_length": 64, "factor": 16}, None)
    params, note = st.method_params("rerope", 16, 64)
    assert params == {"train_length": 64} and "fixed" in note
    params, note = st.method_params("longrope", 4, 128)
    if "factor" in params:  # a LongRoPE scheme with a factor parameter
        assert params["factor"] == 4 and note is None
    else:
        assert "no 'factor' parameter" in note
        monkeypatch.setattr(st, "FIXED_OK", ())
        with pytest.raises(ConfigError, match="declares no parameter 'factor'"):
            st.method_params("longrope", 4, 128)
    monkeypatch.setattr(st, "FACTOR", "scale")
    with pytest.raises(ConfigError, match="declares no parameter 'scale'.*factor"):
        st.method_params("yarn", 4, 128)
