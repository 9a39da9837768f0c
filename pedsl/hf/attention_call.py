"""The attention function pedsl registers with transformers' ``AttentionInterface`` (:func:`pedsl_attention_forward`,
installed by :func:`pedsl.hf.attention.use_pedsl_attention`): every keyword HF passes applied or refused
(:data:`APPLIED`, :data:`NO_EFFECT`, :data:`REFUSED`), HF's mask read as the general path's (and dropped where it
allows every key the scheme's own causal band does), the query scales a model applies undone, and the call.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from pedsl.compiler.general import Shape, shape_of
from pedsl.errors import InteropError
from pedsl.hf import mla, value_width
from pedsl.hf.attention_state import _State

NAME = "pedsl"
_ATTR = "_pedsl_attention"

# The keywords HF's attention functions receive (transformers 5: the models' ``attention_interface(...)``
# calls and ``TransformersKwargs``). Applied: scaling by the query scale, position_ids by the positions,
# sliding_window by HF's mask (which carries the window), is_causal=True by causal attention.
APPLIED = ("scaling", "position_ids", "sliding_window", "is_causal", "dropout")
# Keywords that change nothing in the output of one attention call (bookkeeping for other layers or
# for the model's return value) when they are None / False.
NO_EFFECT = ("output_attentions", "output_hidden_states", "output_router_logits", "num_items_in_batch",
             "use_cache", "cache_position", "return_dict", "layer_type")
# What a refusal says for the keywords that would change the result.
REFUSED = {
    "softcap": "a logit soft-cap (tanh(s / cap) * cap, Gemma 2's attn_logit_softcapping)",
    "s_aux": "attention sinks (GPT-OSS: a learned logit per head that takes probability mass)",
    "sinks": "attention sinks (a learned logit per head that takes probability mass)",
    "position_bias": "an additive position bias of the model's own (T5-style)",
    "cu_seq_lens_q": "packed sequences (cumulative sequence lengths)", "cu_seq_lens_k": "packed sequences",
    "max_length_q": "packed sequences", "max_length_k": "packed sequences", "seq_idx": "packed sequences",
    "indices": "a sparse attention pattern (selected key indices)",
    "block_indices": "a sparse attention pattern (selected key blocks)",
}


def _refuse_kwarg(key: str, value) -> None:
    what = REFUSED.get(key, "an argument pedsl's attention does not know")
    raise InteropError(f"transformers passed '{key}={str(value)[:60]}' to pedsl's attention: {what}, which pedsl does "
                       "not apply; the result would silently differ from the model's", code="E964",
                       hint="use this model's own attention (attn_implementation='eager' or 'sdpa') or a model "
                       "without that feature")


def check_kwargs(dropout: float, kwargs: dict) -> None:
    """Refuse every keyword of an attention call that would change its output and is not applied."""
    if dropout:
        _refuse_kwarg("dropout", dropout)
    if kwargs.get("is_causal") is False:
        raise InteropError("transformers asked pedsl's attention for bidirectional attention (is_causal=False); "
                           "pedsl schemes are causal", code="E964", hint="use pedsl attention in decoders only")
    if kwargs.get("output_attentions"):
        raise InteropError("output_attentions=True: pedsl's attention does not return attention weights",
                           code="E964", hint="use attn_implementation='eager' to inspect attention weights")
    for key, value in kwargs.items():
        if key in APPLIED or key in NO_EFFECT:
            continue
        if value is not None and value is not False:
            _refuse_kwarg(key, value)


def _general_mask(attention_mask, B: int, Lq: int, Lk: int, device, fresh: bool = False,
                  shape: Shape | None = None) -> torch.Tensor | None:
    """HF's boolean mask, or the causal one HF skips when nothing is padded: query i (of the last Lq)
    sees key slots j <= i + Lk - Lq. None where the call is ``fresh`` (a new sequence, positions
    0..L-1 in every row) and HF's mask allows every key the scheme's own causal band ``shape`` does:
    the module intersects the two, so the result is the same and the call may take the unmasked kernels
    (SDPA's causal one, the banded ones of a window or chunk)."""
    if fresh and (attention_mask is None or mask_covers_band(attention_mask[:, :, :, :Lk], shape)):
        return None
    if attention_mask is not None:
        return attention_mask[:, :, :, :Lk]
    i = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    return (torch.arange(Lk, device=device)[None, :] <= i).expand(B, 1, Lq, Lk)


def mask_covers_band(mask: torch.Tensor, shape: Shape | None) -> bool:
    """Whether the boolean mask ``(B|1, 1|H, L, L)`` is True wherever causal attention inside ``shape`` (a
    sliding window or chunk over token indices, None: plain causal) lets query i see key j. Exact: every
    entry of the band is read, as strided views of the mask (O(L N) for a window or chunk of N, O(L^2)
    for plain causal, in slabs of rows)."""
    if mask.dtype != torch.bool:
        return False
    L = mask.shape[-1]
    window = shape.window if shape is not None and shape.window is not None and shape.window < L else None
    chunk = shape.chunk if shape is not None and shape.chunk is not None and shape.chunk < L else None
    if window is not None:
        if not _lower_triangles_true(mask[..., :window - 1, :window - 1]):
            return False
        # rows i >= window - 1: entries (i, i - window + 1 .. i), one row of the view per query
        *lead, si, sj = mask.stride()
        band = mask.as_strided((*mask.shape[:-2], L - window + 1, window), (*lead, si + sj, sj),
                               mask.storage_offset() + (window - 1) * si)
        return bool(band.all())
    if chunk is not None:
        full = L // chunk
        *lead, si, sj = mask.stride()
        tiles = mask.as_strided((*mask.shape[:-2], full, chunk, chunk), (*lead, chunk * (si + sj), si, sj),
                                mask.storage_offset())
        return _lower_triangles_true(tiles) and _lower_triangles_true(mask[..., full * chunk:, full * chunk:])
    return _lower_triangles_true(mask)


def _lower_triangles_true(tiles: torch.Tensor, slab: int = 1024) -> bool:
    """Whether the square tiles ``(..., n, n)`` are True on and below their diagonals (in slabs of rows)."""
    n = tiles.shape[-1]
    for r0 in range(0, n, slab):
        r1 = min(n, r0 + slab)
        below = torch.ones(r1 - r0, r1, dtype=torch.bool, device=tiles.device).tril(r0)
        if not bool((tiles[..., r0:r1, :r1] | ~below).all()):
            return False
    return True


def pedsl_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function: q (B, H, Lq, D), k, v (B, Hkv, Lk, D) from HF's cache
    (rotated on HF's rotary path, un-rotated on the general path) -> (B, Lq, H, D)."""
    state: _State = getattr(module, _ATTR)
    q_scale = getattr(module, _Q_SCALE, None)
    if q_scale is not None:  # the model scaled q by position (Ministral 3): undone, the scheme's temperature applies
        query = query / llama4_q_scale(q_scale, kwargs.get("position_ids"), query)
    if getattr(module, _SSMAX, False):  # Beam's NoPE layers: HF's scale undone, the part's temperature applies
        query = query / ssmax_q_scale(kwargs.get("position_ids"), query)
    if state.module is not None and getattr(state.module, "sink_logit", None) is getattr(module, "sinks", 0):
        kwargs.pop("s_aux", None)  # the model's sinks are the part's sink logits (_layer_state)
    if kwargs.get("softcap") is not None and state.module is not None and state.module.plan.softcap == kwargs["softcap"]:
        kwargs.pop("softcap")  # the scheme caps the scores alike (_check_softcap)
    check_kwargs(dropout, kwargs)
    if scaling is not None:  # MLA's YaRN factor of the softmax scale: the scheme's temperature, or none, applies
        scaling = scaling / getattr(module, mla.SOFTMAX_MSCALE, 1.0)
    if state.hf is not None:  # q and k carry the scheme's rotation: plain causal attention
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling)
    order = getattr(module, mla.CHANNEL_ORDER, None)
    if order is not None:  # MLA: HF's interleaved application laid the rotary channels out de-interleaved
        query, key = query[..., order.to(query.device)], key[..., order.to(key.device)]
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    dev = query.device
    pos_ids = kwargs.get("position_ids")
    last = (torch.full((B,), Lk - 1, device=dev, dtype=torch.long) if pos_ids is None
            else pos_ids[:, -1].to(dev).long().expand(B))
    if state.hf_tuning is not None:  # HF's temperature counts cache slots (left padding included), not positions
        last = torch.full((B,), Lk - 1, device=dev, dtype=torch.long)
    kpos = (torch.arange(Lk, device=dev)[None, :] - ((Lk - 1) - last)[:, None]).clamp(min=0)  # (B, Lk)
    if scaling is not None and abs(scaling * D ** 0.5 - 1) > 1e-12:  # pedsl scales scores by 1 / sqrt(D)
        query = query * (scaling * D ** 0.5)
    if state.hf_tuning is not None:  # the scheme's temperature replaces the model's own
        query = query / llama4_tuning(state.hf_tuning, Lk - Lq, Lq, dev).to(query.dtype)
    fresh = Lq == Lk and bool((last == Lk - 1).all())  # key slot j at position j in every row
    mask = _general_mask(attention_mask, B, Lq, Lk, dev, fresh, shape_of(state.module.plan))
    # HF's own mask is the truth for the band: a chunk starts at a left-padded row's first token, not at
    # a multiple of the chunk in the positions (which the rotation reads as HF does)
    band = not (state.hf_band and mask is not None and attention_mask is not None)
    positions: torch.Tensor | None = kpos
    if fresh and mask is None:  # one new sequence at positions 0..L-1, nothing masked: the fused kernels' call
        positions = None
        if key.shape[1] != H:  # as HF's own SDPA path does (repeat_kv): the fused kernels take H key heads
            key, value = key.repeat_interleave(H // key.shape[1], 1), value.repeat_interleave(H // value.shape[1], 1)
    o = value_width.attend(state.module, query, key, value, positions=positions, attn_mask=mask, band=band)
    return o.transpose(1, 2).contiguous(), None


def llama4_tuning(tuning: tuple[float, float], past: int, Lq: int, device) -> torch.Tensor:
    """(1, 1, Lq, 1) the query scale Llama 4's NoPE layers apply before the attention function (in float32,
    at positions past .. past + Lq - 1 as HF counts them): log1p(floor((p + 1) / floor_scale)) * attn_scale + 1."""
    floor_scale, attn_scale = tuning
    p = torch.arange(Lq, device=device) + past
    return (torch.log1p(torch.floor((p.float() + 1.0) / floor_scale)) * attn_scale + 1.0).view(1, 1, Lq, 1)


def llama4_q_scale(q_scale: tuple[float, int], position_ids, query: torch.Tensor) -> torch.Tensor:
    """(B, 1, Lq, 1) the factor Ministral 3's attention multiplied q by, as HF computes it (float32, then q's dtype):
    1 + beta * log(1 + floor(position / original)) at the query positions HF passes."""
    if position_ids is None:
        raise InteropError("the model scales its queries by position (llama_4_scaling_beta) but passed no "
                           "position_ids to the attention: pedsl cannot undo the scale", code="E965")
    beta, original = q_scale
    scale = 1 + beta * torch.log(1 + torch.floor(position_ids.to(query.device) / original))
    return scale[:, None, :, None].to(query.dtype)


def ssmax_q_scale(position_ids, query: torch.Tensor) -> torch.Tensor:
    """(B, 1, Lq, 1) the factor Beam's NoPE layers multiplied q by, as HF computes it (float32):
    exp(0.1 * log1p((position + 1) / 2048)) at the query positions HF passes."""
    if position_ids is None:
        raise InteropError("the model scales its queries by position (scalable softmax) but passed no position_ids "
                           "to the attention: pedsl cannot undo the scale", code="E965")
    scale = torch.exp(0.1 * torch.log1p((position_ids.to(query.device).float() + 1) / 2048))
    return scale[:, None, :, None].to(query.dtype)


_Q_SCALE = "_pedsl_q_scale"
_SSMAX = "_pedsl_ssmax"


def _register() -> None:
    AttentionInterface.register(NAME, pedsl_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # boolean, or None for a plain causal call


__all__ = ["pedsl_attention_forward", "check_kwargs", "mask_covers_band", "NAME", "APPLIED", "NO_EFFECT", "REFUSED"]
