"""The training loop on local stand-in attention modules (no compiler needed):
loss decreases, the run directory holds what pedsl.train documents, a NaN stops the run
keeping the last good checkpoint, load_run rebuilds the model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from compiler_helpers import float32_bound
from pedsl.config import TrainConfig
from pedsl.errors import OutputError, TrainError
from pedsl.train import load_run
from pedsl.train.recipe import SchemeRecipe
from pedsl.train.loop import lr_at, train
from train_helpers import helper, read_metrics, small_cfg

@pytest.mark.parametrize("kind", ["nope", "alibi"])
def test_tiny_run_learns_and_writes_the_run_directory(tmp_path, kind):
    run = tmp_path / "run"
    done = train(small_cfg(), run, attention=helper.spec(kind), quiet=True)
    m = read_metrics(run)
    assert [r["step"] for r in m] == list(range(5, 41, 5))
    assert m[-1]["loss"] < m[0]["loss"] - 1.0
    assert done["val_loss"] < done["unigram_baseline"]
    assert {"step", "loss", "lr", "tokens_per_s"} <= set(m[0]) and "val_loss" in m[3]
    assert (run / "scheme.pe").read_text() == f"# test attention: {kind}\n"
    assert (run / "scheme.sha256").read_text().strip() == helper.spec(kind).source_hash
    assert TrainConfig.from_yaml(run / "config.yaml") == small_cfg()
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_0000030", "step_0000040"]  # keep_checkpoints = 2
    for name in ("model.safetensors", "optim.safetensors", "state.json"):
        assert (run / "checkpoints" / "step_0000040" / name).is_file()
    state = json.loads((run / "checkpoints" / "step_0000040" / "state.json").read_text())
    assert state["step"] == 40 and state["data"] == {"next_step": 40}
    assert json.loads((run / "DONE.json").read_text())["val_loss"] == pytest.approx(done["val_loss"])


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    cfg = small_cfg(steps=100, warmup=10, lr=1e-2, min_lr=1e-3)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)
    assert all(a >= b - 1e-12 for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, cfg) == pytest.approx(1e-3)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    cfg = small_cfg(steps=30, checkpoint_every=10)
    src = "# poison\n"
    poison = SchemeRecipe("poison", src, "0" * 64, build=lambda m: (lambda i: helper.Poison(after=15)))
    with pytest.raises(TrainError, match=r"became nan at step 16.*step_0000010") as exc:
        train(cfg, run, attention=poison, quiet=True)
    assert "lower --lr" in exc.value.render()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000010"]
    assert not (run / "DONE.json").exists()


def test_nan_gradient_stops_before_the_update(tmp_path):
    run = tmp_path / "run"
    poison = SchemeRecipe("poison", "# p\n", "1" * 64, build=lambda m: (lambda i: helper.PoisonGrad(after=12)))
    with pytest.raises(TrainError, match=r"gradient norm became nan at step 13.*step_0000010"):
        train(small_cfg(steps=30, checkpoint_every=10), run, attention=poison, quiet=True)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000010"]


def test_load_run_rebuilds_the_trained_model(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=10), run, attention=helper.spec("alibi"), quiet=True)
    model, cfg, meta = load_run(run, attention=helper.spec("alibi"))
    assert meta["step"] == 10 and cfg.steps == 10 and not model.training
    batch = torch.randint(0, 256, (2, 33))
    with torch.no_grad():
        loss = float(model.loss(batch))
    assert math.isfinite(loss)


def test_fresh_run_refuses_a_directory_with_checkpoints(tmp_path):
    run = tmp_path / "run"
    train(small_cfg(steps=10), run, attention=helper.spec(), quiet=True)
    with pytest.raises(OutputError, match="already holds checkpoints") as exc:
        train(small_cfg(steps=10), run, attention=helper.spec(), quiet=True)
    assert "--resume" in exc.value.hint


def test_unwritable_out_is_an_output_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="cannot write the run directory"):
        train(small_cfg(steps=2), blocker / "run", attention=helper.spec(), quiet=True)


def test_load_run_errors_name_what_is_missing(tmp_path):
    from pedsl.errors import CheckpointError, EvalError

    with pytest.raises(EvalError, match="does not exist"):
        load_run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="has no config.yaml"):
        load_run(tmp_path / "empty")
    run = tmp_path / "run"
    with pytest.raises(TrainError):
        train(small_cfg(steps=30, checkpoint_every=25), run, quiet=True,
              attention=SchemeRecipe("p", "# p\n", "2" * 64, build=lambda m: (lambda i: helper.Poison(after=3))))
    with pytest.raises(CheckpointError, match="has no checkpoint"):
        load_run(run, attention=helper.spec())


def test_answer_weight_adds_the_mean_loss_of_the_marked_bytes_only():
    """_loss against a float64 loop, and its gradient: the extra term reaches the logits that
    predict a marked byte (position p - 1 for the byte at p) and no others."""
    from pedsl.train.loop import _loss

    B, L, V = 3, 10, 7
    torch.manual_seed(0)
    batch = torch.randint(0, V, (B, L + 1))
    answers = torch.zeros(B, L + 1, dtype=torch.bool)
    answers[0, 8:] = True
    answers[2, 5] = True
    table = torch.randn(B, L, V, dtype=torch.float64, requires_grad=True)
    model = lambda x: table  # noqa: E731 - logits (B, L, V) independent of the input
    got = _loss(model, batch, answers, 2.5)
    nll = [[-torch.log_softmax(table[b, t], -1)[batch[b, t + 1]] for t in range(L)] for b in range(B)]
    every = sum(sum(r) for r in nll) / (B * L)
    marked = [(b, t) for b in range(B) for t in range(L) if answers[b, t + 1]]
    assert len(marked) == 4
    want = every + 2.5 * sum(nll[b][t] for b, t in marked) / len(marked)
    # _loss computes in float32: a log-softmax over V, means over the B L tokens and the marked ones, a sum
    n = V + B * L + len(marked) + 2
    for value, exact in ((got, want), (_loss(model, batch, answers, 0.0), every),
                         (_loss(model, batch, torch.zeros_like(answers), 2.5), every)):
        assert abs(float(value.detach()) - float(exact.detach())) <= float32_bound(n, exact)
    (g_extra,) = torch.autograd.grad(got - _loss(model, batch, answers, 0.0), table)
    touched = g_extra.abs().sum(-1) > 0
    assert touched.nonzero().tolist() == [[0, 7], [0, 8], [0, 9], [2, 4]]


def test_answer_weight_trains_and_is_part_of_the_run_digest(tmp_path):
    cfg = small_cfg(steps=6, eval_every=6, checkpoint_every=6, context=80, data="passkey:1,kv:1")
    weighted = cfg.model_copy(update={"data": cfg.data.model_copy(update={"answer_weight": 4.0})})
    assert weighted.digest() != cfg.digest()
    a = train(cfg, tmp_path / "a", attention=helper.spec(), quiet=True)
    b = train(weighted, tmp_path / "b", attention=helper.spec(), quiet=True)
    first = lambda run: read_metrics(run)[0]["loss"]  # noqa: E731 - step 5's training loss
    assert first(tmp_path / "b") > first(tmp_path / "a") + 1.0  # + 4 x the answers' loss (about ln 10 each)
    assert a["val_loss"] != b["val_loss"]
