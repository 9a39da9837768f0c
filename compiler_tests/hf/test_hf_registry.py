"""The model-type registry (pedsl/hf/registry.py) that import-hf and use_pedsl_attention both read: untaught
types refused by name, the silently-wrong configs of the past imported as the native model computes them
(checked against the native model, float32, tools.hf_sweep's comparison), and the registry's defaults checked
against the installed config classes."""

from __future__ import annotations

import copy
import json

import pytest

from pedsl.errors import InteropError, PedslError
from pedsl.hf import import_config
from pedsl.hf.registry import REGISTRY, layer_kinds
from pedsl.lang.api import load
from compiler_tests.compiler_helpers import run_cli

transformers = pytest.importorskip("transformers")
from tools import hf_sweep  # noqa: E402


def _native(model_type: str, **fields):
    cfg = hf_sweep.tiny_config(model_type)
    for k, v in fields.items():
        setattr(cfg, k, v)
    cfg = type(cfg)(**{**cfg.to_dict(), **fields})
    cfg._attn_implementation = "sdpa"
    import torch

    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError:  # a model without SDPA (VaultGemma): its eager attention, as tools.hf_sweep builds it
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model = model.float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


def _exact(native) -> str:
    """The imported text, after checking use_pedsl_attention's logits and greedy tokens against the native model."""
    from pedsl.hf import use_pedsl_attention

    text = import_config(json.loads(native.config.to_json_string()))
    ours = use_pedsl_attention(copy.deepcopy(native))
    worst, scale, what, bad = hf_sweep.compare(native, ours)
    assert not bad, (bad, what)
    return text


# ---------------------------------------------------------------------- refused by name


def test_an_untaught_model_type_is_refused_naming_the_field(tmp_path):
    cfg = {"model_type": "baichuan", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    for mt in ("baichuan", "some_future_model"):
        with pytest.raises(InteropError) as err:
            import_config({**cfg, "model_type": mt})
        assert f"model_type '{mt}'" in str(err.value)
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "model_type": "some_future_model"}))
    code, out, err = run_cli("import-hf", f)
    assert code != 0 and code != 3 and "some_future_model" in err and not out


def test_bloom_with_its_real_keys_is_refused_as_alibi():
    cfg = transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=64).to_dict()
    assert "n_head" in cfg
    for c in (cfg, {**cfg, "num_attention_heads": 4}):
        with pytest.raises(InteropError, match="model_type 'bloom'.*ALiBi"):
            import_config(c)


def test_falcon_rotary_is_exact_and_its_bfloat16_alibi_refused_naming_alibi():
    from pedsl.hf import use_pedsl_attention

    text = _exact(_native("falcon"))
    assert "geometric(base)" in text
    native = _native("falcon", alibi=True)
    with pytest.raises(InteropError, match="model_type 'falcon'.*alibi = true.*bfloat16"):
        import_config(json.loads(native.config.to_json_string()))
    with pytest.raises(PedslError, match="falcon.*alibi"):
        use_pedsl_attention(copy.deepcopy(native))


def test_ministral3_llama_4_scaling_beta_is_the_schemes_temperature():
    """Ministral 3 multiplies q by 1 + beta * log(1 + floor(position / original)): written as the scheme's
    temperature (the adapter undoes the model's own), exact past three multiples of original = 8; the same scheme
    without the temperature differs, so the comparison sees the scale."""
    from pedsl.hf import use_pedsl_attention

    native = _native("ministral3", sliding_window=None, **hf_sweep.EXTRA["ministral3"])
    text = _exact(native)
    assert "temperature = 1 + llama_4_scaling_beta * log(1 + floor(position / scaling_original))" in text
    assert "scaling_original: int (>= 1) = 8" in text
    plain = "\n".join(line for line in text.splitlines() if "temperature" not in line)
    ours = use_pedsl_attention(copy.deepcopy(native), plain)
    assert hf_sweep.compare(native, ours)[3]
    cfg = json.loads(native.config.to_json_string())
    del cfg["rope_parameters"]["original_max_position_embeddings"]
    with pytest.raises(InteropError, match="original_max_position_embeddings"):
        import_config(cfg)


def test_doge_rotary_is_exact_and_its_window_refused_naming_sliding_window():
    """Doge's dynamic float mask is content-dependent: without a window its mask passes through HF's rotary path
    untouched (exact); with one, pedsl's windowed layers would need HF's boolean mask: refused by the field."""
    native = _native("doge", sliding_window=None)
    assert "window" not in _exact(native)
    with pytest.raises(InteropError, match="model_type 'doge' with a sliding_window"):
        import_config({**json.loads(native.config.to_json_string()), "sliding_window": 6})


def test_nanochat_rotates_the_other_way_round():
    """NanoChat's rotate_half is cat(x2, -x1): written as the rotation by minus the phase, exact; the usual
    direction differs."""
    from pedsl.hf import use_pedsl_attention

    native = _native("nanochat")
    text = _exact(native)
    assert "rotate(-(w * position))" in text
    ours = use_pedsl_attention(copy.deepcopy(native), text.replace("rotate(-(w * position))", "rotate(w * position)"))
    assert hf_sweep.compare(native, ours)[3]


def test_hybrids_without_rotary_are_nope_not_rope():
    """Jamba's, Nemotron-H's and Zamba's attention layers apply no rotary: written as NoPE (their Mamba layers
    untouched); Zamba checked exact here, Jamba by the fast sweep slice, all three by the full sweep."""
    for model_type in ("jamba", "nemotron_h"):
        text = import_config(hf_sweep.tiny_config(model_type).to_dict())
        assert "NoPE" in text and "rotate" not in text and not load(text).transports
    text = _exact(_native("zamba", **hf_sweep.EXTRA["zamba"]))
    assert "NoPE" in text and not load(text).transports


def test_granite_4_h_rotates_only_when_its_position_embedding_type_is_rope():
    cfg = hf_sweep.tiny_config("granitemoehybrid").to_dict()
    for value in (None, "nope"):
        nope = import_config({**cfg, "position_embedding_type": value})
        assert not load(nope).transports and "position_embedding_type" in nope
    rope = import_config({**cfg, "position_embedding_type": "rope"})
    assert load(rope).transports and "geometric(base)" in rope


# ---------------------------------------------------------------------- imported as the native model computes them


@pytest.mark.parametrize("model_type", ["mistral", "mixtral", "starcoder2"])
def test_a_sliding_window_without_layer_types_is_every_layers_window(model_type):
    native = _native(model_type, sliding_window=6)
    assert "layer_types" not in {k for k, v in native.config.to_dict().items() if v} or model_type != "mistral"
    text = _exact(native)
    assert "window = 6" in text and load(text).layers is not None


def test_the_sweep_marks_an_import_that_drops_the_window_different(monkeypatch):
    """HF's mask would hide a window import-hf dropped (same logits): the adapter refuses the scheme, and the
    sweep reports the import as DIFFERENT, not refused or exact."""
    import re

    import pedsl.hf.attention as adapter

    dropped = lambda cfg: re.sub(r"\n *window = \d+", "", import_config(cfg))  # noqa: E731
    monkeypatch.setattr(adapter, "import_config", dropped)
    res = hf_sweep.sweep_one("mistral")
    assert res.state == "DIFFERENT" and "the model masks with window" in res.reason and "has no window" in res.reason


def test_the_window_check_reads_a_composite_models_text_layers():
    """Qwen2-VL's layer count is its text config's: the adapter's window check reads the layers from there."""
    res = hf_sweep.sweep_one("qwen2_vl")
    assert res.state == "exact", res.reason


def test_exaone4_rotates_only_its_sliding_layers():
    native = _native("exaone4", sliding_window=6)
    text = _exact(native)
    sch = load(text, layers=4)
    parts = [sch.layers.parts[n] for n in sch.layers.assign(4)]
    assert [bool(p.transports) for p in parts] == [True, True, True, False]
    assert [p.window for p in parts] == [6, 6, 6, None]


def test_olmo3_sliding_layers_default_rope_full_layers_yarn():
    rp = {"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                             "rope_theta": 1e4},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    native = _native("olmo3", sliding_window=6, rope_parameters=rp, max_position_embeddings=32)
    text = _exact(native)
    assert "yarn(" in text and "window = 6" in text
    sch = load(text, layers=4)
    assert [sch.layers.parts[n].window for n in sch.layers.assign(4)] == [6, 6, 6, None]


def test_olmo3_legacy_rope_scaling_goes_to_the_full_layers():
    cfg = {"model_type": "olmo3", "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64,
           "max_position_embeddings": 64, "sliding_window": 6,
           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    text = import_config(cfg)
    full, sliding = text.split("scheme olmo3_full")[1], text.split("scheme olmo3_sliding")[1].split("scheme")[0]
    assert "/ factor" in full.split("scheme")[0] and "/ factor" not in sliding
    assert "500000.0" in sliding  # OLMo 3's default_theta, not 10000


def test_smollm3_no_rope_layers_are_nope():
    native = _native("smollm3")
    text = _exact(native)
    assert "NoPE layer" in text


# ---------------------------------------------------------------------- hostile configs (import-hf and paths)


def test_llama4_nope_layers_without_heads_are_a_config_error(tmp_path):
    cfg = {"model_type": "llama4_text", "num_hidden_layers": 4, "no_rope_layers": [0, 0, 1, 1],
           "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    code, out, err = run_cli("import-hf", f)
    assert code not in (0, 3) and "num_attention_heads" in err, err
    f.write_text(json.dumps({**cfg, "num_attention_heads": 4}))
    code, out, err = run_cli("import-hf", f)
    assert code not in (0, 3) and "head_dim" in err, err


def test_gemma3_rope_per_layer_type_that_is_not_an_object_is_refused():
    cfg = transformers.Gemma3TextConfig(num_hidden_layers=6, sliding_window=6).to_dict()
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "sliding_attention": "x"}
    with pytest.raises(InteropError, match="rope_parameters.sliding_attention must be an object"):
        import_config(cfg)


# ---------------------------------------------------------------------- the registry against the installed classes


@pytest.mark.parametrize("model_type", sorted(mt for mt, f in REGISTRY.items() if not f.refused
                                              and mt in transformers.CONFIG_MAPPING))
def test_registry_default_theta_is_the_config_classes(model_type):
    cls = type(transformers.CONFIG_MAPPING[model_type]().get_text_config())  # a composite's text model
    field = getattr(cls, "rope_theta", None)  # a class whose __post_init__ fills rope_parameters from its field
    want = field if isinstance(field, (int, float)) else getattr(cls, "default_theta", 10000.0)
    want = want["global"] if isinstance(want, dict) else want
    assert REGISTRY[model_type].theta == want


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text", "olmo3", "exaone4", "qwen2", "qwen3", "ministral",
                                        "smollm3", "gpt_oss"])
def test_registry_layer_types_are_the_config_classes(model_type):
    """A file without layer_types: the registry's defaults equal what the config class fills in."""
    cls = transformers.CONFIG_MAPPING[model_type]
    kw = dict(num_hidden_layers=8, sliding_window=6, use_sliding_window=True, max_window_layers=3)
    cfg = cls(**kw).to_dict()
    raw = {k: v for k, v in cfg.items() if k not in ("layer_types", "no_rope_layers")}
    assert layer_kinds(raw) == layer_kinds(cfg)


# ---------------------------------------------------------------------- the sweep and its table


def test_the_compatibility_table_is_not_stale():
    """docs/hf-compatibility.md (python -m tools.hf_sweep) has one row per swept type of the installed
    transformers, its taught column is the registry's, a registry refusal is a refused row, an untaught
    type is never exact, and no row is imported-but-different."""
    from pedsl.hf.registry import REGISTRY

    text = hf_sweep.DOC.read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] != "model type":
            rows[cells[0]] = cells
    assert set(rows) == set(hf_sweep.causal_types()), "regenerate with: python -m tools.hf_sweep"
    for mt, (_, taught, state, *_) in rows.items():
        assert taught == ("yes" if mt in REGISTRY else "no"), mt
        assert state in hf_sweep.STATES and state != "DIFFERENT", (mt, state)
        if mt in REGISTRY and REGISTRY[mt].refused:
            assert state in ("refused", "cannot instantiate"), (mt, state)
        if mt not in REGISTRY:
            assert state != "exact", mt


@pytest.mark.parametrize("model_type", hf_sweep.FAST)
def test_fast_sweep_slice(model_type):
    """A representative slice of the sweep: each type exact, refused by name, or not applicable."""
    r = hf_sweep.sweep_one(model_type)
    assert r.state in ("exact", "refused", "not applicable"), (r.state, r.reason)
    if r.state == "refused":
        assert f"'{model_type}'" in r.reason or model_type in r.reason, r.reason
    if model_type in REGISTRY and not REGISTRY[model_type].refused:
        assert r.state == "exact", r.reason


def test_hunyuan_alpha_ntk_is_its_fixed_base():
    """HunYuan's rope_type 'dynamic' with an alpha is a fixed base theta * alpha ** (d / (d - 2)) (its own rotary),
    not HF's dynamic NTK: imported as that base, exact against the native model."""
    rp = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 1e4}
    native = _native("hunyuan_v1_dense", rope_parameters=rp)
    text = _exact(native)
    assert f"= {1e4 * 1000.0 ** (16 / 14)!r}" in text or "default rotary" in text
    assert "dynamic_ntk" not in text


# ---------------------------------------------------------------------- interleaved pairs and local-only rotations


@pytest.mark.parametrize("model_type", ["cohere", "ernie4_5", "glm"])
def test_interleaved_families_are_written_interleaved_and_exact(model_type):
    text = _exact(_native(model_type))
    assert "layout interleaved" in text
    assert ("fraction(partial_rotary_factor)" in text) == (model_type == "glm")  # GLM: the first half, paired


def test_glm4_moe_rotates_the_first_half_in_halves_layout():
    text = _exact(_native("glm4_moe"))
    assert "layout halves" in text and "fraction(partial_rotary_factor)" in text


def _rotating_parts(text: str) -> list[bool]:
    sch = load(text, layers=4)
    return [bool(sch.layers.parts[n].transports) for n in sch.layers.assign(4)]


def test_cohere2_rotates_its_sliding_layers_only_and_none_without_a_window():
    native = _native("cohere2", sliding_window=6)
    types = native.config.layer_types
    assert _rotating_parts(_exact(native)) == [t == "sliding_attention" for t in types]
    cfg = {**json.loads(native.config.to_json_string()), "sliding_window": None}
    assert _rotating_parts(import_config(cfg)) == [False] * 4  # HF: sliding_window is None -> no layer rotates


@pytest.mark.parametrize("pattern", [1, 2])
def test_cohere2_moe_force_rope_rotates_its_dense_layers_when_the_prefix_pattern_is_1(pattern):
    native = _native("cohere2_moe", sliding_window=6, prefix_dense_sliding_window_pattern=pattern,
                     **hf_sweep.EXTRA["cohere2_moe"])
    assert _rotating_parts(_exact(native)) == [pattern == 1, True, True, False]
    cfg = {k: v for k, v in json.loads(native.config.to_json_string()).items() if k != "mlp_layer_types"}
    with pytest.raises(InteropError, match="mlp_layer_types"):
        import_config(cfg)


def test_afmoe_rotates_the_layers_its_layer_types_call_sliding():
    native = _native("afmoe", sliding_window=6)
    assert _rotating_parts(_exact(native)) == [t == "sliding_attention" for t in native.config.layer_types]


def test_a_layer_types_family_without_layer_types_is_refused_naming_it():
    cfg = {k: v for k, v in json.loads(_native("kolibri1").config.to_json_string()).items() if k != "layer_types"}
    with pytest.raises(InteropError, match="layer_types"):
        import_config(cfg)


@pytest.mark.parametrize("model_type", ["param2moe", "minimax_m2"])
def test_partial_rotary_factor_rotates_the_first_channels(model_type):
    """GLM-4-MoE's model class (and MiniMax-M2's) rotate the first int(head_dim * partial_rotary_factor) channels."""
    rp = {"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 0.5}
    text = _exact(_native(model_type, rope_parameters=rp))
    assert "fraction(partial_rotary_factor)" in text and "layout halves" in text


@pytest.mark.parametrize(("model_type", "window"), [("solar_open", False), ("minimax", True),
                                                   ("vaultgemma", True), ("mellum", True), ("cwm", True),
                                                   ("modernbert-decoder", True), ("dots1", True),
                                                   ("jetmoe", False), ("minicpm5_moe", False), ("lfm2_moe", False)])
def test_newly_taught_families_are_exact_with_their_windows(model_type, window):
    """MiniMax windows every attention layer, VaultGemma alternates as Gemma 2, Mellum and ModernBERT's decoder read
    layer_types and a rope per layer type (a mix of both kinds here), CWM layer_types with Llama 3's rope; Solar
    Open, JetMoE (q from experts), MiniCPM5-MoE (gated q) and LFM2-MoE (rotary named pos_emb) have no window."""
    text = _exact(_native(model_type, sliding_window=6, **hf_sweep.EXTRA.get(model_type, {})))
    assert ("window = 6" in text) == window


def test_qwen3_next_rotates_the_first_quarter():
    """Qwen3-Next / Qwen3.5 rotate int(head_dim * partial_rotary_factor) channels (0.25 by default); exact by the
    sweep (their gated-delta layers are slow on CPU)."""
    for model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        text = import_config(hf_sweep.tiny_config(model_type).to_dict())
        assert "fraction(partial_rotary_factor)" in text and "layout halves" in text and "= 0.25" in text


def test_exaone_is_llamas_model_class_which_rotates_every_channel():
    rp = {"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 0.5}
    text = _exact(_native("exaone", rope_parameters=rp))
    assert "fraction(" not in text and "every channel rotates" in text


def test_lara_mini_and_flint_rotate_their_sliding_layers_only():
    """LARA mini passes its rotary to the sliding layers only (its linear-attention layers have no softmax
    attention); Flint rotates where it has a window and gives every layer a sink logit (the sweep compares both
    with the native models: docs/hf-compatibility.md)."""
    lara = hf_sweep.tiny_config("lara_mini").to_dict()
    assert layer_kinds(lara) == ["nope", "sliding_attention", "nope", "sliding_attention"]
    flint = hf_sweep.tiny_config("flint").to_dict()
    assert layer_kinds(flint) == ["nope", "nope", "sliding_attention", "nope"]
    assert "sink = logit" in import_config(flint)
    # linear_attention is a layer type only of the families that have such layers
    with pytest.raises(PedslError, match="layer_types"):
        layer_kinds({**hf_sweep.tiny_config("afmoe").to_dict(), "layer_types": lara["layer_types"]})


# ---------------------------------------------------------------------- GPT-J / CodeGen (pedsl.hf.sincos)


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
def test_gptj_codegen_rotate_their_first_rotary_dim_channels_interleaved_at_base_10000(model_type):
    """rotate_every_two over the first rotary_dim channels, a table of base 10000 whatever rope_theta says (the
    model reads none), the rotary embedding's (sin, cos) given the identity in that order: the logits, cache and
    generation are exact; the halves layout, or the whole head rotated, differs."""
    from pedsl.hf import use_pedsl_attention

    native = _native(model_type)
    text = _exact(native)
    sch = load(text)
    assert sch.head_dim == 16 and "layout interleaved" in text and list(sch.group("rot").channels) == list(range(8))
    assert "param base: float (> 1) = 10000.0" in text
    ignored = json.loads(native.config.to_json_string()) | {"rope_theta": 5e5}
    assert import_config(ignored) == text
    for wrong in (text.replace("layout interleaved", "layout halves"),
                  text.replace("rot = fraction(partial_rotary_factor)", "rot = fraction(1)")):
        assert wrong != text
        assert hf_sweep.compare(native, use_pedsl_attention(copy.deepcopy(native), wrong))[3]


@pytest.mark.parametrize("rotary_dim", [None, 7, 32])
def test_gptj_without_a_rotary_dim_its_heads_take_is_refused_naming_it(rotary_dim):
    cfg = json.loads(transformers.GPTJConfig(n_embd=64, n_head=4).to_json_string()) | {"rotary_dim": rotary_dim}
    with pytest.raises(InteropError, match="rotary_dim") as err:
        import_config(cfg)
    assert err.value.code == "E961"


def test_laguna_rotates_half_of_its_full_layers_and_all_of_its_sliding_ones():
    """Laguna's rope per layer type (its class's defaults: full layers base 5e5 on the first half of the channels,
    sliding layers base 1e4 on all of them, windowed): exact; the same text from a file without rope_parameters;
    the full layers rotated whole differ; layers of other head counts are refused naming the field."""
    from pedsl.hf import use_pedsl_attention

    native = _native("laguna")
    text = _exact(native)
    full = text[text.index("scheme laguna_full"):]
    assert "param partial_rotary_factor: float (> 0, <= 1) = 0.5" in full and "= 500000.0" in full
    sliding = text[text.index("scheme laguna_sliding"):text.index("scheme laguna_full")]
    assert "partial_rotary_factor" not in sliding and "window = 6" in sliding and "= 10000.0" in sliding
    cfg = json.loads(native.config.to_json_string())
    assert import_config({k: v for k, v in cfg.items() if k != "rope_parameters"}) == text
    whole = text.replace("param partial_rotary_factor: float (> 0, <= 1) = 0.5",
                         "param partial_rotary_factor: float (> 0, <= 1) = 1.0")
    assert whole != text and hf_sweep.compare(native, use_pedsl_attention(copy.deepcopy(native), whole))[3]
    with pytest.raises(InteropError, match="num_attention_heads_per_layer") as err:
        import_config(cfg | {"num_attention_heads_per_layer": [4, 8, 4, 8]})
    assert err.value.code == "E961"


def test_ergo_rotates_its_sliding_layers_interleaved_and_its_full_layers_are_nope():
    """Ergo's sliding layers' rope (interleaved pairs, base 1e6), its full layers' rope_parameters null (NoPE), the
    constant global_attention_scale on their q and k: exact (the model iterates the replaced embedding's
    rope_type); the halves layout differs; a full-layer rope is refused naming it."""
    from pedsl.hf import use_pedsl_attention

    native = _native("ergo")
    text = _exact(native)
    assert "pattern = [ergo_sliding, ergo_nope]" in text and "layout interleaved" in text
    assert "= 1000000.0" in text and "window = 6" in text
    halves = text.replace("layout interleaved", "layout halves")
    assert hf_sweep.compare(native, use_pedsl_attention(copy.deepcopy(native), halves))[3]
    cfg = json.loads(native.config.to_json_string())
    rotating = {**cfg["rope_parameters"], "full_attention": {"rope_type": "default", "rope_theta": 1e4}}
    with pytest.raises(InteropError, match="full_attention") as err:
        import_config(cfg | {"rope_parameters": rotating})
    assert err.value.code == "E961"
