"""The learned-distance, scaling-transport and contextual library schemes through a user's whole chain, each
from the CLI: `pedsl check`, `pedsl train` (a tiny budget: the loss falls and the learned positional values
move), `pedsl eval` past the training length, the trained attention decoding with a cache equal to its full
forward, `pedsl compile`'s standalone module equal to the trained one with its weights, and `pedsl diff`
against RoPE (text and --numeric).

The decoding and compile checks run on the *trained* weights: several of these schemes start at a constant
(T5's table at 0, KERPLE's r1 at 1), where a wrong index into the table or a dropped query position would
not show."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from compiler_helpers import SCHEMES, run_cli
from pedsl.train import load_run
from train_helpers import TINY, read_metrics

NAMES = ["t5_bias", "dynamic_position_bias", "kerple_log", "kerple_power", "fire", "sandwich", "xpos",
         "alibi_learned", "alibi_partial", "stick_breaking", "cope"]
# the schemes with learned positional values (the others are fixed functions of the distance)
LEARNED = {"t5_bias", "dynamic_position_bias", "kerple_log", "kerple_power", "fire", "alibi_learned", "cope"}
STEPS = 30  # checkpoints at 15 and 30 (TINY's checkpoint_every)
F64 = torch.float64


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> its run folder, trained once for the module by `pedsl train`."""
    root = tmp_path_factory.mktemp("learned_schemes")
    out = {}
    for name in NAMES:
        run = root / name
        code, _, err = run_cli("train", SCHEMES / f"{name}.pe", "--out", run, "--steps", STEPS, *TINY)
        assert code == 0, f"{name}: {err}"
        out[name] = run
    return out


def _pe(run, step=None):
    model, cfg, _ = load_run(run, step=step)
    return model.blocks[0].attn.pe, cfg


def _qkv(pe, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, pe.heads, L, pe.head_dim, generator=g, dtype=F64) for _ in range(3)]


@pytest.mark.parametrize("name", NAMES)
def test_checks_clean(name):
    code, _, err = run_cli("check", "--strict", SCHEMES / f"{name}.pe")
    assert code == 0 and "0 errors, 0 warnings" in err, err


@pytest.mark.parametrize("name", NAMES)
def test_trains_with_a_falling_loss_and_moving_positions(runs, name):
    losses = [m["loss"] for m in read_metrics(runs[name]) if "loss" in m]
    assert losses and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    early, _ = _pe(runs[name], step=15)
    late, _ = _pe(runs[name], step=STEPS)
    params = dict(late.named_parameters())
    assert bool(params) == (name in LEARNED), sorted(params)
    moved = [k for k, p in early.named_parameters() if not torch.equal(p, params[k])]
    assert sorted(moved) == sorted(params), f"{name}: trained but unchanged: {set(params) - set(moved)}"


@pytest.mark.parametrize("name", NAMES)
def test_evaluates_past_the_training_length(runs, name, tmp_path):
    out = tmp_path / "eval.json"
    code, stdout, err = run_cli("eval", runs[name], "--lengths", "32,64", "--windows", "1", "--tasks", "ppl",
                                "--out", out, "--threads", "1", "--json", "-q")
    assert code == 0, err
    ppl = json.loads(stdout)["ppl"]
    assert ppl["32"]["ratio"] == 1.0 and math.isfinite(ppl["64"]["ratio"]) and ppl["64"]["ppl"] > 1


@pytest.mark.parametrize("name", NAMES)
def test_trained_attention_decodes_with_a_cache_as_one_forward(runs, name):
    """Prefill 20 positions, then one at a time to 48 (past the training context 32): equal to one forward."""
    pe, _ = _pe(runs[name])
    pe = pe.double()
    q, k, v = _qkv(pe, 48)
    with torch.no_grad():
        full = pe(q, k, v)
        cache = pe.new_cache(2)
        parts = [pe(q[:, :, :20], k[:, :, :20], v[:, :, :20], cache=cache)]
        parts += [pe(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(20, 48)]
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_compiled_module_carries_the_trained_weights(runs, name, tmp_path):
    pe, cfg = _pe(runs[name])
    m = cfg.model
    code, _, err = run_cli("compile", SCHEMES / f"{name}.pe", "-o", tmp_path, "--heads", m.n_heads,
                           "--head-dim", m.head_dim, "--d-model", m.d_model)
    assert code == 0, err
    spec = importlib.util.spec_from_file_location(f"standalone_trained_{name}", tmp_path / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gen = mod.Module()
    gen.load_state_dict(pe.state_dict())
    gen, pe = gen.double(), pe.double()
    q, k, v = _qkv(pe, 40, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(gen(q, k, v), pe(q, k, v), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_diff_against_rope_names_what_changed(name):
    code, out, err = run_cli("diff", "rope", name)
    assert code == 1, err  # they differ
    meaning = out.split("What this means", 1)[1]
    changed = "bias:" in meaning or "weights:" in meaning or "rotation:" in meaning
    assert changed, out
    code, out, err = run_cli("diff", "rope", name, "--numeric", "--lmax", "64")
    assert code == 1 and "largest difference" in out and "Traceback" not in err, out + err
