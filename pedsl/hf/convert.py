"""``pedsl import-hf`` / ``pedsl export-hf``: which converter reads a config and which writes a scheme back.

One-axis rope (the Llama family, :mod:`pedsl.hf.rope`), the three-axis M-RoPE of the Qwen-VL families
(:mod:`pedsl.hf.multimodal`) and the models whose layers differ (Gemma 2 / 3, Llama 4 text, Qwen2 with
sliding windows, GPT-OSS: a ``layers`` scheme, :mod:`pedsl.hf.layered`) share the entry points here, so
callers never choose.
"""

from __future__ import annotations

from pathlib import Path

from pedsl.errors import InteropError, quoted
from pedsl.hf import layered, multimodal, registry, rope
from pedsl.lang.parser import name_problem
from pedsl.lang.scheme import Scheme


def import_config(config: dict | str | Path, name: str | None = None) -> str:
    """The checked `.pe` text of a config's positional encoding (see :func:`pedsl.hf.rope.import_config`,
    :func:`pedsl.hf.multimodal.import_mrope` and :func:`pedsl.hf.layered.import_layered`)."""
    cfg = config if isinstance(config, dict) else rope.read_config(config)
    if registry.is_nope_model(layered.text_config(cfg)):
        return layered.import_nope(cfg, name)
    if multimodal.family_of(cfg) is None:
        return layered.import_layered(cfg, name) if layered.is_layered(cfg) else rope.import_config(cfg, name)
    if name is not None and name_problem(name):
        raise InteropError(f"scheme name {quoted(name, 80)}: {name_problem(name)}", code="E963")
    return multimodal.import_mrope(cfg, name)


def axis_count(scheme: Scheme) -> int:
    """How many position axes the scheme declares (1 for a scheme without ``axes``)."""
    return len(getattr(scheme, "axes", None) or ()) or 1


def export_rope(scheme: Scheme) -> dict:
    """The Hugging Face rope fields of a scheme: one-axis rope or M-RoPE (InteropError otherwise)."""
    axes = axis_count(scheme)
    return rope.export_rope(scheme) if axes == 1 else multimodal.export_mrope(scheme, axes)
