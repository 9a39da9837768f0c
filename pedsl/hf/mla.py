"""Multi-head latent attention (MLA: DeepSeek-V2/V3, MiniCPM3, LongCat-Flash, GLM-4.7-Flash, ...) as pedsl reads it.

MLA's attention heads are wider than its rotary: each query and key head holds ``qk_nope_head_dim`` channels that
no position touches, then ``qk_rope_head_dim`` channels that the model's rotary turns (its config class sets
``head_dim`` to the rotary's width, ``qk_rope_head_dim``), and the values have ``v_head_dim`` channels of their own.
Read from transformers 5's ``modeling_deepseek_v3.py`` and the files of the other types (registry ``mla``):

- the rotation pairs the last slice's channels interleaved (2p, 2p + 1) - DeepSeek-V2's complex product, and
  ``apply_rotary_pos_emb_interleave`` where the config's ``rope_interleave`` is true (its default) - or as
  rotate_half (p, p + r/2: MiniCPM3, and ``rope_interleave`` false). ``apply_rotary_pos_emb_interleave`` writes
  the turned pairs back de-interleaved (evens, then odds), the same permutation for q and k, so the scores are
  those of the interleaved rotation;
- the frequencies are the rope table of a ``qk_rope_head_dim``-wide head (every rope type);
- the softmax scale is ``qk_head_dim ** -0.5`` times ``yarn_get_mscale(factor, mscale_all_dim) ** 2`` when the
  rope type is not ``default`` and ``mscale_all_dim`` is set (``yarn_apply_mscale``): every channel's logit, a
  constant temperature of the scheme.

``import-hf`` writes ``channels { plain = range(0, head_dim - rope_head_dim); rot = rest }`` over the whole
``qk_nope_head_dim + qk_rope_head_dim`` head, and ``use_pedsl_attention`` runs it on the general path with the
model's values of ``v_head_dim`` channels (:mod:`pedsl.hf.value_width`). No torch here: import-hf reads this.
"""

from __future__ import annotations

import math

from pedsl.errors import InteropError, quoted
from pedsl.hf import registry

#: The attention layers' attribute holding the factor of HF's ``scaling`` that the scheme's temperature carries.
SOFTMAX_MSCALE = "_pedsl_mla_mscale"


def _family(cfg: dict):
    fam = registry.family((registry.model_types(cfg) or [""])[-1])
    return fam if fam is not None and fam.mla and not fam.refused else None


def is_mla(cfg: dict) -> bool:
    """Whether the config's model type is a taught MLA type."""
    return _family(cfg) is not None


def _width(cfg: dict, key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 16:
        raise InteropError(f"config key '{key}' must be a whole number of channels (0 .. 65536), got {quoted(v, 60)}",
                           code="E963", hint="a multi-head latent attention config gives qk_nope_head_dim and "
                           "qk_rope_head_dim (transformers' save_pretrained writes them)")
    return v


def qk_widths(cfg: dict) -> tuple[int, int] | None:
    """(qk_nope_head_dim, qk_rope_head_dim) of an MLA config, None for any other."""
    if _family(cfg) is None:
        return None
    nope, rope = _width(cfg, "qk_nope_head_dim"), _width(cfg, "qk_rope_head_dim")
    if nope + rope < 1:
        raise InteropError("qk_nope_head_dim + qk_rope_head_dim is 0: an attention head needs a channel", code="E963")
    return nope, rope


def _mla_widths(cfg: dict) -> tuple[int, int]:
    """(qk_nope_head_dim, qk_rope_head_dim) of a config known to be MLA's."""
    widths = qk_widths(cfg)
    assert widths is not None, "an MLA config"  # callers ask is_mla first
    return widths


def qk_head_dim(cfg: dict) -> int | None:
    """The width of an MLA model's query and key heads (the scheme's head_dim), None for any other model."""
    widths = qk_widths(cfg)
    return None if widths is None else sum(widths)


def layout(cfg: dict, fam) -> str:
    """The pairing of the rotated channels: the record's, or the config's ``layout_key`` (true: interleaved,
    HF's default) for a type that reads one."""
    if fam is None or fam.layout_key is None:
        return fam.layout if fam is not None else "halves"
    value = cfg.get(fam.layout_key, True)
    if not isinstance(value, bool):
        raise InteropError(f"config key '{fam.layout_key}' must be true or false, got {quoted(value, 60)}",
                           code="E963")
    return "interleaved" if value else "halves"


def read_keys(cfg: dict) -> frozenset:
    """The top-level keys an MLA config's rotary reads, which import-hf refuses in any other model type."""
    fam = _family(cfg)
    if fam is None:
        return frozenset()
    return frozenset({"qk_rope_head_dim"} | ({fam.layout_key} if fam.layout_key else set()))


def rotary_config(cfg: dict) -> dict:
    """The config as the model's rotary embedding reads it: ``head_dim`` the rotary's width (its config class sets
    it so; a file may lack it). A ``whole_head`` type's rotary reads head_dim = qk_nope_head_dim +
    qk_rope_head_dim and a partial_rotary_factor giving qk_rope_head_dim channels (Mistral 4's config class sets
    both): the same table at the rotary's width, its factor 1."""
    if not is_mla(cfg):
        return cfg
    nope, rope = _mla_widths(cfg)
    if not _family(cfg).whole_head:
        return {**cfg, "head_dim": rope}
    rp = cfg.get("rope_parameters")
    rp = rp if isinstance(rp, dict) else {}
    head = cfg.get("head_dim") or nope + rope  # the rotary's table: int(head_dim * partial_rotary_factor) channels
    prf = rp.get("partial_rotary_factor", rope / (nope + rope))
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not isinstance(head, int) or \
            int(head * prf) != rope:
        raise InteropError(f"rope_parameters.partial_rotary_factor {quoted(prf)} of head_dim {quoted(head)} gives a "
                           f"rotary table of other than qk_rope_head_dim = {rope} channels, which the model's "
                           "attention rotates: the native model cannot run this config", code="E961",
                           hint="nothing was written")
    rp = {k: v for k, v in rp.items() if k != "partial_rotary_factor"}
    return {**cfg, "head_dim": rope, "partial_rotary_factor": None, **({"rope_parameters": rp} if rp else {})}


def widen(spec: dict, cfg: dict) -> None:
    """Turn the rope spec of the rotary's width into the whole MLA head: ``head_dim`` the query/key head,
    ``mla_rope`` the rotated last channels, ``softmax_mscale`` the temperature HF's scaling carries."""
    nope, rope = _mla_widths(cfg)
    if spec["rotated"] != rope:
        raise InteropError(f"partial_rotary_factor {spec['partial_rotary_factor']:g} narrows the rotary of "
                           f"qk_rope_head_dim = {rope}: pedsl does not know how this MLA model type reads it",
                           code="E961", hint="nothing was written")
    spec["head_dim"], spec["mla_rope"] = nope + rope, rope
    spec["fields"].update(head_dim="qk_nope_head_dim + qk_rope_head_dim", mla_rope="qk_rope_head_dim",
                          rope_head_dim="qk_rope_head_dim")
    spec["softmax_mscale"] = softmax_mscale(spec)


def softmax_mscale(spec: dict) -> float:
    """HF's ``yarn_apply_mscale``: the factor of the softmax scale, ``yarn_get_mscale(factor, mscale_all_dim) ** 2``
    for a rope type other than ``default`` with ``mscale_all_dim`` set, else 1."""
    factor, all_dim = spec.get("factor"), spec.get("mscale_all_dim")
    if spec["rope_type"] == "default" or not all_dim or factor is None or factor <= 1:
        return 1.0
    return (0.1 * all_dim * math.log(factor) + 1.0) ** 2


def softmax_mscale_of(cfg: dict) -> float:
    """:func:`softmax_mscale` of a model's config (its rope_parameters), for the attention layers to undo from the
    ``scaling`` HF passes: the scheme's temperature, or its absence, is what applies."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        return 1.0
    factor = rp.get("factor")
    return softmax_mscale({"rope_type": rp.get("rope_type", rp.get("type", "default")), "mscale_all_dim":
                           rp.get("mscale_all_dim"), "factor": float(factor) if factor is not None else None})


def channel_lines() -> list[str]:
    """The channel groups of an MLA head: the first channels unrotated, the rotary's last ``rope_head_dim``."""
    return ["  channels {", "    plain = range(0, head_dim - rope_head_dim)", "    rot = rest", "  }"]


def temperature_lines(spec: dict, q_scale: str | None = None) -> list[str]:
    """The softmax scale's YaRN factor as the scheme's temperature (none when HF applies none), times ``q_scale``
    (the attention's query scale by position, Mistral 4's) where given: one temperature, their product."""
    factors = [] if spec.get("softmax_mscale", 1.0) == 1.0 else ["(0.1 * mscale_all_dim * log(factor) + 1)"] * 2
    factors += ([f"({q_scale})"] if factors else [q_scale]) if q_scale else []
    if not factors:
        return []
    return [f"  temperature = {' * '.join(factors)}", "  allow temperature_without_length"]


def mark_layers(model, layers) -> None:
    """Tell each attention layer of an MLA model the factor of HF's ``scaling`` that is YaRN's (undone by the
    attention function; the default scheme's temperature carries it) and the order that puts the channels HF's
    interleaved application de-interleaved back in the projections' order (:func:`channel_order`)."""
    cfg = model.config.get_text_config().to_dict()
    if not is_mla(cfg) or not layers:
        return
    factor = softmax_mscale_of(cfg)
    order = channel_order(layers[0], cfg)
    for layer in layers:
        object.__setattr__(layer, SOFTMAX_MSCALE, factor)
        if order is not None:
            object.__setattr__(layer, CHANNEL_ORDER, order)


#: The attention layers' attribute holding the index that restores the projections' channel order.
CHANNEL_ORDER = "_pedsl_mla_order"


def channel_order(layer, cfg: dict):
    """The index (a LongTensor over the q/k head) that undoes how the model's interleaved rotary application lays
    its channels out, probed on the identity rotation; None when it keeps them in place. DeepSeek-V3's
    ``apply_rotary_pos_emb_interleave`` returns the turned pairs as evens then odds, so q and k reach the attention
    (and HF's cache) permuted: pedsl's scheme, written over the projections' channels, reads them re-interleaved."""
    import sys

    import torch

    apply = getattr(sys.modules.get(type(layer).__module__), "apply_rotary_pos_emb_interleave", None)
    if apply is None or layout(cfg, _family(cfg)) != "interleaved":
        return None
    nope, rope = _mla_widths(cfg)
    x = torch.arange(rope, dtype=torch.float64).view(1, 1, 1, rope)
    got, _ = apply(x, x, torch.ones(1, 1, rope, dtype=torch.float64), torch.zeros(1, 1, rope, dtype=torch.float64))
    perm = got.reshape(-1).round().long()  # the model's slot i holds the projection's channel perm[i]
    if sorted(perm.tolist()) != list(range(rope)):
        raise InteropError(f"{type(layer).__name__}'s interleaved rotary application does not permute the "
                           f"{rope} rotary channels on the identity rotation: pedsl does not know how it lays them "
                           "out", code="E964")
    if bool((perm == torch.arange(rope)).all()):
        return None
    return torch.cat([torch.arange(nope), nope + torch.argsort(perm)])
