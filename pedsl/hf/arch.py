"""What each Hugging Face architecture (``model_type``) does with the rotary fields of its config.

The rope utilities of transformers (``modeling_rope_utils``) are not the whole story: each model class
decides which of them it calls and how it applies the table. Read from transformers 5's model files
and checked against the model classes themselves (compiler_tests/hf/test_hf_models.py):

- most Llama-family models compute their ``default`` table with their own
  ``compute_default_rope_parameters``, which ignores ``partial_rotary_factor``: every channel rotates.
  Their other rope types go through the rope utilities, which do read the factor, and their
  ``apply_rotary_pos_emb`` then multiplies a full-width q by a narrower table: the native model fails;
- Phi-3, Phi, StableLM, Persimmon, GPT-NeoX and Nemotron rotate the first
  ``int(head_dim * partial_rotary_factor)`` channels (pairs p, p + rot/2) and pass the rest through;
- some rotate interleaved pairs (2p, 2p + 1) or use multimodal M-RoPE (3-D positions): refused, except
  the Qwen-VL families of :data:`MROPE_IMPORTED`, which :mod:`pedsl.hf.multimodal` imports as 3-axis schemes.

A config without ``model_type`` is read as the rope utilities read it (the factor applies).
"""

from __future__ import annotations

# Rotate every channel in the default type, whatever partial_rotary_factor says (Llama's own default table).
FULL_ROTATION = frozenset({
    "llama", "mistral", "mixtral", "ministral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo", "olmo2", "olmo3",
    "granite", "granitemoe", "starcoder2", "gemma", "gemma2", "exaone4", "seed_oss", "arcee", "apertus", "gpt_oss",
    "smollm3", "phimoe",
})
# Rotate the first int(head_dim * partial_rotary_factor) channels in the halves layout, every rope type.
PARTIAL_ROTATION = frozenset({"phi3", "phi", "stablelm", "persimmon", "gpt_neox", "nemotron"})
# Rotate interleaved pairs (rotate_half on x[..., 0::2] / x[..., 1::2]).
INTERLEAVED = frozenset({"cohere", "cohere2", "helium", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "glm4_moe",
                         "deepseek_v2", "deepseek_v3", "moonshine"})
# Multimodal rotary position embedding: 3-D (time, height, width) positions split over mrope_section.
MROPE = frozenset({"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_5_omni", "qwen3_vl",
                   "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_omni_moe", "glm4v", "glm4v_text",
                   "glm4v_moe", "glm4v_moe_text", "ernie4_5_vl_moe", "glm_image"})
# The M-RoPE models that pedsl.hf.multimodal imports (their composite and text configs).
MROPE_IMPORTED = frozenset({"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text"})
# Layers of different kinds with their own rope parameters.
PER_LAYER_ROPE = frozenset({"gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                            "modernbert", "cohere2"})


# Layers of different kinds (sliding windows, chunks, NoPE layers, sinks): pedsl.hf.layered writes a layers
# scheme for them; import_config alone refuses them (it writes one scheme for every layer).
LAYERED = frozenset({"gemma2", "gemma3", "gemma3_text", "qwen2", "gpt_oss", "llama4", "llama4_text"})
# Set by pedsl.hf.layered on the config of one kind of layer, of which import_config writes the rope only.
PART = "_pedsl_layer_part"


def _layers_differ(cfg: dict, mt: str) -> bool:
    return (any(t != "full_attention" for t in cfg.get("layer_types") or ()) or bool(cfg.get("use_sliding_window"))
            or (mt in ("gemma2", "gpt_oss") and cfg.get("sliding_window") is not None) or mt == "gpt_oss")


def model_types(cfg: dict) -> list[str]:
    """The config's model_type and, for a composite (vision-language) config, its text model's."""
    out = [str(cfg.get("model_type"))] if cfg.get("model_type") else []
    text = cfg.get("text_config")
    if isinstance(text, dict) and text.get("model_type"):
        out.append(str(text["model_type"]))
    return out


def refusal(cfg: dict) -> str | None:
    """Why the named architecture's positional encoding is outside what import-hf writes, or None."""
    for mt in model_types(cfg):
        if mt in MROPE:
            return (f"model_type '{mt}' uses M-RoPE (multimodal rotary embedding: each rotated pair reads one of "
                    "three positions - time, height, width - split by mrope_section), whose positions are not "
                    "one token index")
        if mt in LAYERED and not cfg.get(PART) and _layers_differ(cfg, mt):
            return (f"model_type '{mt}' has layers of different kinds (sliding windows, sinks): pedsl import-hf "
                    "writes it as a layers scheme (pedsl.hf.import_config), not one scheme for every layer")
        if mt in PER_LAYER_ROPE and not cfg.get(PART):
            return (f"model_type '{mt}' gives its layer types different rope parameters (e.g. Gemma 3: local "
                    "sliding-window layers and global layers with another base and scaling); pedsl imports one "
                    "scheme for all layers")
        if mt in INTERLEAVED:
            return (f"model_type '{mt}' rotates interleaved channel pairs (2p, 2p + 1) in its own apply_rotary_pos_emb; "
                    "import-hf writes HF's halves layout")
    return None


def partial_rotary(cfg: dict, rope_type: str, prf: float) -> tuple[float, str | None]:
    """(the fraction of channels the architecture rotates, a note for the scheme or None). Raises
    ValueError (a sentence) when the native model cannot run the config."""
    if prf == 1.0:
        return 1.0, None
    mt = (model_types(cfg) or [None])[-1]
    if mt is None or mt in PARTIAL_ROTATION:
        return prf, None
    if mt in FULL_ROTATION:
        if rope_type == "default":
            return 1.0, (f"partial_rotary_factor {prf:g} is not read by transformers' {mt} model with rope_type "
                         "'default' (its own default table): every channel rotates")
        raise ValueError(f"transformers' {mt} model with rope_type '{rope_type}' and partial_rotary_factor {prf:g} "
                         "builds a table for a fraction of the channels but rotates all of them: the native model "
                         "fails on this config (a shape error), so there is no encoding to import")
    raise ValueError(f"pedsl does not know how model_type '{mt}' applies partial_rotary_factor {prf:g} (Llama's "
                     "default rope ignores it, Phi-3 rotates the first channels)")
