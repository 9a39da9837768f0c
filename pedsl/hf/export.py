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
from pedsl.hf.layered import export_layers, part_window
from pedsl.hf.rope import export_rope
from pedsl.study.common import open_run


def halves_order(head_dim: int) -> list[int]:
    """The channel order that turns interleaved pairs (2k, 2k+1) into halves pairs (k, k + D/2)."""
    return list(range(0, head_dim, 2)) + list(range(1, head_dim, 2))


def interleaved_order(head_dim: int) -> list[int]:
    """The channel order that turns halves pairs (k, k + D/2) into interleaved pairs (2k, 2k+1) (Llama 4's)."""
    return [c for k in range(head_dim // 2) for c in (k, k + head_dim // 2)]


def llama_state_dict(model, *, interleaved: bool, mlp: str = "mlp",
                     order: list[int] | None = None) -> dict[str, torch.Tensor]:
    """HF Llama tensor names for a pedsl ``TransformerLM`` with ``arch: llama`` (Llama 4's dense layers:
    ``mlp="feed_forward"``); ``order``: the rows of each head of q and k (default: halves for an
    interleaved scheme)."""
    cfg = model.cfg
    H, D, C = cfg.n_heads, cfg.head_dim, cfg.d_model
    order = order if order is not None else halves_order(D) if interleaved else None
    perm = torch.tensor(order) if order is not None else None
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
        out[p + f"{mlp}.gate_proj.weight"] = blk.mlp.gate.weight
        out[p + f"{mlp}.up_proj.weight"] = blk.mlp.fc.weight
        out[p + f"{mlp}.down_proj.weight"] = blk.mlp.proj.weight
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
    _check_llama_model(model, scheme)
    rope = _one_rope(scheme, cfg.n_layers)
    rp = rope["rope_parameters"]
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        raise InteropError(f"scheme '{scheme.name}' rotates {rp['partial_rotary_factor']:g} of each head; "
                           "LlamaForCausalLM rotates every channel", code="E962",
                           hint="train with a scheme rotating all channels to export as Llama")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_decoder_fields(model),
            "attention_bias": False, "mlp_bias": False,
            "max_position_embeddings": rope.get("max_position_embeddings", context), "rope_parameters": rp}


def _decoder_fields(model) -> dict:
    """The config fields a pedsl ``arch: llama`` model fixes in every Llama-family class."""
    cfg = model.cfg
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "intermediate_size": model.blocks[0].mlp.fc.out_features, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "torch_dtype": "float32"}


def llama4_config(model, scheme, context: int) -> dict:
    """config.json of a Llama 4 text model (dense layers, no qk norm) for a ``layers`` scheme with NoPE
    layers: its RoPE layers' one rope (pairs (2k, 2k+1): the q/k rows are reordered), ``no_rope_layers``,
    the NoPE layers' temperature as ``attn_temperature_tuning`` and chunks as ``attention_chunk_size``."""
    cfg = model.cfg
    _check_llama_model(model, scheme)
    fields = export_layers(scheme, cfg.n_layers)
    rp = fields.get("rope_parameters")
    why = ("a sliding window (Llama 4 has chunks only)" if "sliding_window" in fields else
           "no RoPE layer" if rp is None else "different ropes in its layers" if "rope_type" not in rp else
           "a partial rotation" if rp.get("partial_rotary_factor", 1.0) != 1.0 else
           "sinks" if any(part_window(p)[2] for p in scheme.layers.parts.values()) else
           "a logit soft-cap (Llama 4 has none)" if "attn_logit_softcapping" in fields else None)
    if why:
        raise InteropError(f"scheme '{scheme.name}' has NoPE layers, which Llama 4 text can hold, but also {why}",
                           code="E962", hint="export a run whose RoPE layers share one full rotation")
    scale = fields.get("floor_scale")
    tuning = {"floor_scale": int(scale) if float(scale).is_integer() else scale,
              "attn_scale": fields["attn_scale"]} if scale is not None else {}
    return {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", **_decoder_fields(model),
            "intermediate_size_mlp": model.blocks[0].mlp.fc.out_features, "moe_layers": [], "use_qk_norm": False,
            "attention_bias": False, "max_position_embeddings": context, "rope_parameters": rp,
            "no_rope_layers": fields["no_rope_layers"], "attention_chunk_size": fields.get("attention_chunk_size"),
            "layer_types": fields["layer_types"], "attn_temperature_tuning": fields["attn_temperature_tuning"],
            **tuning}


def _check_llama_model(model, scheme) -> None:
    """What every Hugging Face export needs of the model: arch llama, no q/k convolution, no learned scheme."""
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


def export_model(model, scheme, out_dir: str | Path, *, context: int) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of a pedsl ``TransformerLM`` (``arch: llama``)."""
    if scheme.layers is not None and any(not p.transports for p in scheme.layers.parts.values()):
        config = llama4_config(model, scheme, context)  # NoPE layers: Llama 4 text holds them
        halves = next(p for p in scheme.layers.parts.values() if p.transports).layout == "halves"
        tensors = llama_state_dict(model, interleaved=False, mlp="feed_forward",
                                   order=interleaved_order(model.cfg.head_dim) if halves else None)
        return _write(out_dir, config, tensors)
    config = llama_config(model, scheme, context)
    layout = next(iter(scheme.layers.parts.values())).layout if scheme.layers is not None else scheme.layout
    return _write(out_dir, config, llama_state_dict(model, interleaved=layout == "interleaved"))


def _write(out_dir: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    out = ensure_dir(out_dir)
    atomic_write_bytes(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    return out


def export_run(run: str | Path, out_dir: str | Path) -> Path:
    """Export a run directory's latest checkpoint (see the module docstring)."""
    model, cfg, meta = open_run(run)
    return export_model(model, meta["scheme"], out_dir, context=cfg.context)
