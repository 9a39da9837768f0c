"""A `layers` scheme in the model: each layer built with its part; train, resume, eval, analyze,
compare and export --hf on it at a tiny budget; checkpoints record the part of every layer."""

from __future__ import annotations

import json

import pytest
import torch

from compiler_helpers import run_cli
from pedsl.config import resolve_train_config
from pedsl.errors import CheckError
from pedsl.model import TransformerLM
from pedsl.train.recipe import from_scheme

MIX = """
scheme rope { qk: rotate(geometric(10000.0) * position) }
scheme rope_fast { qk: rotate(geometric(100.0) * position) }
scheme nope "no PE" { }
scheme mix "RoPE with NoPE every 2nd layer" {
  layers {
    default = rope
    every(2) = nope
    last(1) = rope_fast
  }
  train { arch = "llama" }
}
"""

TINY = ["--steps", "6", "--context", "32", "--batch-size", "4", "--threads", "1", "--set", "n_layers=3",
        "--set", "d_model=32", "--set", "n_heads=2", "--set", "eval_every=3", "--set", "eval_batches=1",
        "--set", "checkpoint_every=3", "--set", "data.max_bytes=100000", "--set", "warmup=2", "-q"]


@pytest.fixture
def mix(tmp_path):
    f = tmp_path / "mix.pe"
    f.write_text(MIX)
    return f


def _model(mix, n_layers=3):
    cfg = resolve_train_config(scheme=str(mix), overrides={"n_layers": n_layers, "d_model": 32, "n_heads": 2})
    recipe = from_scheme(cfg)
    return TransformerLM(cfg.model, recipe.factory(cfg.model)), recipe, cfg


def test_each_layer_is_its_part(mix):
    model, recipe, cfg = _model(mix)
    assert [blk.attn.pe.scheme.name for blk in model.blocks] == ["rope", "nope", "rope_fast"]
    assert recipe.layer_parts(cfg.model) == ("rope", "nope", "rope_fast")
    # the layers compute what their parts do: layer 1's module is the NoPE floor, layer 0's rotates
    q, k, v = (torch.randn(1, 2, 9, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(model.blocks[1].attn.pe(q, k, v), plain)
    assert not torch.allclose(model.blocks[0].attn.pe(q, k, v), plain, atol=1e-3)
    assert not torch.allclose(model.blocks[0].attn.pe(q, k, v), model.blocks[2].attn.pe(q, k, v), atol=1e-3)


def test_a_layer_count_the_rules_do_not_fit(tmp_path):
    f = tmp_path / "g.pe"
    f.write_text(MIX.replace("default = rope\n", "pattern = [rope * 3, rope_fast]\n"))
    with pytest.raises(CheckError) as err:
        _model(f, n_layers=2)
    d = err.value.diagnostics[0]
    assert d.code == "E254" and d.file == str(f) and d.line == 7 and "model of 2 layers" in d.message


def test_train_resume_eval_analyze_export(mix, tmp_path):
    run = tmp_path / "run"
    code, out, err = run_cli("train", mix, "--out", run, *TINY)
    assert code == 0, out + err
    state = json.loads((run / "checkpoints" / "step_0000006" / "state.json").read_text())
    assert state["scheme_layers"] == ["rope", "nope", "rope_fast"] and state["scheme_name"] == "mix"
    code, out, err = run_cli("train", mix, "--out", run, *[("8" if a == "6" else a) for a in TINY], "--resume")
    assert code == 0, out + err
    assert json.loads((run / "DONE.json").read_text())["steps"] == 8
    code, out, err = run_cli("eval", run, "--lengths", "32,64", "--out", tmp_path / "ev.json")
    assert code == 0, out + err
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["ppl"]["32"]["ratio"] == 1.0 and ev["ppl"]["64"]["ppl"] > 1
    code, out, err = run_cli("analyze", run, "--max-length", "64", "--out", tmp_path / "an.json")
    assert code == 0, out + err
    # layers 0 and 2 rotate group 'all' at different frequencies: summarised apart, never averaged together
    fe = json.loads((tmp_path / "an.json").read_text())["summary"]["frequency_energy"]
    assert [g["group"] for g in fe] == ["all (layers 0)", "all (layers 2)"] and fe[0]["freqs"] != fe[1]["freqs"]
    # NoPE layers go to Llama 4 text, whose RoPE layers share one rope: rope_fast's layer is refused by name
    code, out, err = run_cli("export", run, "--hf", tmp_path / "hf")
    assert code == 1 and "E962" in out + err and "layer 2 (rope_fast) has another rope" in out + err
    assert not (tmp_path / "hf" / "config.json").exists()


def test_export_hf_of_layers_with_one_rope_and_the_refusal_of_two(tmp_path):
    """Parts with one HF rope export as Llama with the run's logits; two different ropes are refused."""
    transformers = pytest.importorskip("transformers")
    f = tmp_path / "same.pe"
    f.write_text(MIX.replace("every(2) = nope", "every(2) = rope_again").replace(
        'scheme nope "no PE" { }', "scheme rope_again extends rope { }").replace("last(1) = rope_fast\n", ""))
    run = tmp_path / "run"
    assert run_cli("train", f, "--out", run, *TINY)[0] == 0
    code, out, err = run_cli("export", run, "--hf", tmp_path / "hf")
    assert code == 0, out + err
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    from pedsl.study.common import open_run
    model, _, _ = open_run(run)
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    _assert_same_logits(hf, model, tokens)
    g = tmp_path / "two.pe"
    g.write_text(MIX.replace("every(2) = nope", "every(2) = rope"))
    run2 = tmp_path / "run2"
    assert run_cli("train", g, "--out", run2, *TINY)[0] == 0
    code, out, err = run_cli("export", run2, "--hf", tmp_path / "hf2")
    assert code == 1 and "E962" in out + err and "layer 0 (rope)" in out + err and "layer 2 (rope_fast)" in out + err


def _assert_same_logits(hf, model, tokens) -> None:
    """The exported HF model computes the run's logits: both in float64 (HF's float32 steps lifted too:
    hf_helpers.float64_native), within float64's rounding of the logits' chain; a missing temperature
    or rope is off by 1e-4 or more."""
    from hf_helpers import FLOAT32_STEPS, depth, float64_native, rounding

    with torch.no_grad():
        want = float64_native(hf.double(), also=FLOAT32_STEPS)(tokens).logits
        got = model.double()(tokens)
    torch.testing.assert_close(got, want, atol=rounding(depth(hf.config, tokens.shape[1]), want), rtol=0)


NOPE_INTERLEAVE = """
scheme rope { qk: rotate(geometric(10000.0) * position) }
scheme nope_t "NoPE with Llama 4's temperature" {
  param floor_scale: float (> 0) = 4.0
  param attn_scale: float (> 0) = 0.1
  temperature = log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1
  allow temperature_without_length
}
scheme nope_plain { }
scheme l4 {
  layers {
    default = rope
    every(2) = nope_t
  }
  train { arch = "llama" }
}
"""


@pytest.mark.parametrize("nope", ["nope_t", "nope_plain"])
def test_export_hf_of_nope_layers_as_llama4(tmp_path, nope):
    """RoPE layers with NoPE layers between them export as a Llama 4 text model (its no_rope_layers and
    temperature tuning) with the run's logits, past the positions where the temperature changes."""
    transformers = pytest.importorskip("transformers")
    f = tmp_path / "l4.pe"
    f.write_text(NOPE_INTERLEAVE.replace("every(2) = nope_t", f"every(2) = {nope}"))
    run = tmp_path / "run"
    assert run_cli("train", f, "--out", run, *TINY)[0] == 0
    code, out, err = run_cli("export", run, "--hf", tmp_path / "hf")
    assert code == 0, out + err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["no_rope_layers"] == [1, 0, 1] and config["attn_temperature_tuning"] == (nope == "nope_t")
    hf = transformers.Llama4ForCausalLM.from_pretrained(tmp_path / "hf").eval()
    from pedsl.study.common import open_run
    model, _, _ = open_run(run)
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    _assert_same_logits(hf, model, tokens)
