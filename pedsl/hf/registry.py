"""What each Hugging Face architecture (``model_type``) does with its positional fields: one record per type.

``pedsl import-hf`` (:mod:`pedsl.hf.rope`, :mod:`pedsl.hf.layered`, :mod:`pedsl.hf.multimodal`) and
``use_pedsl_attention`` (:mod:`pedsl.hf.attention`) both read these records, so the scheme written for a
config and the mask the adapter expects for each layer come from the same description. A model type
without a record is refused by name: pedsl never guesses that an architecture it has not been taught is
Llama's RoPE. Each record was read from transformers 5's ``configuration_*.py`` / ``modeling_*.py`` of that
type and is checked against the native model by ``python -m tools.hf_sweep`` (docs/hf-compatibility.md).

A record says:

- ``rotation``: how the rotary table is applied - ``full`` (Llama's own default table: every channel
  rotates whatever ``partial_rotary_factor`` says), ``partial`` (the first ``int(head_dim *
  partial_rotary_factor)`` channels), ``mrope`` (3-D positions), ``none`` (no rotary in any attention layer);
- ``layout``: which channels pair up - ``halves`` (HF's rotate_half: p with p + rot/2) or ``interleaved``
  (2p with 2p + 1 of the rotated channels: Cohere, ERNIE 4.5, GLM, Helium, Llama 4's complex rotation);
- ``layers``: which rule gives each layer its kind when ``layer_types`` is absent (:func:`layer_types`) and
  whether ``sliding_window`` applies at all (``types``: the file's ``layer_types`` alone, refused when absent:
  the config class's own default pattern is not read);
- ``nope``: which layers skip the rotation (Llama 4 / SmolLM3 ``no_rope_layers``, EXAONE 4: rope on the
  sliding layers only when the model has a window; ``local``: rope on the layers ``layer_types`` calls sliding,
  window or not (AFMoE); ``local_window``: rope on the sliding layers of a model with a window, none without
  one (Cohere 2));
- ``per_type_rope``: ``rope_parameters`` hold one dict per layer type (Gemma 3, OLMo 3);
- ``linear_layers``: ``layer_types`` may name ``linear_attention`` layers (gated-delta / linear attention, no
  softmax attention for pedsl to run: NoPE kind);
- ``sinks``: a learned sink logit per head in every layer (GPT-OSS);
- ``theta``: the config class's ``default_theta`` (the base when the file gives no ``rope_theta``; Gemma 3's
  global one, its local one is :data:`GEMMA3_LOCAL_THETA`);
- ``refused``: why pedsl cannot write the type's encoding exactly (naming the field), or None;
- ``rope_switch``: the config key that turns the rotary on (value ``rope``); any other value, or none, is NoPE
  in every attention layer (Granite-4.0-H's ``position_embedding_type``).
- ``mla``: multi-head latent attention (:mod:`pedsl.hf.mla`): heads of ``qk_nope_head_dim + qk_rope_head_dim``
  channels whose last ``qk_rope_head_dim`` rotate, values of ``v_head_dim``; ``layout_key``: the config key
  (``rope_interleave``) whose value picks the layout, true (interleaved) by default.
- ``sin_first``: GPT-J / CodeGen: the rotary embedding returns (sin, cos) from a table of base 10000 over the first
  ``rotary_dim`` channels, paired interleaved (:mod:`pedsl.hf.sincos`).
- ``fixed_longrope``: PhiMoE's rotary: LongRoPE's ``short_factor`` at every length, cos and sin times
  ``short_mscale`` / ``long_mscale`` (:func:`pedsl.hf.rope_knobs.fixed_longrope`; refused unless equal).
- ``ssmax``: the model multiplies the q of its NoPE layers by ``exp(0.1 * log(1 + (position + 1) / 2048))`` (Beam's
  scalable softmax, from ``position_ids``): the NoPE parts' temperature, the model's own undone by the adapter.
- ``layer_theta``: ``layer_rope_theta`` gives each layer its rope base (``rope_parameters`` with that
  ``rope_theta``), 0 a NoPE layer (Granite SWA): imported where each layer kind has one base.
- ``q_scale``: the attention multiplies q by ``1 + beta * log(1 + floor(position / original))`` (``beta``:
  ``rope_parameters.llama_4_scaling_beta``, ``original``: its ``original_max_position_embeddings``), Ministral 3's
  Llama-4-style attention temperature: written as the scheme's ``temperature``.

``rotation none`` without a refusal is NoPE in every attention layer: the hybrids whose attention layers have no
rotary at all (Jamba, Nemotron-H, Zamba) and whose Mamba layers carry position themselves, untouched by pedsl.
"""

from __future__ import annotations

from dataclasses import dataclass

from pedsl import limits
from pedsl.errors import InteropError, quoted
from pedsl.hf.refusals import REFUSED, REFUSED_WHEN

FULL, SLIDING, CHUNKED, NOPE = "full_attention", "sliding_attention", "chunked_attention", "nope"
LINEAR = "linear_attention"  # a layer without softmax attention (a family with linear_layers): no position of pedsl's
NOPE_SLIDING = "nope_sliding"  # a NoPE layer with a sliding window (SmolLM3's)


@dataclass(frozen=True)
class Family:
    """How one model type computes positions (see the module docstring)."""

    rotation: str = "full"
    layout: str = "halves"  # halves | interleaved
    layers: str = "none"  # none | every | types | qwen2 | gemma2 | gemma3 | olmo3 | exaone4 | ministral | llama4
    nope: str = "none"  # none | llama4 | smollm3 | exaone4 | local | local_window
    per_type_rope: bool = False
    sinks: bool = False
    theta: float = 10000.0  # the config class's default_theta: rope_theta when the file gives none
    refused: str | None = None
    rope_switch: str | None = None  # a config key whose value 'rope' turns the rotary on (NoPE otherwise)
    q_scale: bool = False  # rope_parameters.llama_4_scaling_beta scales q by position (Ministral 3)
    force_rope: bool = False  # its dense-MLP layers rotate too when prefix_dense_sliding_window_pattern is 1
    reversed: bool = False  # rotate_half as cat(x2, -x1): every pair turns by minus its phase (nanochat)
    mla: bool = False  # multi-head latent attention: the rotary turns the last qk_rope_head_dim channels (pedsl.hf.mla)
    whole_head: bool = False  # MLA whose rotary reads the whole head and partial_rotary_factor (Mistral 4, pedsl.hf.mla)
    layout_key: str | None = None  # a config key whose value (true, its default: interleaved) picks the layout
    linear_layers: bool = False  # layer_types may name linear_attention layers (their kind: NoPE, no attention)
    sin_first: bool = False  # its rotary_emb returns (sin, cos) of a fixed-base table over rotary_dim (pedsl.hf.sincos)
    fixed_longrope: bool = False  # LongRoPE's short_factor at every length, cos and sin times short/long_mscale
    ssmax: bool = False  # its NoPE layers' q times (1 + (position + 1) / 2048) ** 0.1, scalable softmax (Beam)
    layer_theta: bool = False  # layer_rope_theta: each layer's rope base, 0 for a NoPE layer (Granite SWA)


def _refused(why: str) -> Family:
    return Family(rotation="none", refused=why)


REGISTRY: dict[str, Family] = {
    # Llama's own default table (every channel), no window
    **{mt: Family() for mt in ("llama", "olmo", "olmo2", "granite", "granitemoe", "gemma", "seed_oss", "arcee",
                               )},
    "apertus": Family(theta=1.2e7),
    # Llama-like rotaries of other families, each checked exact by tools/hf_sweep
    "bitnet": Family(theta=5e5),
    **{mt: Family() for mt in ("hrm_text", "hunyuan_v1_dense", "hyperclovax", "jais2", "olmoe",
                               "granitemoeshared", "aria_text", "diffllama", "falcon_h1", "hunyuan_v1_moe",
                               "internlm3", "iquestcoder", "olmo_hybrid")},
    # (falcon_h1, olmo_hybrid: the rotary of their attention layers; their Mamba / linear layers carry no pedsl
    # encoding and keep their own computation)
    "apertus1p5_text": Family(theta=1.2e7),
    "exaone": Family(theta=5e5),
    "hy_v3": Family(theta=11158840.0),
    "lfm2": Family(theta=1e6),  # layer_types: its attention layers and its convolution layers (no position)
    "lfm2_moe": Family(theta=1e6),  # LFM2's, its rotary named pos_emb
    "doge": Family(),  # Llama's rotary; a sliding_window is refused (REFUSED_WHEN)
    "nanochat": Family(reversed=True),  # Llama's table, its rotate_half the other way round: phase -(w * position)
    "jetmoe": Family(),  # Llama's rotary; its queries come from attention experts (kv_proj the layer's own)
    "minicpm5_moe": Family(theta=5e6),  # Llama's rotary, a gated query projection (q_gate_proj)
    # layer_types of sliding_attention / full_attention read from the file
    "kolibri1": Family(layers="types"),
    "exaone_moe": Family(layers="types", nope="exaone4"),
    "afmoe": Family(layers="types", nope="local"),
    # Ergo: its sliding layers' rope_parameters (interleaved pairs), its full layers' null: NoPE; the constant
    # global_attention_scale on q and k commutes with any rotation
    "ergo": Family(layout="interleaved", layers="types", nope="local", per_type_rope=True, theta=1e6),
    # LARA mini: Qwen3's rotary on the sliding layers only (its model passes none to the full ones), linear-attention
    # layers between them
    "lara_mini": Family(layers="types", nope="local", linear_layers=True),
    # Flint: rotary on the sliding layers only (its attention rotates when it has a window), a sink logit per head
    "flint": Family(layers="types", nope="local", sinks=True),
    # pairs (2p, 2p + 1): every channel (Cohere, Helium, ERNIE 4.5), the first int(head_dim * partial_rotary_factor)
    # (GLM)
    "cohere": Family(layout="interleaved", theta=5e5),
    "cohere2": Family(layout="interleaved", layers="types", nope="local_window"),
    # Cohere 2's rotation, and its force_rope: the layers mlp_layer_types calls dense rotate whatever their kind when
    # prefix_dense_sliding_window_pattern is 1
    "cohere2_moe": Family(layout="interleaved", layers="types", nope="local_window", force_rope=True),
    "helium": Family(layout="interleaved", theta=1e5),
    **{mt: Family(layout="interleaved", theta=5e5) for mt in ("ernie4_5", "ernie4_5_moe")},
    **{mt: Family(rotation="partial", layout="interleaved") for mt in ("glm", "glm4")},
    # rotate_half of the first int(head_dim * partial_rotary_factor) channels (GLM-4-MoE's model class)
    "glm4_moe": Family(rotation="partial"),
    "param2moe": Family(rotation="partial", theta=5e5),
    "sarvam_moe": Family(rotation="partial", theta=8e6),
    "minimax_m2": Family(rotation="partial", theta=5e6),
    # (Qwen3-Next, Qwen3.5: their gated-delta linear-attention layers carry no position; the attention layers
    # rotate the first int(head_dim * partial_rotary_factor) channels, 0.25 by default)
    # (Qwen3.5's text models: their rotary is interleaved M-RoPE, which a text model's one position per token
    # makes one rotation; the vision-language composites qwen3_5 / qwen3_5_moe are refused below)
    **{mt: Family(rotation="partial") for mt in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")},
    "bamba": Family(rotation="partial"),  # its attention layers (attn_layer_indices) between Mamba 2 layers
    # Llama's rotary, sliding_window (when set) on every attention layer; the lightning-attention layers of
    # layer_types 'linear_attention' carry no position
    "minimax": Family(layers="every", theta=1e6),
    # (Solar Open, Mellum: their default table reads partial_rotary_factor, their rotary application is Llama's
    # full one, so a factor below 1 fails natively: there is no other encoding to import)
    "solar_open": Family(rotation="partial", theta=1e6),
    "flex_olmo": Family(theta=5e5),
    # sliding_window, when set, on every layer (create_sliding_window_causal_mask for the whole model)
    **{mt: Family(layers="every") for mt in ("mistral", "starcoder2")},
    "mixtral": Family(layers="every", theta=1e6),
    "phi3": Family(rotation="partial", layers="every"),
    "qwen3_moe": Family(layers="qwen_every"),
    "ministral": Family(layers="ministral"),
    "ministral3": Family(layers="every", q_scale=True),  # Mistral's window, YaRN, Llama 4's q temperature
    "qwen2": Family(layers="qwen2"),
    "qwen3": Family(layers="qwen2"),
    "qwen2_moe": Family(layers="qwen2"),
    "gemma2": Family(layers="gemma2"),
    "vaultgemma": Family(layers="gemma2"),  # Gemma 2's layers, soft-cap and window
    "mellum": Family(rotation="partial", layers="types", per_type_rope=True),  # rope_parameters per layer type, layer_types read
    # Laguna: Mellum's per-type partial rotary (halves, first channels), an output gate that carries no position
    "laguna": Family(rotation="partial", layers="types", per_type_rope=True),
    # (ModernBERT's decoder: its config class sets sliding_window = local_attention // 2, which the file holds)
    "modernbert-decoder": Family(layers="types", per_type_rope=True, theta=1.6e5),
    "dots1": Family(layers="types"),  # dots.llm1: layer_types, sliding from max_window_layers when a window is set
    "cwm": Family(layers="types", theta=1e6),  # Code World Model: Llama 3's rotary, layer_types' windows
    "gemma3": Family(layers="gemma3", per_type_rope=True, theta=1e6),
    "gemma3_text": Family(layers="gemma3", per_type_rope=True, theta=1e6),
    "gpt_oss": Family(layers="gemma2", sinks=True, theta=1.5e5),
    "olmo3": Family(layers="olmo3", per_type_rope=True, theta=5e5),
    "exaone4": Family(layers="exaone4", nope="exaone4"),
    "smollm3": Family(layers="smollm3", nope="smollm3", theta=2e6),
    "llama4": Family(layout="interleaved", layers="llama4", nope="llama4", theta=5e5),
    "llama4_text": Family(layout="interleaved", layers="llama4", nope="llama4", theta=5e5),
    # the first int(head_dim * partial_rotary_factor) channels, every rope type
    **{mt: Family(rotation="partial") for mt in ("phi", "stablelm", "persimmon", "gpt_neox", "nemotron")},
    # M-RoPE imported by pedsl.hf.multimodal
    **{mt: Family(rotation="mrope", theta=1e6) for mt in ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
                                                          "qwen2_5_vl_text")},
    **{mt: Family(rotation="mrope", theta=5e5) for mt in ("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe",
                                                          "qwen3_vl_moe_text")},
    # no rotary in any attention layer (NoPE); the Mamba layers between them keep their own computation
    **{mt: Family(rotation="none") for mt in ("jamba", "nemotron_h", "zamba")},
    # Granite-4.0-H: Llama's rotary in its attention layers when position_embedding_type is 'rope', else NoPE
    "granitemoehybrid": Family(rope_switch="position_embedding_type"),
    # RecurrentGemma: its attention blocks between recurrent ones, each windowed by attention_window_size
    # (WINDOW_KEYS), rotating the first int(head_dim * partial_rotary_factor) channels (0.5 by default)
    "recurrent_gemma": Family(rotation="partial", layers="every"),
    # Moshi's text decoder: Llama's rotary (in each attention layer); its sliding_window is read by no mask
    # (create_causal_mask) and not passed to the attention function
    "moshi": Family(),
    # Beam: rope_parameters per layer type, its full layers' null (NoPE, their q scaled by position: ssmax)
    "beam": Family(layers="types", nope="local", per_type_rope=True, ssmax=True),
    # Granite SWA: layer_types' windows, a sink logit per head in every layer, a rope base per layer (0: NoPE)
    **{mt: Family(layers="types", sinks=True, layer_theta=True) for mt in ("granite_swa", "granitemoe_swa")},
    # multi-head latent attention (pedsl.hf.mla): the last qk_rope_head_dim channels of each q/k head rotate,
    # interleaved (DeepSeek-V2's complex product; rope_interleave, true by default) or as rotate_half (MiniCPM3)
    **{mt: Family(layout="interleaved", mla=True, layout_key="rope_interleave")
       for mt in ("deepseek_v3", "youtu", "axk1", "sarvam_mla")},  # Sarvam's MLA runs DeepseekV3ForCausalLM
    # (its default table reads partial_rotary_factor: a factor below 1 narrows the rotary, refused by pedsl.hf.mla)
    "glm4_moe_lite": Family(rotation="partial", layout="interleaved", mla=True, layout_key="rope_interleave"),
    "deepseek_v2": Family(layout="interleaved", mla=True),
    # Mistral 4: DeepSeek-V3's MLA (its latent cached before the expansion) and Llama 4's q scale by position
    "mistral4": Family(layout="interleaved", mla=True, layout_key="rope_interleave", q_scale=True, whole_head=True),
    # GPT-J / CodeGen: rotate_every_two over the first rotary_dim channels, a table of base 10000 (pedsl.hf.sincos)
    **{mt: Family(rotation="partial", layout="interleaved", sin_first=True) for mt in ("gptj", "codegen")},
    "longcat_flash": Family(layout="interleaved", mla=True, theta=1e7),
    "minicpm3": Family(mla=True),
    # Ling 2.5's MLA layers (interleaved) between its delta-attention layers, which carry no position
    "bailing_hybrid": Family(layout="interleaved", mla=True, theta=6e6),
    # Kimi Linear's MLA layers have no rotary (NoPE); its delta-attention layers carry no position
    "kimi_linear": Family(rotation="none", mla=True),
    "phimoe": Family(fixed_longrope=True, theta=1e6),  # its longrope as one table and one scale (pedsl.hf.rope_knobs)
    "falcon": Family(),  # Llama's rotary; alibi = true refused (REFUSED_WHEN)
    # taught, and refused with the reason (pedsl.hf.refusals)
    **{mt: _refused(why) for mt, why in REFUSED.items()},
}

# Types whose rotary reads rope_parameters.alpha with rope_type 'dynamic' as a fixed NTK base (HunYuan).
NTK_ALPHA = frozenset({"hunyuan_v1_dense"})
GEMMA3_LOCAL_THETA = 10000.0  # Gemma 3's default_theta["local"]: its sliding layers' base
# Bases per layer type of the types whose config class fills rope_parameters per layer type with two
# different bases when the file gives none (Mellum's __post_init__)
PER_TYPE_THETA = {"mellum": {"full_attention": 5e5, "sliding_attention": 1e4},
                  "modernbert-decoder": {"full_attention": 1.6e5, "sliding_attention": 1e4},
                  "laguna": {"full_attention": 5e5, "sliding_attention": 1e4}}
# The rope_parameters per layer type of the types whose config class fills in whole dicts when the file gives none,
# reading no rope_theta (Laguna's __post_init__: a partial rotary on its full layers)
PER_TYPE_DEFAULT_ROPE = {"laguna": {
    "full_attention": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}}}
# Rotations that pedsl.hf.rope writes in HF's halves layout.
HALVES = ("full", "partial")


def model_types(cfg: dict) -> list[str]:
    """The config's model_type and, for a composite (vision-language) config, its text model's."""
    out = [str(cfg.get("model_type"))] if cfg.get("model_type") else []
    text = cfg.get("text_config")
    if isinstance(text, dict) and text.get("model_type"):
        out.append(str(text["model_type"]))
    return out


def family(model_type: str) -> Family | None:
    return REGISTRY.get(model_type)


def unknown(cfg: dict) -> str | None:
    """The refusal of a config whose model_type pedsl has not been taught (None: known, or no model_type)."""
    for mt in model_types(cfg):
        if mt not in REGISTRY:
            return (f"pedsl does not know how model_type {quoted(mt)} computes its positional encoding (field "
                    "model_type): import-hf writes only the architectures it has been taught "
                    "(docs/hf-compatibility.md), never a guess")
    return None


def taught_refusal(cfg: dict) -> str | None:
    """Why a taught architecture is refused, naming the model type (None: imported)."""
    for mt in model_types(cfg):
        fam = REGISTRY.get(mt)
        if fam is not None and fam.refused:
            return f"model_type '{mt}' {fam.refused}"
        key, why = REFUSED_WHEN.get(mt, (None, ""))
        if key is not None and cfg.get(key):
            return f"model_type '{mt}' {why}"
    return None


def is_nope_model(cfg: dict) -> bool:
    """Whether every attention layer of the config's (taught, not refused) model type has no rotary (NoPE)."""
    fam = family((model_types(cfg) or [""])[-1])
    if fam is None or fam.refused:
        return False
    return fam.rotation == "none" or (fam.rope_switch is not None and cfg.get(fam.rope_switch) != "rope")


def window_size(cfg: dict, fam: Family):
    """The sliding window the model's layers of kind sliding use (None: the model has none)."""
    if fam.layers in ("qwen2", "qwen_every") and not cfg.get("use_sliding_window"):
        return None
    if fam.layers == "smollm3" and not cfg.get("use_sliding_window"):
        return None
    return cfg.get("sliding_window") if fam.layers != "none" else None


def default_layer_types(cfg: dict, fam: Family, n: int, pattern) -> list[str]:
    """``layer_types`` as the config class fills it when the file has none (``pattern``: an int reader)."""
    window = window_size(cfg, fam)
    rule = fam.layers
    if rule in ("every", "qwen_every", "ministral"):
        return [SLIDING if window is not None else FULL] * n
    if rule == "gemma2":
        return [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
    if rule == "gemma3":
        every = pattern("sliding_window_pattern", pattern("_sliding_window_pattern", 6))
        return [SLIDING if (i + 1) % every else FULL for i in range(n)]
    if rule == "olmo3":
        return [SLIDING if (i + 1) % 4 else FULL for i in range(n)]
    if rule == "exaone4":
        every = 0 if cfg.get("sliding_window") is None else pattern("sliding_window_pattern", 4)
        return [SLIDING if every and (i + 1) % every else FULL for i in range(n)]
    if rule == "types":
        raise InteropError("layer_types is absent: pedsl reads this model type's sliding and full layers from the "
                           "file's layer_types, never from a guessed pattern", code="E963",
                           hint="give layer_types (transformers' save_pretrained writes it)")
    if rule == "qwen2":
        start = pattern("max_window_layers", n, 0)
        return [SLIDING if window is not None and i >= start else FULL for i in range(n)]
    return [FULL] * n


# Layers of different kinds (windows, chunks, NoPE layers, sinks, rope per layer type): pedsl.hf.layered writes a
# layers scheme for them.
LAYERED_TYPES = frozenset(mt for mt, f in REGISTRY.items() if not f.refused and (
    f.layers != "none" or f.nope != "none" or f.per_type_rope or f.sinks))


# ---------------------------------------------------------------------- each layer's kind


def text_config(cfg: dict) -> dict:
    """The text model's config of a composite one (Llama 4's ``text_config``), else the config itself; its window
    as ``sliding_window`` where the type names it otherwise (:data:`WINDOW_KEYS`)."""
    text = cfg.get("text_config")
    out = text if isinstance(text, dict) and cfg.get("model_type") in COMPOSITES else cfg
    key = WINDOW_KEYS.get((model_types(out) or [""])[-1])
    if key is not None and out.get("sliding_window") is None and out.get(key) is not None:
        return {**out, "sliding_window": out[key]}
    return out


# Types whose config file holds the window under another key (the config class's attribute_map: sliding_window).
WINDOW_KEYS = {"recurrent_gemma": "attention_window_size"}


# Composite (vision-language) types whose positional encoding is their text_config's alone.
COMPOSITES = ("llama4", "gemma3")


def _int(cfg: dict, key: str, default=None, least: int = 1):
    v = cfg.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() or not \
            least <= v <= limits.MAX_LENGTH * 1024:
        raise InteropError(f"config key '{key}' must be a whole number >= {least}, got {quoted(v, 60)}", code="E963")
    return int(v)


def _family(cfg: dict) -> tuple[str, Family]:
    mt = (model_types(cfg) or [""])[-1]
    return mt, family(mt) or Family()


def _rope_map(cfg: dict, n: int, key: str, interval_key: str, interval: int) -> list[int]:
    """``no_rope_layers`` (1: a RoPE layer, 0: a NoPE layer) as the config class fills it when absent."""
    nope = cfg.get(key)
    if nope is None:
        every = _int(cfg, interval_key, interval)
        nope = [int((i + 1) % every != 0) for i in range(n)]
    if not isinstance(nope, list) or len(nope) != n or any(x not in (0, 1) or isinstance(x, bool) for x in nope):
        raise InteropError(f"{key} must list 0 or 1 for each of the {n} layers, got {quoted(nope, 80)}", code="E963")
    return nope


def _forced_rope(cfg: dict, n: int) -> list[bool]:
    """Cohere 2 MoE's force_rope per layer: its dense-MLP layers when prefix_dense_sliding_window_pattern is 1."""
    mlp = cfg.get("mlp_layer_types")
    if mlp is None:
        raise InteropError("mlp_layer_types is absent: pedsl reads which layers HF forces to rotate (its dense-MLP "
                           "layers) from the file, never from a guess", code="E963",
                           hint="give mlp_layer_types (transformers' save_pretrained writes it)")
    if not isinstance(mlp, list) or len(mlp) != n:
        raise InteropError(f"mlp_layer_types must list each of the {n} layers, got {quoted(mlp, 80)}", code="E963")
    return [m == "dense" and _int(cfg, "prefix_dense_sliding_window_pattern", 1) == 1 for m in mlp]


def layer_kinds(cfg: dict) -> list[str]:
    """The kind of every layer: full_attention, sliding_attention, chunked_attention, nope or nope_sliding,
    read as the model's config class and attention read it (defaults included; :mod:`pedsl.hf.registry`)."""
    mt, fam = _family(cfg)
    n = _int(cfg, "num_hidden_layers")
    if n is None or n > limits.MAX_LAYERS:
        raise InteropError(f"num_hidden_layers must be 1 .. {limits.MAX_LAYERS}, got {quoted(cfg.get('num_hidden_layers'))}",
                           code="E963")
    if fam.layers == "llama4":
        nope = _rope_map(cfg, n, "no_rope_layers", "no_rope_layer_interval", 4)
        chunked = cfg.get("attention_chunk_size") is not None
        return [NOPE if not r else CHUNKED if chunked else FULL for r in nope]
    window = window_size(cfg, fam)
    if window is not None:
        _int(cfg, "sliding_window")
    types = cfg.get("layer_types")
    if fam.layers == "smollm3":
        rope = _rope_map(cfg, n, "no_rope_layers", "no_rope_layer_interval", 4)
        if types is None:
            types = [SLIDING if window is not None and not r else FULL for r in rope]
    elif types is None or fam.layers in ("every", "qwen_every", "none"):  # these read sliding_window alone
        types = default_layer_types(cfg, fam, n, lambda k, d=None, least=1: _int(cfg, k, d, least))
    known = (FULL, SLIDING, LINEAR) if fam.linear_layers else (FULL, SLIDING)
    if not isinstance(types, list) or len(types) != n or any(t not in known for t in types):
        raise InteropError(f"layer_types must name full_attention or sliding_attention for each of the {n} layers, "
                           f"got {quoted(types, 80)}", code="E961")
    kinds = [SLIDING if t == SLIDING and window is not None else NOPE if t == LINEAR else FULL for t in types]
    if fam.nope == "smollm3":
        kinds = [k if r else NOPE_SLIDING if k == SLIDING else NOPE for k, r in zip(kinds, rope)]
    if fam.nope == "exaone4" and window is not None:  # HF rotates the sliding layers only, when there is a window
        kinds = [k if k == SLIDING else NOPE for k in kinds]
    if fam.layer_theta:  # a base of 0 in layer_rope_theta: the layer gets no rotary
        kinds = [k if t else NOPE_SLIDING if k == SLIDING else NOPE for k, t in zip(kinds, layer_thetas(cfg, n))]
    if fam.nope in ("local", "local_window"):  # HF's is_local_attention / sliding_window is not None
        rotates = [t == SLIDING and (window is not None or fam.nope == "local") for t in types]
        if fam.force_rope:  # HF's force_rope: config.mlp_layer_types[i] == "dense" and the prefix pattern is 1
            rotates = [r or f for r, f in zip(rotates, _forced_rope(cfg, n))]
        kinds = [k if r else NOPE for k, r in zip(kinds, rotates)]
    return kinds


def layer_thetas(cfg: dict, n: int) -> list[float]:
    """``layer_rope_theta``: each layer's rope base (0: NoPE), the config's one base on every layer when absent (as
    Granite SWA's config class fills it)."""
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        rp = cfg.get("rope_parameters")
        base = rp.get("rope_theta") if isinstance(rp, dict) else cfg.get("rope_theta")
        return [base if base is not None else _family(cfg)[1].theta] * n
    if not isinstance(thetas, list) or len(thetas) != n or any(
            isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf") for t in thetas):
        raise InteropError(f"layer_rope_theta must list a rope base >= 0 (0: no rotary) for each of the {n} layers, "
                           f"got {quoted(thetas, 80)}", code="E963")
    return thetas


def kind_theta(cfg: dict, kind: str) -> float:
    """The one rope base of the layers of ``kind`` (layer_rope_theta), refused when they have several: pedsl's
    import writes one part per layer kind."""
    kinds = layer_kinds(cfg)
    bases = {t for k, t in zip(kinds, layer_thetas(cfg, len(kinds))) if k == kind}
    if len(bases) != 1:
        raise InteropError(f"layer_rope_theta gives the {kind} layers the rope bases {quoted(sorted(bases), 80)}; "
                           "pedsl's import writes one part per layer kind (full, sliding, NoPE), so the layers of one "
                           "kind must share their base", code="E961", hint="nothing was written")
    return bases.pop()


def is_layered(cfg: dict) -> bool:
    """Whether the config's layers differ (or carry a window, a chunk, sinks, a soft cap, NoPE layers, a rope per
    layer type): :func:`import_layered`'s."""
    cfg = text_config(cfg)
    mt, fam = _family(cfg)
    if mt not in LAYERED_TYPES:
        return False
    if fam.sinks or fam.per_type_rope or fam.layers == "llama4" or cfg.get("attn_logit_softcapping") is not None:
        return True
    if fam.nope == "none" and window_size(cfg, fam) is None:
        return False  # no window anywhere, every layer rotates: one scheme (no layer count needed)
    return any(k != FULL for k in layer_kinds(cfg))


