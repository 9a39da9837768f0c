"""Why pedsl refuses the Hugging Face model types it has read but cannot import exactly: one paragraph per type.

:mod:`pedsl.hf.registry` turns each entry into a refused record (``model_type '<type>' <reason>``), which
``pedsl import-hf`` and ``use_pedsl_attention`` both raise, and ``python -m tools.hf_sweep`` writes into
docs/hf-compatibility.md. Each reason was read from that type's ``modeling_*.py`` in transformers 5 and names
the field or the piece of the model's code pedsl cannot carry. The reasons come in groups (:data:`GROUPS`),
each with a test in compiler_tests/hf/test_hf_refusals.py.

:data:`REFUSED_WHEN` holds the refusals of taught types that apply only when one config field is set.
"""

from __future__ import annotations

_ENCODER = ("attends bidirectionally (is_causal=False): import-hf writes and use_pedsl_attention drives causal "
            "decoders only. Its attention is the library's {scheme}, equal to {peer} with the same weights "
            "(tested in float64), not yet written from a config")
MROPE = ("uses M-RoPE (multimodal rotary embedding: each rotated pair reads one of three positions - time, height, "
         "width - split by mrope_section), whose positions are not one token index")
_ALIBI = ("adds ALiBi slopes (alibi) to its attention scores through its own attention code, not transformers' "
          "attention interface that pedsl's adapter replaces")
_DSA = ("uses DeepSeek sparse attention: its lightning indexer keeps each query's index_topk keys by scores of q and "
        "k turned by the model's own rotary, which pedsl's general path replaces with the identity (the keys kept "
        "would differ past index_topk tokens), and the indexer's picks reach the attention as HF's mask, not as a "
        "position pedsl's scheme reads")
_OWN_CODE = ("{what} in its own attention code ({where}), which does not go through transformers' attention "
             "interface that pedsl's adapter replaces: use_pedsl_attention cannot take its scores over")
_CONTENT_BIAS = ("adds a hidden-state-conditioned relative position bias to its scores ({where}): each query token "
                 "mixes a trained bank of bias-versus-distance profiles into one bias per backward distance below "
                 "rel_extent, so the bias reads the token's hidden state as well as its distance, and transformers' "
                 "attention interface passes pedsl no hidden state (pedsl's bias terms read positions and the "
                 "scheme's own parameters)")
_PROPORTIONAL = ("rope_type 'proportional' (the first int(partial_rotary_factor * head_dim // 2) pairs (p, p + "
                 "head_dim / 2) turn at rope_theta ** (-2p / head_dim), the exponent spread over the whole head, the "
                 "other pairs frequency 0), which import-hf does not read")
_GEMMA4 = ("gives its full layers another head width than its sliding layers (global_head_dim, 512 in the released "
           "configs, against head_dim 256) and rotates them with " + _PROPORTIONAL + "; a pedsl layers scheme "
           "compiles every part for one head_dim (E252), so parts of different widths cannot be written")
_GEMMA3N = ("gives its layer types different rope parameters and shares KV caches across layers (gemma3n's altup "
            "and laurel blocks); pedsl imports one scheme for all layers")

# Reason groups (each has a test): the model types whose reasons share one cause.
GROUPS = {
    "encoder": ("modernbert", "t5", "pixtral", "qwen2_vl_vision", "moonshine", "roformer"),
    "M-RoPE": ("qwen3_5", "qwen3_5_moe", "qwen2_5_omni", "qwen3_omni_moe", "glm4v", "glm4v_text", "glm4v_moe",
               "glm4v_moe_text", "ernie4_5_vl_moe", "glm_image"),
    "own attention code": ("bloom", "mpt", "baichuan", "cpmant", "gpt_neox_japanese"),
    "sparse or compressed keys": ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "deepseek_v4", "minimax_m3_vl_text"),
    "content-dependent bias": ("inkling_text", "inkling2_text", "inkling2_loop_text"),
    "per-layer shapes": ("gemma3n", "gemma3n_text", "mimo_v2_flash", *(f"gemma4{s}" for s in (
        "", "_text", "_assistant", "_unified", "_unified_text", "_unified_assistant"))),
    "scale pedsl cannot undo": ("dory",),
    "untaught rope type": ("lfm3",),
}

REFUSED: dict[str, str] = {
    **{mt: _ENCODER.format(peer=peer, scheme=scheme) for mt, peer, scheme in (
        ("modernbert", "ModernBertModel's", "modernbert_global and modernbert_local in layers { pattern = "
                                            "[modernbert_global, modernbert_local * 2] }"),
        ("t5", "T5's encoder self-attention once q is multiplied by sqrt(head_dim) (T5 scores q . k unscaled)",
         "t5_encoder"),
        ("pixtral", "PixtralVisionModel's", "pixtral_vision"),
        ("qwen2_vl_vision", "Qwen2-VL's vision tower's", "qwen2_vl_vision"))},
    "moonshine": ("is an encoder-decoder speech model: its encoder attends bidirectionally and pedsl's attention is "
                  "causal (is_causal)"),
    "roformer": ("is an encoder (bidirectional, is_causal false) that rotates q and k - and v too when rotary_value "
                 "is true - by its sinusoidal position table (RoFormerSinusoidalPositionalEmbedding, interleaved "
                 "pairs) in its own self-attention code (RoFormerSelfAttention), not through transformers' attention "
                 "interface; pedsl's adapter drives causal decoders through that interface, and a rotation of the "
                 "values is no part of pedsl's scores"),
    **{mt: MROPE + " (Qwen3.5: interleaved, mrope_section over the partial rotary's pairs; its text models "
       "qwen3_5_text / qwen3_5_moe_text are imported)" for mt in ("qwen3_5", "qwen3_5_moe")},
    **{mt: MROPE for mt in ("qwen2_5_omni", "qwen3_omni_moe", "glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text",
                            "ernie4_5_vl_moe", "glm_image")},
    "bloom": _OWN_CODE.format(what="adds ALiBi (slopes of n_head, alibi.baddbmm of q k^T)", where="BloomAttention"),
    "mpt": _OWN_CODE.format(what="adds its ALiBi position_bias (alibi_bias_max, over max_seq_len)",
                            where="MptAttention"),
    "baichuan": _ALIBI,
    "cpmant": _OWN_CODE.format(what="adds a learned bias of segment pairs and relative-distance buckets "
                               "(relative_attention_bias of CpmAntSegmentPositionEmbedding: segment_types ** 2 + "
                               "position_bias_num_buckets entries, position_bias_max_distance), which reads each "
                               "token's segment as well as its position,", where="CpmAntAttention"),
    "gpt_neox_japanese": _OWN_CODE.format(what="rotates the first int(head_size * partial_rotary_factor) channels "
                                          "and scores q k^T", where="GPTNeoXJapaneseAttention._attn"),
    **{mt: _DSA for mt in ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4")},
    "deepseek_v4": ("compresses its keys: besides its sliding window of shared key-value heads (sliding_window), its "
                    "compressed layers (compress_rates: compressed_sparse_attention, heavily_compressed_attention) "
                    "pool every compress_rate tokens into one key/value with a learned position_bias per slot, "
                    "rotate it at the window's absolute position with the 'compress' rope_parameters, and an indexer "
                    "(index_topk) picks among them; a pedsl scheme scores one key per token at that token's "
                    "position"),
    "minimax_m3_vl_text": ("uses block-sparse attention on its sparse layers: an indexer (index_n_heads, "
                           "index_block_size, index_topk_blocks, index_local_blocks) scores blocks of keys with q and "
                           "k turned by the model's own rotary and keeps each query's top blocks, anchored to cache "
                           "slots; pedsl's general path replaces that rotary with the identity, so the indexer "
                           "would keep other blocks, and the picks reach the attention as HF's mask, not as a "
                           "position pedsl's scheme reads"),
    **{mt: _CONTENT_BIAS.format(where=where) for mt, where in (
        ("inkling_text", "rel_logits_proj of r_proj's relative_states"),
        ("inkling2_text", "relative_position_bias of the hidden states' relative_states"),
        ("inkling2_loop_text", "relative_position_bias of the hidden states' relative_states, in each looped "
                               "layer"))},
    "gemma3n": _GEMMA3N,
    "gemma3n_text": _GEMMA3N,
    **{f"gemma4{s}": _GEMMA4 for s in ("", "_text", "_assistant", "_unified", "_unified_text", "_unified_assistant")},
    "mimo_v2_flash": ("gives only its sliding layers a sink logit per head (sinks; its full layers have none) and twice "
                      "the key/value heads (num_key_value_heads * 2) of its full layers, rotates each layer type's "
                      "first int(head_dim * partial_rotary_factor) channels (0.334 by default), and scales the "
                      "values by attention_value_scale; pedsl's registry gives a type's sinks to every layer or to "
                      "none, so its layers scheme would add sinks the full layers do not have"),
    "dory": ("multiplies each query channel by its own learned scale after the rotation (nGPT's sqk: q * (sqk * "
             "sqk_scale) ** 2 per channel, after apply_rotary_pos_emb); pedsl's adapter receives q after that scale "
             "and rotates it itself, and a rotation commutes with a per-channel scale only when both channels of "
             "every rotated pair share it, which the learned sqk does not (the scores would differ)"),
    "lfm3": ("rotates its full layers with " + _PROPORTIONAL + "; its sliding layers take the default rope, its conv "
             "layers no attention"),
}

# Refusals of a taught type that hold only when a config field is set (the field, why).
REFUSED_WHEN = {
    "doge": ("sliding_window", "with a sliding_window masks each layer with a content-dependent float mask (its "
             "dynamic mask, from the values) inside that window; pedsl's windowed layers take HF's boolean mask "
             "(without a window Doge runs on HF's rotary path, its mask untouched)"),
    "falcon": ("alibi", "with alibi = true rounds its ALiBi bias to bfloat16 (slopes.bfloat16() * key positions, "
               "then / sqrt(head_dim)) and passes it inside the float attention mask, not through a position the "
               "attention reads; pedsl's alibi() is exact, so the logits would differ (its rotary, alibi = false, "
               "is imported)"),
}
