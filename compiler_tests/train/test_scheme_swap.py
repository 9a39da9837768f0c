"""A trained run under another scheme: ``pedsl eval / analyze RUN --scheme OTHER -P ...`` and
``pedsl train --init-from RUN [--scheme OTHER]``.

Swapping a run's scheme for itself reproduces its own evaluation exactly; RoPE -> PI with factor
1 is the same function, so the same numbers; RoPE -> a scheme with learned tensors is refused
(exit 1) naming the tensors; a fine-tune starts at the source model's loss and resumes bit for
bit after a SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compiler_helpers import ROOT, run_cli
from train_helpers import loss_bound
from pedsl.config import TrainConfig, resolve_train_config
from pedsl.data.stream import TrainData
from pedsl.errors import CheckpointError, ParamError
from pedsl.train import load_run, train
from pedsl.train.recipe import from_scheme, load_scheme

SMALL = dict(steps=12, threads=1, context=32, batch_size=4, n_layers=1, d_model=32, n_heads=2, log_every=1,
             eval_every=12, checkpoint_every=6, eval_batches=1, warmup=2, max_bytes=100_000)
EVAL = ["--lengths", "32,64", "--windows", "2", "--tasks", "ppl,blocks", "--threads", "1", "-q", "--json"]


def _train(scheme: str, run: Path, **kw) -> Path:
    path = ROOT / "schemes" / f"{scheme}.pe"
    cfg = resolve_train_config(scheme=str(path), overrides={**SMALL, **kw})
    train(cfg, run, attention=from_scheme(cfg, load_scheme(path)), quiet=True)
    return run


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    return _train("rope", tmp_path_factory.mktemp("swap") / "rope")


def _eval(*args) -> dict:
    code, out, err = run_cli("eval", *args, *EVAL)
    assert code == 0, err
    return json.loads(out)


def test_swap_for_itself_is_the_original_evaluation(rope_run):
    own = _eval(str(rope_run))
    same = _eval(str(rope_run), "--scheme", "rope")
    assert same["ppl"] == own["ppl"] and same["blocks"] == own["blocks"]
    assert (rope_run / "eval.json").is_file() and (rope_run / "eval.rope.json").is_file()
    assert json.loads((rope_run / "eval.json").read_text())["ppl"] == own["ppl"]  # not overwritten
    assert same["swap"]["name"] == "rope" and same["swap"]["run_scheme"]["name"] == "rope"


def test_rope_to_pi_with_factor_1_gives_the_same_numbers(rope_run):
    own = json.loads((rope_run / "eval.json").read_text()) if (rope_run / "eval.json").exists() \
        else _eval(str(rope_run))
    pi1 = _eval(str(rope_run), "--scheme", "pi", "-P", "factor=1")
    model_cfg = resolve_train_config(overrides=SMALL).model
    for L in ("32", "64"):
        want = own["ppl"][L]
        bound = loss_bound(model_cfg, int(L), want["tokens"], want["nll"])
        assert abs(pi1["ppl"][L]["nll"] - want["nll"]) <= bound
    assert pi1["blocks"]["64"]["accuracy"] == own["blocks"]["64"]["accuracy"]
    swap = pi1["swap"]
    assert swap["name"] == "pi" and swap["params"]["factor"] == 1.0 and swap["overrides"] == {"factor": 1}
    assert swap["source_hash"] == load_scheme(ROOT / "schemes" / "pi.pe").source_hash
    written = json.loads((rope_run / "eval.pi.factor=1.json").read_text())
    assert written["scheme"] == "pi" and written["swap"]["params"]["factor"] == 1.0
    # a real interpolation changes the numbers (so the swap is not a no-op)
    pi4 = _eval(str(rope_run), "--scheme", "pi", "-P", "factor=4", "--out", str(rope_run.parent / "pi4.json"))
    assert abs(pi4["ppl"]["32"]["nll"] - own["ppl"]["32"]["nll"]) > 1e-3 * abs(pi1["ppl"]["32"]["nll"] - own["ppl"]["32"]["nll"])
    code, out, err = run_cli("eval", str(rope_run), "--scheme", "pi", "-P", "factor=1", "--lengths", "32",
                             "--windows", "1", "--tasks", "ppl", "--threads", "1", "-q")
    assert code == 0 and "scheme swapped: pi" in out and "factor=1" in out


def test_params_alone_reparameterise_the_runs_own_scheme(rope_run):
    res = _eval(str(rope_run), "-P", "base=500")
    assert res["scheme"] == "rope" and res["swap"]["params"]["base"] == 500.0
    assert json.loads((rope_run / "eval.rope.base=500.json").read_text())["swap"]["overrides"] == {"base": 500}


def test_swap_to_learned_scheme_is_refused(rope_run):
    code, _, err = run_cli("eval", str(rope_run), "--scheme", "acc_learned_qk", *EVAL)
    assert code == 1
    assert "cannot swap the scheme" in err and "'rope' to 'acc_learned_qk'" in err
    assert "blocks.0.attn.pe.learned" in err and "only in the new scheme" in err
    code, _, err = run_cli("analyze", str(rope_run), "--scheme", "acc_learned_qk", "--lengths", "32", "-q")
    assert code == 1 and "cannot swap" in err


def test_unknown_parameter_is_a_clear_error(rope_run):
    code, _, err = run_cli("eval", str(rope_run), "--scheme", "pi", "-P", "facter=2", *EVAL)
    assert code == 1 and "facter" in err and "did you mean 'factor'" in err


def test_analyze_under_another_scheme_writes_its_own_file(rope_run):
    code, out, err = run_cli("analyze", str(rope_run), "--scheme", "ntk", "-P", "factor=4", "--lengths", "32",
                             "--threads", "1", "-q")
    assert code == 0, err
    res = json.loads((rope_run / "analysis.ntk.factor=4.json").read_text())
    assert res["scheme"] == "ntk" and res["swap"]["params"]["factor"] == 4.0
    assert "scheme swapped: ntk" in out and not (rope_run / "analysis.json").exists()


def test_init_from_starts_at_the_source_loss(rope_run, tmp_path):
    ft = tmp_path / "ft"
    code, _, err = run_cli("train", "--init-from", str(rope_run), "--scheme", "pi", "-P", "factor=2",
                           "--context", "64", "--steps", "3", "--lr", "1e-3", "--out", str(ft), "-q")
    assert code == 0, err
    cfg = TrainConfig.from_yaml(ft / "config.yaml")
    src_state = json.loads(sorted((rope_run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    assert cfg.init_from.run == str(rope_run.resolve()) and cfg.init_from.step == 12
    assert cfg.init_from.scheme == "rope" and cfg.init_from.scheme_hash == src_state["scheme_hash"]
    assert cfg.context == 64 and cfg.steps == 3 and cfg.params == {"factor": 2} and cfg.model.d_model == 32
    first = json.loads((ft / "metrics.jsonl").read_text().splitlines()[0])
    # the source model under PI (factor 2) on the fine-tune's first batch: the loss logged at step 1
    model, _, _ = load_run(rope_run, attention=None)
    pi = from_scheme(cfg, load_scheme(ROOT / "schemes" / "pi.pe", {"factor": 2}))
    torch.manual_seed(0)
    from pedsl.model import TransformerLM

    swapped = TransformerLM(cfg.model, pi.factory(cfg.model))
    swapped.load_state_dict(model.state_dict())
    batch = TrainData(cfg.data, cfg.context, cfg.seed).train_batch(0, cfg.batch_size)
    with torch.no_grad():
        want = float(swapped.loss(batch))
    assert first["step"] == 1 and abs(first["loss"] - want) <= loss_bound(cfg.model, 64, batch.numel(), want)
    # and with the run's own scheme, the source model's loss exactly
    same = tmp_path / "same"
    code, _, err = run_cli("train", "--init-from", str(rope_run), "--steps", "1", "--out", str(same), "-q")
    assert code == 0, err
    batch = TrainData(cfg.data, 32, cfg.seed).train_batch(0, 4)
    with torch.no_grad():
        want = float(model.loss(batch))
    logged = json.loads((same / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert abs(logged - want) <= loss_bound(cfg.model, 32, batch.numel(), want)


def test_init_from_refuses_incompatible_and_bad_usage(rope_run, tmp_path):
    code, _, err = run_cli("train", "--init-from", str(rope_run), "--scheme", "acc_learned_qk", "--steps", "1",
                           "--out", str(tmp_path / "x"), "-q")
    assert code == 1 and "cannot swap" in err
    code, _, err = run_cli("train", str(ROOT / "schemes" / "pi.pe"), "--init-from", str(rope_run), "-q")
    assert code == 2 and "--scheme" in err
    code, _, err = run_cli("train", "--init-from", str(tmp_path / "nothing"), "-q")
    assert code == 1 and "not a training run" in err
    code, _, err = run_cli("train", "-q")
    assert code == 2 and "missing SCHEME" in err


def test_source_checkpoint_change_is_detected(rope_run, tmp_path):
    from pedsl.model import TransformerLM
    from pedsl.train.swap import init_config, load_init

    cfg, _ = init_config(rope_run, overrides={"steps": 1})
    m = TransformerLM(cfg.model, from_scheme(cfg).factory(cfg.model))
    load_init(m, cfg, "rope")  # the recorded checkpoint loads
    moved = cfg.model_copy(update={"init_from": cfg.init_from.model_copy(update={"model_sha256": "0" * 64})})
    with pytest.raises(CheckpointError, match="changed since this fine-tune started"):
        load_init(m, moved, "rope")


def test_param_record_carries_the_runs_overrides(tmp_path):
    from pedsl.train.swap import swapped_scheme

    run = _train("rope", tmp_path / "based", steps=2, params={"base": 500.0})
    scheme, rec = swapped_scheme(run, {"base": 500.0}, "yarn", {"factor": 8})
    assert scheme.params["base"] == 500.0 and scheme.params["factor"] == 8
    assert rec["carried"] == {"base": 500.0} and rec["suffix"] == "yarn.factor=8"
    with pytest.raises(ParamError):
        swapped_scheme(run, {}, "yarn", {"nope": 1})


HELPER = """
import sys
import time
from pedsl.data.stream import TrainData
from pedsl.train.swap import init_config
from pedsl.train.recipe import from_scheme
from pedsl.train.loop import train
cfg, scheme = init_config(sys.argv[1], scheme="pi", params={"factor": 2},
                          overrides={"context": 64, "steps": 40, "checkpoint_every": 10, "log_every": 2,
                                     "eval_every": 20})
batch = TrainData.train_batch
TrainData.train_batch = lambda self, *a, **k: (time.sleep(0.02), batch(self, *a, **k))[1]  # slow enough to kill
train(cfg, sys.argv[2], attention=from_scheme(cfg, scheme), resume="--resume" in sys.argv, quiet=True)
"""


@pytest.mark.slow
def test_init_from_resumes_bit_identically_after_a_kill(rope_run, tmp_path):
    script = tmp_path / "ft.py"
    script.write_text(HELPER)
    env_cmd = [sys.executable, str(script), str(rope_run)]
    ref = subprocess.run(env_cmd + [str(tmp_path / "ref")], capture_output=True, text=True, timeout=300,
                         env=_env())
    assert ref.returncode == 0, ref.stderr
    victim = subprocess.Popen(env_cmd + [str(tmp_path / "victim")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
    metrics = tmp_path / "victim" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill after the checkpoint of step 10 (logged step >= 12), mid-interval
        try:
            steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if x.endswith("}")]
        except (FileNotFoundError, json.JSONDecodeError):
            steps = []
        if steps and steps[-1] >= 12:
            break
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = max(json.loads(x)["step"] for x in metrics.read_text().splitlines() if x.endswith("}"))
    assert killed < 40, "the run finished before it was killed"
    resumed = subprocess.run(env_cmd + [str(tmp_path / "victim"), "--resume"], capture_output=True, text=True,
                             timeout=300, env=_env())
    assert resumed.returncode == 0, resumed.stderr

    def logged(run):
        return [(r["step"], r["loss"], r["lr"], r.get("val_loss"))
                for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    assert logged(tmp_path / "victim") == logged(tmp_path / "ref")
    a = sorted((tmp_path / "ref" / "checkpoints").iterdir())[-1] / "model.safetensors"
    b = sorted((tmp_path / "victim" / "checkpoints").iterdir())[-1] / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
