"""Hugging Face interop.

- :func:`import_config` / :func:`export_rope` (``pedsl import-hf`` / ``pedsl export-hf``): a model's
  rope parameters as an exact `.pe` scheme and back (:mod:`pedsl.hf.rope` for the Llama family,
  :mod:`pedsl.hf.multimodal` for the 3-axis M-RoPE of Qwen2-VL, Qwen2.5-VL and Qwen3-VL); no
  transformers needed.
- :func:`use_pedsl_attention` (needs ``transformers``, the ``hf`` extra): a Llama-family model, or the
  language model of Qwen2-VL, Qwen2.5-VL, Qwen3-VL at 3-axis positions, attends through a compiled
  pedsl scheme (HF's rope family through HF's own rotary application and cache; other schemes over the
  whole cache each call).
- :mod:`pedsl.hf.arch`: what each ``model_type`` does with ``partial_rotary_factor`` and which
  architectures (other M-RoPE models, per-layer rope, interleaved pairs) import-hf refuses.
- :func:`export_run` (``pedsl export RUN --hf DIR``): a pedsl run with ``arch: llama`` as a
  ``LlamaForCausalLM`` folder (config.json + model.safetensors).
"""

from __future__ import annotations

from pedsl.hf.convert import export_rope, import_config
from pedsl.hf.rope import read_config, rope_spec

__all__ = ["import_config", "export_rope", "read_config", "rope_spec", "use_pedsl_attention", "export_run"]


def __getattr__(name: str):  # the torch/transformers parts load on first use
    if name == "use_pedsl_attention":
        from pedsl.hf.attention import use_pedsl_attention

        return use_pedsl_attention
    if name == "export_run":
        from pedsl.hf.export import export_run

        return export_run
    raise AttributeError(name)
