"""``pedsl export RUN --hf DIR``: a trained ``arch: llama`` run as a Hugging Face ``LlamaForCausalLM``.

Writes ``config.json`` and ``model.safetensors`` that ``LlamaForCausalLM.from_pretrained(DIR)``
loads with the run's logits. The run's scheme must be in HF's rope family (see
:func:`pedsl.hf.rope.export_rope`); Llama rotates every channel of a head, so a partial rotation
is refused. An interleaved scheme (pairs ``(2k, 2k + 1)``) is exported by permuting the rows of
each head of the q and k projections into the halves order ``(k, k + D/2)`` of HF's
``rotate_half``: q and k are permuted alike, so every score is unchanged. No transformers needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save

from pedsl.errors import InteropError
from pedsl.fsio import atomic_write_bytes, atomic_write_text, ensure_dir
from pedsl.hf.rope import export_rope
from pedsl.study.common import open_run


def halves_order(head_dim: int) -> list[int]:
    """The channel order that turns interleaved pairs (2k, 2k+1) into halves pairs (k, k + D/2)."""
    return list(range(0, head_dim, 2)) + list(range(1, head_dim, 2))


def llama_state_dict(model, *, interleaved: bool) -> dict[str, torch.Tensor]:
    """HF Llama tensor names for a pedsl ``TransformerLM`` with ``arch: llama``."""
    cfg = model.cfg
    H, D, C = cfg.n_heads, cfg.head_dim, cfg.d_model
    perm = torch.tensor(halves_order(D)) if interleaved else None
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed.weight}
    for i, blk in enumerate(model.blocks):
        p = f"model.layers.{i}."
        q, k, v = blk.attn.qkv.weight.view(3, H, D, C).unbind(0)  # rows of qkv(x).view(B, L, 3, H, D)
        if perm is not None:
            q, k = q[:, perm], k[:, perm]
        out[p + "self_attn.q_proj.weight"] = q.reshape(H * D, C)
        out[p + "self_attn.k_proj.weight"] = k.reshape(H * D, C)
        out[p + "self_attn.v_proj.weight"] = v.reshape(H * D, C)
        out[p + "self_attn.o_proj.weight"] = blk.attn.proj.weight
        out[p + "input_layernorm.weight"] = blk.norm1.weight
        out[p + "post_attention_layernorm.weight"] = blk.norm2.weight
        out[p + "mlp.gate_proj.weight"] = blk.mlp.gate.weight
        out[p + "mlp.up_proj.weight"] = blk.mlp.fc.weight
        out[p + "mlp.down_proj.weight"] = blk.mlp.proj.weight
    out["model.norm.weight"] = model.norm.weight
    if model.head is not None:
        out["lm_head.weight"] = model.head.weight
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def _one_rope(scheme, n_layers: int) -> dict:
    """The rope of every layer: LlamaForCausalLM has one. A ``layers`` scheme exports when each of its
    layers' parts has the same HF rope; otherwise the refusal names the layers that differ."""
    if scheme.layers is None:
        return export_rope(scheme, allow_interleaved=True)
    parts = scheme.layers.assign(n_layers)
    first = {name: parts.index(name) for name in dict.fromkeys(parts)}
    ropes = {}
    for name, i in first.items():
        try:
            ropes[name] = export_rope(scheme.layers.parts[name], allow_interleaved=True)
        except InteropError as err:
            raise InteropError(f"layer {i} of scheme '{scheme.name}' ({name}): {err.diagnostics[0].message}",
                               code="E962", hint=err.diagnostics[0].hint) from None
    if len({json.dumps(r, sort_keys=True) for r in ropes.values()}) > 1:
        shown = "; ".join(f"layer {i} ({name}): {json.dumps(ropes[name]['rope_parameters'], sort_keys=True)}"
                          for name, i in first.items())
        raise InteropError(f"scheme '{scheme.name}' gives its layers different rotary embeddings, and "
                           f"LlamaForCausalLM has one for every layer: {shown}", code="E962",
                           hint="export a run whose layers share one rope, or use the run with pedsl")
    if len({scheme.layers.parts[n].layout for n in ropes}) > 1:
        raise InteropError(f"the parts of scheme '{scheme.name}' pair channels differently (halves and "
                           "interleaved)", code="E962", hint="give the parts one layout")
    return next(iter(ropes.values()))


def llama_config(model, scheme, context: int) -> dict:
    """config.json of the Llama equivalent of ``model`` with ``scheme``'s rope parameters."""
    cfg = model.cfg
    if cfg.arch != "llama":
        raise InteropError(f"the run's model has arch '{cfg.arch}' (GELU MLP), which has no Hugging Face Llama "
                           "equivalent", code="E962", hint="train with arch: llama (`--set arch=llama`, or "
                           "`arch = \"llama\"` in the scheme's train block) to export to Hugging Face")
    if cfg.qk_conv:
        raise InteropError(f"the run's model convolves its queries and keys (qk_conv = {cfg.qk_conv}), which "
                           "LlamaForCausalLM has no place for", code="E962",
                           hint="train without the convolution (`--set qk_conv=0`) to export to Hugging Face")
    if any(list(blk.attn.pe.parameters()) for blk in model.blocks):
        raise InteropError(f"scheme '{scheme.name}' has learned parameters, which Hugging Face's rotary embedding "
                           "cannot hold", code="E962")
    rope = _one_rope(scheme, cfg.n_layers)
    rp = rope["rope_parameters"]
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        raise InteropError(f"scheme '{scheme.name}' rotates {rp['partial_rotary_factor']:g} of each head; "
                           "LlamaForCausalLM rotates every channel", code="E962",
                           hint="train with a scheme rotating all channels to export as Llama")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": model.blocks[0].mlp.fc.out_features,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "max_position_embeddings": rope.get("max_position_embeddings", context),
        "rope_parameters": rp,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "torch_dtype": "float32",
    }


def export_model(model, scheme, out_dir: str | Path, *, context: int) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of a pedsl ``TransformerLM`` (``arch: llama``)."""
    config = llama_config(model, scheme, context)
    layout = next(iter(scheme.layers.parts.values())).layout if scheme.layers is not None else scheme.layout
    tensors = llama_state_dict(model, interleaved=layout == "interleaved")
    out = ensure_dir(out_dir)
    atomic_write_bytes(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    return out


def export_run(run: str | Path, out_dir: str | Path) -> Path:
    """Export a run directory's latest checkpoint (see the module docstring)."""
    model, cfg, meta = open_run(run)
    return export_model(model, meta["scheme"], out_dir, context=cfg.context)
