"""What each Hugging Face architecture (``model_type``) does with the rotary fields of its config, as the
rope importer reads it: the views of :mod:`pedsl.hf.registry` (one record per model type) that
:mod:`pedsl.hf.rope` and :mod:`pedsl.hf.layered` use.

The rope utilities of transformers (``modeling_rope_utils``) are not the whole story: each model class
decides which of them it calls and how it applies the table. Read from transformers 5's model files
and checked against the model classes themselves (compiler_tests/hf/test_hf_models.py, tools/hf_sweep.py):

- most Llama-family models compute their ``default`` table with their own
  ``compute_default_rope_parameters``, which ignores ``partial_rotary_factor``: every channel rotates.
  Their other rope types go through the rope utilities, which do read the factor, and their
  ``apply_rotary_pos_emb`` then multiplies a full-width q by a narrower table: the native model fails;
- Phi-3, Phi, StableLM, Persimmon, GPT-NeoX and Nemotron rotate the first
  ``int(head_dim * partial_rotary_factor)`` channels (pairs p, p + rot/2) and pass the rest through;
- Cohere, Helium, ERNIE 4.5, GLM and Llama 4 rotate interleaved pairs (2p, 2p + 1): ``layout interleaved``;
- some use multimodal M-RoPE (3-D positions): refused, except the Qwen-VL families of
  :data:`MROPE_IMPORTED`, which :mod:`pedsl.hf.multimodal` imports as 3-axis schemes.

A config without ``model_type`` is read as the rope utilities read it (the factor applies); a config whose
``model_type`` has no record is refused (:func:`pedsl.hf.registry.unknown`).
"""

from __future__ import annotations

from pedsl.hf.registry import LAYERED_TYPES, REGISTRY, family, is_layered, model_types, taught_refusal, unknown

__all__ = ["model_types", "refusal", "partial_rotary", "FULL_ROTATION", "PARTIAL_ROTATION", "INTERLEAVED", "MROPE",
           "MROPE_IMPORTED", "LAYERED", "PART"]


def _where(test) -> frozenset:
    return frozenset(mt for mt, fam in REGISTRY.items() if test(fam))


FULL_ROTATION = _where(lambda f: f.rotation == "full" and not f.refused)
PARTIAL_ROTATION = _where(lambda f: f.rotation == "partial" and not f.refused)
INTERLEAVED = _where(lambda f: f.layout == "interleaved" and not f.refused)
MROPE = _where(lambda f: f.rotation == "mrope" or (f.refused is not None and "M-RoPE" in f.refused))
MROPE_IMPORTED = _where(lambda f: f.rotation == "mrope" and not f.refused)
# Layers of different kinds (windows, chunks, NoPE layers, sinks, rope per layer type): pedsl.hf.layered
# writes a layers scheme for them; rope.import_config alone refuses them (it writes one scheme for every layer).
LAYERED = LAYERED_TYPES
# Set by pedsl.hf.layered on the config of one kind of layer, of which import_config writes the rope only.
PART = "_pedsl_layer_part"


def refusal(cfg: dict) -> str | None:
    """Why the named architecture's positional encoding is outside what rope.import_config writes, or None."""
    why = unknown(cfg) or taught_refusal(cfg)
    if why:
        return why
    for mt in model_types(cfg):
        fam = REGISTRY[mt]  # unknown(cfg) refused a model type the registry does not hold
        if fam.rotation == "mrope":
            return f"model_type '{mt}' uses M-RoPE: pedsl.hf.multimodal imports it (pedsl.hf.import_config)"
        if mt in LAYERED and not cfg.get(PART) and is_layered(cfg):
            return (f"model_type '{mt}' has layers of different kinds (sliding windows, NoPE layers, sinks, rope "
                    "per layer type): pedsl import-hf writes it as a layers scheme (pedsl.hf.import_config), not "
                    "one scheme for every layer")
    return None


def partial_rotary(cfg: dict, rope_type: str, prf: float) -> tuple[float, str | None]:
    """(the fraction of channels the architecture rotates, a note for the scheme or None). Raises
    ValueError (a sentence) when the native model cannot run the config."""
    if prf == 1.0:
        return 1.0, None
    types = model_types(cfg)
    mt = types[-1] if types else None
    fam = family(mt) if mt is not None else None
    if mt is None or (fam is not None and fam.rotation == "partial"):
        return prf, None
    if fam is not None and fam.rotation == "full":
        if rope_type == "default":
            return 1.0, (f"partial_rotary_factor {prf:g} is not read by transformers' {mt} model with rope_type "
                         "'default' (its own default table): every channel rotates")
        raise ValueError(f"transformers' {mt} model with rope_type '{rope_type}' and partial_rotary_factor {prf:g} "
                         "builds a table for a fraction of the channels but rotates all of them: the native model "
                         "fails on this config (a shape error), so there is no encoding to import")
    raise ValueError(f"pedsl does not know how model_type '{mt}' applies partial_rotary_factor {prf:g} (Llama's "
                     "default rope ignores it, Phi-3 rotates the first channels)")
