"""Hugging Face configs whose layers differ (Gemma 2 / 3, Llama 4 text, Qwen2, GPT-OSS) as pedsl `layers`
schemes: the layer map against the config classes' own layer types, the parts' ropes against the
one-rope import, the config fields written back, and `use_pedsl_attention` on tiny random models
(float64 logits and greedy `generate` against the native model)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from compiler_helpers import run_cli  # noqa: E402
from hf_helpers import (  # noqa: E402
    FLOAT32_STEPS, assert_matches_native, depth, float64_native, rounding, scaled_float64,
)
from pedsl.errors import InteropError  # noqa: E402
from pedsl.hf import use_pedsl_attention  # noqa: E402
from pedsl.hf.layered import (FULL, NOPE, SLIDING, export_layers, is_layered, layer_kinds,  # noqa: E402
                              layer_rules, layered_text)
from pedsl.hf.convert import import_config as import_any  # noqa: E402 - the dispatcher import-hf uses
from pedsl.hf.rope import import_config  # noqa: E402
from pedsl.lang.api import load  # noqa: E402

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, pad_token_id=0, bos_token_id=None, eos_token_id=None)
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}


def configs(n: int) -> dict:
    """Tiny configs of each family, built by transformers' own config classes (their defaults included)."""
    return {
        "gemma2": transformers.Gemma2Config(num_hidden_layers=n, sliding_window=5, **SMALL),
        "gemma3_text": transformers.Gemma3TextConfig(num_hidden_layers=n, sliding_window=5,
                                                     rope_parameters=copy.deepcopy(GEMMA3_ROPE), **SMALL),
        "llama4_text": transformers.Llama4TextConfig(num_hidden_layers=n, intermediate_size_mlp=48, num_local_experts=2,
                                                     floor_scale=4, attention_chunk_size=None, **SMALL),
        "qwen2": transformers.Qwen2Config(num_hidden_layers=n, use_sliding_window=True, max_window_layers=2,
                                          sliding_window=5, **SMALL),
        "gpt_oss": transformers.GptOssConfig(num_hidden_layers=n, num_local_experts=2, num_experts_per_tok=1,
                                           sliding_window=5, **SMALL),
    }


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 13, 26, 34])
@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "llama4_text", "qwen2", "gpt_oss"])
def test_layer_map_is_the_config_classes_own(family, n):
    cfg = configs(n)[family]
    d = cfg.to_dict()
    kinds = layer_kinds(d)
    if family == "llama4_text":
        assert [k != NOPE for k in kinds] == [bool(x) for x in cfg.no_rope_layers]
    else:
        assert [k if k != NOPE else FULL for k in kinds] == list(cfg.layer_types)
    # the rules written for the kinds give every layer its kind back (through the LayerMap of the checker)
    names = {k: f"p_{k.split('_')[0]}" for k in dict.fromkeys(kinds)}
    text = "".join(f"scheme {v} {{ }}\n" for v in names.values())
    text += "scheme m { layers {\n" + "\n".join(layer_rules(kinds, names)) + "\n} }\n"
    assert load(text, scheme="m", params={"layers": n}).layers.assign(n) == tuple(names[k] for k in kinds)
    # old config files without layer_types: the class's default rule
    legacy = {k: v for k, v in d.items() if k not in ("layer_types", "no_rope_layers")}
    if family in ("gemma2", "gpt_oss", "qwen2", "gemma3_text", "llama4_text"):
        assert layer_kinds(legacy) == kinds


def test_rules_read_like_the_models():
    def rules(family, n):
        kinds = layer_kinds(configs(n)[family].to_dict())
        return layer_rules(kinds, {k: k.split("_")[0] for k in dict.fromkeys(kinds)})
    assert rules("gemma3_text", 26) == ["pattern = [sliding * 5, full]"]
    assert rules("gemma2", 6) == ["pattern = [sliding, full]"]
    assert rules("llama4_text", 8) == ["pattern = [full * 3, nope]"]
    assert rules("qwen2", 6) == ["default = sliding", "first(2) = full"]
    assert layer_rules([FULL, SLIDING, FULL, FULL, SLIDING, FULL, SLIDING], {FULL: "f", SLIDING: "s"}) == \
        ["default = f", "at([1, 4, 6]) = s"]
    assert rules("gemma3_text", 6) == ["default = full", "first(5) = sliding"]  # a cycle seen once


def test_parts_carry_the_rope_of_their_layer_type_window_chunk_and_sink():
    c = configs(12)
    g3 = layered_text(c["gemma3_text"].to_dict())
    sliding, full, main = g3.split("\nscheme ")[1:4]
    assert "param base: float (> 1) = 10000.0" in sliding and "window = 5" in sliding and "factor" not in sliding
    assert "param base: float (> 1) = 1000000.0" in full and "qk: rotate(w * position / factor)" in full
    assert "window" not in full and "pattern = [gemma3_text_sliding * 5, gemma3_text_full]" in main
    assert "# query_pre_attn_scalar = 256: not positional" in g3
    # Gemma 3's legacy fields: rope_theta + rope_scaling for the global layers, rope_local_base_freq for the local
    legacy = {k: v for k, v in c["gemma3_text"].to_dict().items() if k != "rope_parameters"}
    legacy.update(rope_theta=1000000.0, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=10000.0)
    assert layered_text(legacy) == g3
    oss = layered_text(c["gpt_oss"].to_dict())
    assert oss.count("sink = logit") == 2 and "window = 5" in oss and "yarn(base, factor" in oss
    l4 = layered_text({**c["llama4_text"].to_dict(), "attention_chunk_size": 64,
                       "layer_types": None})
    assert "chunk = 64" in l4 and "layout interleaved" in l4 and "floor_scale: float (> 0) = 4.0" in l4
    assert "default = qwen2_sliding\n    first(2) = qwen2_full" in layered_text(c["qwen2"].to_dict())


def test_one_rope_import_refuses_layers_that_differ():
    for family in ("gemma2", "gemma3_text", "qwen2", "gpt_oss"):
        with pytest.raises(InteropError) as err:
            import_config(configs(6)[family].to_dict())
        assert err.value.code == "E961" and "layers scheme" in str(err.value)
    plain = transformers.Qwen2Config(num_hidden_layers=4, **SMALL).to_dict()  # no sliding window: one scheme
    assert not is_layered(plain) and import_any(plain) == import_config(plain)


def test_windowed_imports_load_as_layers_schemes():
    for family in ("gemma2", "gemma3_text", "qwen2", "gpt_oss"):
        assert load(import_any(configs(6)[family].to_dict())).layers is not None


def test_llama4_import_and_export_round_trip(tmp_path):
    d = configs(8)["llama4_text"].to_dict()
    sch = load(import_any(d), layers=8)
    assert sch.layers.assign(8) == tuple("llama4_text_nope" if not r else "llama4_text_full" for r in d["no_rope_layers"])
    back = export_layers(sch, 8)
    for key in ("no_rope_layers", "layer_types", "rope_parameters", "attn_temperature_tuning", "floor_scale",
                "attn_scale", "num_hidden_layers"):
        assert back[key] == d[key], key
    f = tmp_path / "l4.pe"
    code, out, err = run_cli("import-hf", "-o", f, json_file(tmp_path, d))
    assert code == 0 and f.read_text() == import_any(d)
    code, out, err = run_cli("export-hf", f, "-P", "layers=8")
    assert code == 0 and json.loads(out)["no_rope_layers"] == d["no_rope_layers"]
    code, out, err = run_cli("export-hf", f)
    assert code == 2 and "-P layers=N" in out + err


def json_file(tmp_path, d: dict):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


def _twins(native, ours):
    """(the native model's float64 twin, the pedsl model to hold to it): hf_helpers.float64_native, with the
    modules of FLOAT32_STEPS also run in float64 for Llama 4 and Gemma 2, on both sides (so the twin isolates
    every float32 step HF takes, and pedsl's own computation is what is compared). Measured: the twins then
    agree to 2e-15, where those steps left 4e-7."""
    if type(native).__name__.startswith(("Llama4", "Gemma2")):
        return float64_native(native, also=FLOAT32_STEPS), float64_native(ours, also=FLOAT32_STEPS)
    return float64_native(native), ours


def _matches(got, want, exact, L: int, config) -> None:
    """pedsl within float64 rounding of the twin, and of the native model within the floor its float32 steps
    cost here (hf_helpers.assert_matches_native)."""
    assert_matches_native(got, want, exact, depth(config, L))


def _llama4(n=4):
    torch.manual_seed(0)
    return scaled_float64(transformers.Llama4ForCausalLM(configs(n)["llama4_text"]))


def test_llama4_nope_layers_and_temperature_tuning_match_the_native_model():
    native = _llama4()
    ours = use_pedsl_attention(copy.deepcopy(native))
    exact, ours64 = _twins(native, ours)
    ids = torch.randint(1, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = native(ids).logits
        _matches(ours64(ids).logits, want, exact(ids).logits, 40, native.config)
    out_n = native.generate(ids[:1, :6], max_new_tokens=40, do_sample=False)
    out_p = ours.generate(ids[:1, :6], max_new_tokens=40, do_sample=False)
    assert out_p.shape[1] == 46 and torch.equal(out_n, out_p)
    # the temperature matters: the same layers without it (HF's tuning undone, nothing applied) differ
    text = import_any(native.config.to_dict()).replace(
        "  temperature = log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1\n", "")
    with torch.no_grad():
        other = use_pedsl_attention(copy.deepcopy(native), text)(ids).logits
    assert (other - want).abs().max() > 1e-3


def test_a_scheme_whose_window_is_not_the_models_mask_is_refused():
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(configs(4)["qwen2"]).to(torch.float64).eval()
    text = "scheme r { qk: rotate(geometric(10000.0) * position) }\nscheme m { layers { default = r } }\n"
    with pytest.raises(InteropError) as err:
        use_pedsl_attention(model, text)
    msg = str(err.value)
    assert err.value.code == "E964" and "layer 2: the model masks with window 5" in msg and "'r' has no window" in msg


def _mistral():
    """A tiny Mistral: sliding_window set and no layer_types, so HF masks every layer with the window."""
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(num_hidden_layers=3, sliding_window=5, **SMALL)
    return scaled_float64(transformers.MistralForCausalLM(cfg))


@pytest.mark.parametrize("band", ["", "window = 8", "window = 3", "chunk = 5"])
def test_one_scheme_whose_band_is_not_the_models_window_is_refused(band):
    """HF's mask applies Mistral's window whatever the scheme says: a scheme without it would give the model's
    logits while declaring (and training as) something else, so it is refused by name."""
    text = f"scheme r {{ qk: rotate(geometric(10000.0) * position)\n {band} }}\n"
    with pytest.raises(InteropError) as err:
        use_pedsl_attention(_mistral(), text)
    assert err.value.code == "E964" and "layer 0: the model masks with window 5 but the scheme 'r' has" in str(err.value)


def test_mistral_window_is_imported_and_matches_the_native_model_past_it():
    native = _mistral()
    assert "window = 5" in import_any(native.config.to_dict())
    ours = use_pedsl_attention(copy.deepcopy(native))
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(1))
    exact, ours64 = _twins(native, ours)
    with torch.no_grad():
        _matches(ours64(ids).logits, native(ids).logits, exact(ids).logits, 30, native.config)
    out_n = native.generate(ids[:1, :6], max_new_tokens=30, do_sample=False)
    assert torch.equal(out_n, ours.generate(ids[:1, :6], max_new_tokens=30, do_sample=False))


def test_layers_that_do_not_fit_the_model_are_refused():
    text = "scheme r { qk: rotate(geometric(10000.0) * position) }\nscheme m { layers { pattern = [r * 9] } }\n"
    from pedsl.errors import CheckError
    with pytest.raises(CheckError) as err:
        use_pedsl_attention(_llama4(), text)
    assert err.value.diagnostics[0].code == "E254"


def _native(family: str, n: int = 6):
    cfg = configs(n)[family]
    if family == "gemma2":  # a cap the scores reach (HF's default, 50, hardly bends these tiny models' scores)
        cfg.attn_logit_softcapping, cfg.query_pre_attn_scalar = 1.0, 2
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if family == "gpt_oss":
        model.set_experts_implementation("eager")  # the grouped kernel has no float64
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(4)
            if name.endswith("sinks"):  # HF's init leaves them empty: logits of their own
                p.normal_()
    return model


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "qwen2", "gpt_oss"])
def test_windowed_models_match_the_native_model_past_the_window(family):
    """Sliding windows of 5 (HF's masks; the parts' windows agree), Gemma 3's rope per layer type, Qwen2's
    first full layers, GPT-OSS's sinks (the parts take the layers' own logits) and YaRN: the native float64
    logits on 30 tokens and the same greedy tokens 30 past the prompt."""
    native = _native(family)
    ours = use_pedsl_attention(copy.deepcopy(native))
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(1))
    exact, ours64 = _twins(native, ours)
    with torch.no_grad():
        _matches(ours64(ids).logits, native(ids).logits, exact(ids).logits, 30, native.config)
    out_n = native.generate(ids[:1, :6], max_new_tokens=30, do_sample=False)
    out_p = ours.generate(ids[:1, :6], max_new_tokens=30, do_sample=False)
    assert out_p.shape[1] == 36 and torch.equal(out_n, out_p)


def test_gemma2_soft_cap_imports_matters_and_exports():
    """import-hf writes attn_logit_softcapping as every part's softcap; the native model with the cap differs
    from the same weights without it (so the logits test above checks the cap); a scheme without the model's
    cap, or with another, is refused; export-hf writes it back."""
    d = configs(6)["gemma2"].to_dict()
    text = import_any(d)
    assert text.count("softcap = 50.0") == 2 and "attn_logit_softcapping" not in text
    assert export_layers(load(text, layers=6), 6)["attn_logit_softcapping"] == 50.0
    full = {**d, "layer_types": ["full_attention"] * 6}  # no window in any layer: the cap alone makes it layered
    assert is_layered(full) and load(import_any(full)).layers.parts["gemma2_full"].softcap == 50.0
    with pytest.raises(InteropError) as err:
        import_any({**d, "attn_logit_softcapping": -3})
    assert err.value.code == "E963" and "attn_logit_softcapping" in str(err.value)
    mixed = text.replace("softcap = 50.0\n", "", 1)
    with pytest.raises(InteropError) as err:
        export_layers(load(mixed, layers=6), 6)
    assert err.value.code == "E962" and "soft-caps its layers differently" in str(err.value)
    native = _native("gemma2")
    ids = torch.randint(1, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    uncapped = copy.deepcopy(native)
    uncapped.config.attn_logit_softcapping = None
    for layer in uncapped.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    with torch.no_grad():
        assert (uncapped(ids).logits - native(ids).logits).abs().max() > 1e-3
    own = import_any(native.config.to_dict())
    for other, words in ((own.replace("  softcap = 1.0\n", ""), "has no softcap"),
                         (own.replace("softcap = 1.0", "softcap = 2.0"), "caps at 2")):
        with pytest.raises(InteropError) as err:
            use_pedsl_attention(copy.deepcopy(native), other)
        assert err.value.code == "E964" and "soft-caps its attention scores at 1" in str(err.value) and words in str(err.value)


def test_the_windows_ropes_and_sinks_matter():
    """Controls: the same models under schemes that differ in one feature give other logits or are refused."""
    ids = torch.randint(1, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    native = _native("gemma3_text")
    text = import_any(native.config.to_dict())
    swapped = text.replace("param base: float (> 1) = 10000.0", "param base: float (> 1) = 1000000.0")
    with torch.no_grad():
        diff = (use_pedsl_attention(copy.deepcopy(native), swapped)(ids).logits - native(ids).logits).abs().max()
    assert diff > 1e-3  # the local layers' base is read per layer type
    oss = _native("gpt_oss")
    with pytest.raises(InteropError) as err:
        use_pedsl_attention(copy.deepcopy(oss), import_any(oss.config.to_dict()).replace("  sink = logit\n", ""))
    assert "the model has a sink logit per head but the scheme's part" in str(err.value)
    with pytest.raises(InteropError) as err:
        use_pedsl_attention(copy.deepcopy(oss), import_any(oss.config.to_dict()).replace("window = 5", "window = 6"))
    assert "masks with window 5" in str(err.value) and "window 6" in str(err.value)


def _spy_banded(monkeypatch):
    """Record (window, chunk) of every call of the banded kernels (the C++ band kernel or the flash path's banded
    calls: ``window_attend`` picks) the general forward makes."""
    from pedsl.compiler.general import attention as general_attention
    seen, real = [], general_attention.window_attend

    def spy(band, ready, q, k, v, window, chunk):
        seen.append((window, chunk))
        return real(band, ready, q, k, v, window, chunk)

    monkeypatch.setattr(general_attention, "window_attend", spy)
    return seen


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2", "llama4_chunked"])
def test_an_unpadded_prompt_takes_the_banded_kernel_and_a_padded_batch_the_masks(family, monkeypatch):
    """HF hands the attention a 4-D mask; where it is the layer's own causal band (a fresh unpadded batch)
    the sliding (chunked) layers run the banded kernel and give the native logits past the window; a
    left-padded batch (padded key slots inside the band) keeps the masked path and the native logits in
    every row (Llama 4: HF's mask starts the padded row's chunks at its first token)."""
    if family == "llama4_chunked":
        cfg = transformers.Llama4TextConfig(num_hidden_layers=4, intermediate_size_mlp=48, num_local_experts=2,
                                            floor_scale=4, attention_chunk_size=8, **SMALL)
        torch.manual_seed(0)
        native = transformers.Llama4ForCausalLM(cfg).to(torch.float64).eval()
        want_band = (None, 8)
    else:
        native, want_band = _native(family), (5, None)
    ours = use_pedsl_attention(copy.deepcopy(native))
    seen = _spy_banded(monkeypatch)
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(3))
    exact, ours64 = _twins(native, ours)
    with torch.no_grad():
        got = ours64(ids).logits
    assert seen and set(seen) == {want_band}
    with torch.no_grad():
        _matches(got, native(ids).logits, exact(ids).logits, 30, native.config)
    seen.clear()
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :7] = 0  # row 1 left-padded by 7 tokens
    with torch.no_grad():
        got, want, e = (m(ids, attention_mask=mask).logits for m in (ours64, native, exact))
    assert seen == []
    _matches(got[0], want[0], e[0], 30, native.config)
    _matches(got[1, 7:], want[1, 7:], e[1, 7:], 30, native.config)


def _padded_native(family: str):
    """A tiny float64 model with windowed layers: Llama 4 with chunks of 8 and its NoPE temperature layer
    (floor_scale 4, so the temperature changes every 4 tokens), or Gemma 3 / Qwen2 with windows of 5."""
    if family != "llama4_chunked":
        return _native(family)
    cfg = transformers.Llama4TextConfig(num_hidden_layers=4, intermediate_size_mlp=48, num_local_experts=2,
                                        floor_scale=4, attention_chunk_size=8, **SMALL)
    torch.manual_seed(0)
    return scaled_float64(transformers.Llama4ForCausalLM(cfg))


@pytest.mark.parametrize("family", ["llama4_chunked", "gemma3_text", "qwen2"])
def test_a_left_padded_batch_matches_the_native_model_in_every_row(family):
    """What HF computes for a left-padded row: a plain forward (no position_ids) rotates at the slot index,
    `generate` at the row's own positions (cumsum of the mask); Llama 4 starts the row's chunks at its first
    real token in both and tunes the NoPE layers' temperature by the slot index (padding counted); a sliding
    window is by slot index, which the positions' differences equal. pedsl takes the band from HF's mask:
    float64 logits of every real token of both rows past the chunk (window), and the same greedy tokens for
    a batch of two prompts, one left-padded by 3 (not a multiple of the chunk), 30 tokens past it."""
    native = _padded_native(family)
    ours = use_pedsl_attention(copy.deepcopy(native))
    exact, ours64 = _twins(native, ours)
    ids = torch.randint(1, 96, (2, 27), generator=torch.Generator().manual_seed(5))
    for pad in (3, 11):
        mask = torch.ones(2, 27, dtype=torch.long)
        mask[1, :pad] = 0
        with torch.no_grad():
            got, want, e = (m(ids, attention_mask=mask).logits for m in (ours64, native, exact))
        _matches(got[0], want[0], e[0], 27, native.config)
        _matches(got[1, pad:], want[1, pad:], e[1, pad:], 27, native.config)
    prompts = ids[:, :10].clone()
    prompts[1, :3] = 0
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    out_n = native.generate(prompts, attention_mask=mask, max_new_tokens=30, do_sample=False)
    out_p = ours.generate(prompts, attention_mask=mask, max_new_tokens=30, do_sample=False)
    assert out_p.shape == (2, 40) and torch.equal(out_n, out_p)


def test_a_mask_covers_the_band_only_where_every_entry_of_the_band_is_true():
    """The check behind the dispatch reads every entry of the band: one missing entry anywhere (or a
    float mask) keeps the masked path; entries outside the band do not matter."""
    from pedsl.compiler.general import Shape
    from pedsl.hf.attention_call import mask_covers_band
    L = 37
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    for shape, band in ((None, j <= i), (Shape(5, None), (j <= i) & (i - j < 5)),
                        (Shape(None, 8), (j <= i) & (i // 8 == j // 8)), (Shape(40, None), j <= i)):
        m = band[None, None].expand(2, 1, L, L)
        assert mask_covers_band(m, shape) and mask_covers_band(torch.ones(2, 1, L, L, dtype=torch.bool), shape)
        assert not mask_covers_band(m.float(), shape)
        for a, b in band.nonzero()[:: 7].tolist() + [[L - 1, L - 1], [0, 0]]:
            holed = m.clone()
            holed[1, 0, a, b] = False
            assert not mask_covers_band(holed, shape), (shape, a, b)


def test_a_one_part_chunk_on_a_plain_model_follows_the_positions_in_a_padded_batch():
    """A one-part scheme's chunk is over its positions (p // chunk), HF's mask being plain causal: a
    left-padded row given positions that start at its first real token (as `generate` gives them) equals
    the same row alone, in float64; given slot indices (a plain forward without position_ids) its chunks
    start at slot 0, so the answer differs - the two calls say different positions."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = use_pedsl_attention(LlamaForCausalLM(cfg).double().eval(),
                                scheme='import "rope.pe"\nscheme chunked extends rope { chunk = 4 }')
    ids = torch.randint(1, 96, (2, 15), generator=torch.Generator().manual_seed(5))
    pad = 3
    mask = torch.ones(2, 15, dtype=torch.long)
    mask[1, :pad] = 0
    with torch.no_grad():
        alone = model(ids[1:, pad:]).logits[0]
        by_position = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        by_slot = model(ids, attention_mask=mask).logits
    # float64 both ways; the padded row's softmax also sums the masked slots' zeros
    torch.testing.assert_close(by_position[1, pad:], alone, atol=rounding(depth(model.config, 15), alone), rtol=0)
    assert (by_slot[1, pad:] - alone).abs().max() > 1e-3
