"""A drop-in attention for Hugging Face Llama-family models: :func:`use_pedsl_attention`.

One call makes a model (Llama, Mistral, Qwen2, Phi-3, ... - any model whose attention goes
through transformers' ``AttentionInterface`` and whose rotary embedding is a ``rotary_emb``
module) attend with a compiled pedsl scheme:

- HF's own rotary application is turned off: every ``rotary_emb`` returns cos = 1, sin = 0, so
  q and k reach the attention (and HF's KV cache) un-rotated;
- the attention is registered as ``attn_implementation="pedsl"`` and calls the compiled module's
  general forward (:mod:`pedsl.compiler.stream`) with the keys' positions, HF's boolean mask
  (padding, causality, sliding window) and grouped-query heads.

Positions: the cache holds keys in slot order and the last query of a call is always a real token,
so ``offset = (Lk - 1) - position_ids[:, -1]`` maps key slot j to position ``j - offset`` (left
padding in ``generate`` gives each row its own offset; padded slots are masked). The run-time
length of ``dynamic_ntk`` and ``longrope`` tables is HF's ``max(position_ids) + 1``. HF rotates
each key once, when it enters its cache, with the table of that call; for schemes whose table reads
the length the adapter keeps a pedsl cache per layer (``module.new_cache``) so keys keep their
table the same way, and greedy ``generate`` matches HF past the original length too. (HF also keeps
the longest dynamic-NTK table across separate calls until a call is shorter than
``max_position_embeddings``; pedsl uses each call's own length.) Other schemes are stateless: every
call rotates the full cached keys, which is what HF's cached rotated keys hold.

Schemes that read the hidden state or the tokens (data-dependent transports and gates) cannot run
here: the attention interface receives q, k, v only.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pedsl.errors import InteropError
from pedsl.compiler.plan import RUNTIME_LENGTH

NAME = "pedsl"
_ATTR = "_pedsl_attention"


class _NoRotary(nn.Module):
    """Wraps a model's rotary embedding and returns the identity rotation of the same shape."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, position_ids, *args, **kwargs):
        cos, sin = self.inner(x, position_ids, *args, **kwargs)
        return torch.ones_like(cos), torch.zeros_like(sin)


class _State:
    """What the attention layers of one model share: the compiled scheme, and per layer the pedsl
    cache with a fingerprint of the last key it saw (schemes whose table reads the length)."""

    def __init__(self, module) -> None:
        self.module = module
        self.keep_cache = any(t.table == RUNTIME_LENGTH for t in module.transforms)
        self.caches: dict[int, tuple] = {}


def _supported(scheme) -> None:
    if scheme.needs_x or scheme.needs_tokens:
        raise InteropError(f"scheme '{scheme.name}' reads the hidden state or the tokens, which transformers' "
                           "attention interface does not pass", code="E964",
                           hint="use a scheme of position-indexed rotations, biases and temperatures")


def pedsl_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function: q (B, H, Lq, D), un-rotated k, v (B, Hkv, Lk, D) from
    HF's cache -> (B, Lq, H, D)."""
    state: _State = getattr(module, _ATTR)
    mod = state.module
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    dev = query.device
    pos_ids = kwargs.get("position_ids")
    last = (torch.full((B,), Lk - 1, device=dev, dtype=torch.long) if pos_ids is None
            else pos_ids[:, -1].to(dev).long().expand(B))
    kpos = (torch.arange(Lk, device=dev)[None, :] - ((Lk - 1) - last)[:, None]).clamp(min=0)  # (B, Lk)
    mask = None if attention_mask is None else attention_mask[:, :, :, :Lk]
    if scaling is not None and abs(scaling * D ** 0.5 - 1) > 1e-12:  # pedsl scales scores by 1 / sqrt(D)
        query = query * (scaling * D ** 0.5)
    cache = None
    if state.keep_cache:
        past = Lk - Lq
        layer = getattr(module, "layer_idx", 0)
        cache, seen = state.caches.get(layer, (None, None))
        fresh = not (cache is not None and past > 0 and len(cache) == past and seen is not None
                     and seen.shape == key[:, :, past - 1].shape and torch.equal(key[:, :, past - 1], seen))
        if fresh:  # a new sequence (or HF's cache was cropped / reordered): start from all the keys
            cache = mod.new_cache(B)
        else:
            key, value, kpos = key[:, :, past:], value[:, :, past:], kpos[:, past:]
        state.caches[layer] = (cache, key[:, :, -1].clone())
    o = mod(query, key, value, positions=kpos, attn_mask=mask, cache=cache)  # (B, H, Lq, D)
    return o.transpose(1, 2).contiguous(), None


def _mask_fn():
    from transformers.masking_utils import sdpa_mask

    def pedsl_mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False  # always an explicit (B, 1, Lq, Lk) boolean mask
        return sdpa_mask(*args, **kwargs)

    return pedsl_mask


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, pedsl_attention_forward)
    AttentionMaskInterface.register(NAME, _mask_fn())


def scheme_for(model, scheme=None):
    """The resolved scheme to use: the model's own rope (import-hf of its config) when None, else a
    path / text / Scheme loaded with the model's heads and head_dim."""
    from pedsl.hf.rope import import_config
    from pedsl.lang.api import load
    from pedsl.lang.scheme import Scheme

    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if scheme is None:
        d = cfg.to_dict()
        return load(import_config(d))
    if isinstance(scheme, (str, Path, Scheme)):
        return load(scheme, heads=heads, head_dim=head_dim)
    raise InteropError(f"scheme must be a path, .pe text or a pedsl Scheme, not {type(scheme).__name__}", code="E964")


def use_pedsl_attention(model, scheme=None, *, backend: str = "auto"):
    """Make ``model`` attend with a compiled pedsl scheme (see the module docstring); returns the model.

    ``scheme``: a `.pe` path or text, or a loaded Scheme; by default the model's own rope parameters
    imported with :func:`pedsl.hf.import_config` (then the logits equal the native model's)."""
    from pedsl.compiler import compile_scheme

    sch = scheme_for(model, scheme)
    _supported(sch)
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if sch.heads != heads or sch.head_dim != head_dim:
        raise InteropError(f"scheme '{sch.name}' is for {sch.heads} heads of {sch.head_dim}; the model has {heads} "
                           f"of {head_dim}", code="E964", hint="drop heads/head_dim params from the scheme")
    mod = compile_scheme(sch, num_heads=heads, head_dim=head_dim, backend=backend, requires_grad=False)
    state = _State(mod)
    layers = [m for m in model.modules() if hasattr(m, "q_proj") or hasattr(m, "qkv_proj")]
    if not layers:
        raise InteropError(f"{type(model).__name__} has no attention layers with q_proj / qkv_proj", code="E964")
    rotaries = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
                if name == "rotary_emb" and not isinstance(child, _NoRotary)]
    if not rotaries and not any(isinstance(m, _NoRotary) for m in model.modules()):
        raise InteropError(f"{type(model).__name__} has no rotary_emb module to turn off", code="E964")
    for layer in layers:
        object.__setattr__(layer, _ATTR, state)  # a plain attribute: not a submodule, not in the state_dict
    for parent, name in rotaries:
        setattr(parent, name, _NoRotary(getattr(parent, name)))
    _register()
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:  # pragma: no cover - a model without the attention interface
        raise InteropError(f"{type(model).__name__} does not dispatch through transformers' AttentionInterface",
                           code="E964")
    return model


__all__ = ["use_pedsl_attention", "pedsl_attention_forward", "NAME"]
