"""Model types whose rotary is set per layer or per call, taught from their modeling files: Granite SWA's rope base
per layer (layer_rope_theta, 0 a NoPE layer) with a sink logit per head, PhiMoE's LongRoPE (short_factor at
every length, cos and sin times one mscale), Beam's NoPE full layers whose q the model scales by position, 
RecurrentGemma's window, held under attention_window_size, and Mistral 4's MLA with Llama 4's q scale. Each a tiny random float64 model from its own config class against
the native model's logits (its float64 twin, hf_helpers) and greedy tokens, with a scheme that reads the field
otherwise differing; the configs pedsl cannot carry refused naming the field."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_helpers import FLOAT32_STEPS, assert_matches_native, depth, float64_native, scaled_float64  # noqa: E402
from pedsl.errors import InteropError  # noqa: E402
from pedsl.hf import import_config, use_pedsl_attention  # noqa: E402
from tools import hf_sweep  # noqa: E402

L = 20
FAR = torch.arange(L)[None, :] + 6000  # positions where Beam's NoPE scale is 1.15, not 1.001 as at 0 .. 20


def _native(model_type: str, **fields):
    """The sweep's tiny config of the type (its EXTRA fields: the interesting values) in float64, eager attention."""
    cfg = hf_sweep.tiny_config(model_type)
    cfg = type(cfg)(**{**cfg.to_dict(), **fields})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the grouped matmul of experts takes no float64
    torch.manual_seed(0)
    return scaled_float64(hf_sweep._model_class(model_type).from_config(cfg))  # Mistral 4: image-text-to-text


def _ids():
    return torch.randint(1, 128, (2, L), generator=torch.Generator().manual_seed(3))


def _assert_exact(native, text: str, **kw) -> None:
    """pedsl with ``text`` within float64 rounding of the native model's float64 twin (``kw``: more inputs, the
    same on every side), the same greedy tokens."""
    ours = use_pedsl_attention(copy.deepcopy(native), text)
    # the twins: HF's float32 steps (RMSNorm, the eager attention's sink scale) in float64 on both sides, so what
    # is compared is pedsl's attention against HF's (as test_hf_layered's Gemma 2 / Llama 4 twins)
    twin, ours64 = float64_native(native, also=FLOAT32_STEPS), float64_native(ours, also=FLOAT32_STEPS)
    ids = _ids()
    with torch.no_grad():
        assert_matches_native(ours64(ids, **kw).logits, native(ids, **kw).logits, twin(ids, **kw).logits,
                              depth(native.config, L))
    out_n = native.generate(ids[:1, :6], max_new_tokens=16, do_sample=False)
    assert torch.equal(out_n, ours.generate(ids[:1, :6], max_new_tokens=16, do_sample=False))


def _differs(native, text: str, **kw) -> bool:
    ids = _ids()
    with torch.no_grad():
        other = use_pedsl_attention(copy.deepcopy(native), text)(ids, **kw).logits
        return float((other - native(ids, **kw).logits).abs().max()) > 1e-3


def test_granite_swa_gives_each_layer_its_rope_base_and_a_sink():
    """layer_rope_theta [0, 5e4, 2e4, 5e4] over full / sliding layers: a NoPE full layer, a full layer at 2e4, the
    sliding layers at 5e4 with the window; learned (non-zero) sinks. Swapping the bases, or dropping the sink,
    differs."""
    native = _native("granite_swa")
    with torch.no_grad():
        for layer in native.model.layers:
            layer.self_attn.sinks.normal_(0, 2)
    text = import_config(json.loads(native.config.to_json_string()))
    assert "at([0]) = granite_swa_nope" in text and "at([2]) = granite_swa_full" in text
    assert "= 20000.0" in text and "= 50000.0" in text and text.count("sink = logit") == 3
    _assert_exact(native, text)
    assert _differs(native, text.replace("= 20000.0", "= 70000.0"))
    unsunk = use_pedsl_attention  # the sinks are the layers' own: a part without one is refused, not ignored
    with pytest.raises(InteropError, match="sink"):
        unsunk(copy.deepcopy(native), text.replace("  sink = logit\n", ""))


def test_granite_swa_layers_of_one_kind_with_two_bases_are_refused_naming_layer_rope_theta():
    cfg = hf_sweep.tiny_config("granite_swa").to_dict()
    cfg["layer_rope_theta"] = [0, 5e4, 2e4, 3e4]  # the two sliding layers at different bases
    with pytest.raises(InteropError, match=r"layer_rope_theta .*sliding_attention layers"):
        import_config(cfg)
    cfg["layer_rope_theta"] = [1e4, -1, 1e4, 1e4]
    with pytest.raises(InteropError, match="layer_rope_theta must list"):
        import_config(cfg)


def test_phimoe_rotates_with_its_short_factors_at_every_length_times_its_mscale():
    """PhiMoE's longrope past original = 8: short_factor at every length and cos, sin times mscale 1.25, exact; the
    scheme with its long factors past the original length, or without the scale, differs."""
    native = _native("phimoe")
    rp = native.config.rope_parameters
    text = import_config(json.loads(native.config.to_json_string()))
    assert "attention_factor: float (>= 0) = 1.25" in text and "short_factor at every length" in text
    _assert_exact(native, text)
    long = "[" + ", ".join(str(float(x)) for x in rp["long_factor"]) + "]"
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  let long_factor"))
    assert _differs(native, "\n".join(lines[:at] + [f"  let long_factor = {long}"] + lines[at + 1:]))
    assert _differs(native, text.replace("= 1.25", "= 1.0"))


@pytest.mark.parametrize(("change", "match"), [({"long_mscale": 1.5}, "short_mscale .* long_mscale"),
                                               ({"rope_type": "yarn", "factor": 2.0}, "rope_type 'yarn'")])
def test_phimoe_mscales_that_differ_and_other_rope_types_are_refused_naming_them(change, match):
    cfg = hf_sweep.tiny_config("phimoe").to_dict()
    cfg["rope_parameters"] = {**cfg["rope_parameters"], **change}
    with pytest.raises(InteropError, match=match):
        import_config(cfg)


def test_beam_nope_layers_carry_its_scalable_softmax_scale_as_their_temperature():
    """Beam's full layers (rope_parameters null) scale q by exp(0.1 * log1p((position + 1) / 2048)) from the
    position_ids: the NoPE part's temperature, the model's own undone; exact at positions 6000.., where the same
    layers without the temperature differ."""
    native = _native("beam")
    text = import_config(json.loads(native.config.to_json_string()))
    assert "temperature = exp(0.1 * log(1 + (position + 1) / 2048))" in text and "first(3) = beam_sliding" in text
    _assert_exact(native, text, position_ids=FAR)
    assert _differs(native, text.replace("  temperature = exp(0.1 * log(1 + (position + 1) / 2048))\n", ""),
                    position_ids=FAR)


def test_recurrent_gemma_windows_its_attention_blocks_by_attention_window_size():
    """Its config file holds the window as attention_window_size (sliding_window only through the config class's
    attribute_map): imported as every attention block's window, its first half rotating; a scheme without the
    window is refused by the adapter (HF's mask would window it anyway)."""
    native = _native("recurrent_gemma")
    cfg = json.loads(native.config.to_json_string())
    assert "sliding_window" not in cfg and cfg["attention_window_size"] == 6
    text = import_config(cfg)
    assert "window = 6" in text and "rot = fraction(partial_rotary_factor)" in text
    _assert_exact(native, text)
    with pytest.raises(InteropError, match="the model masks with window 6"):
        use_pedsl_attention(copy.deepcopy(native), text.replace("  window = 6\n", ""))


def test_mistral4_mla_with_llama4_q_scale_is_one_temperature():
    """Mistral 4: DeepSeek-V3's MLA (YaRN, its softmax mscale) whose rotary reads head_dim = the whole query/key
    head and partial_rotary_factor 0.5 of it, and q times 1 + beta * log(1 + floor(position / 8)): both scales in
    one temperature, exact; without the q scale it differs; a factor giving another rotary width is refused."""
    native = _native("mistral4")
    text = import_config(json.loads(native.config.to_json_string()))
    q_scale = "(1 + llama_4_scaling_beta * log(1 + floor(position / scaling_original)))"
    assert f"log(factor) + 1) * {q_scale}" in text and "rope_head_dim: int (>= 2, <= head_dim) = 8" in text
    _assert_exact(native, text)
    assert _differs(native, text.replace(f" * {q_scale}", ""))
    cfg = json.loads(native.config.to_json_string())
    cfg["rope_parameters"]["partial_rotary_factor"] = 0.25
    with pytest.raises(InteropError, match="partial_rotary_factor 0.25 of head_dim 16"):
        import_config(cfg)
