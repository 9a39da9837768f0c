"""A drop-in attention for Hugging Face Llama-family models: :func:`use_pedsl_attention`.

One call makes a model (Llama, Mistral, Qwen2, Phi-3, ... - any model whose attention goes
through transformers' ``AttentionInterface`` and whose rotary embedding is a ``rotary_emb``
module) attend with a compiled pedsl scheme:

- HF's own rotary application is turned off: every ``rotary_emb`` returns cos = 1, sin = 0, so
  q and k reach the attention (and HF's KV cache) un-rotated;
- the attention is registered as ``attn_implementation="pedsl"``: it rotates q and the full
  cached keys by the scheme's tables at their positions (the table is HF's cos/sin with the
  attention factor, ``rotate(..., scale = m)``), repeats the key/value heads for GQA, and runs
  ``scaled_dot_product_attention`` with HF's boolean mask (padding, causality, sliding window).

Positions: the cache holds keys in slot order; the last query of a call is always a real token,
so ``offset = (Lk - 1) - position_ids[:, -1]`` maps key slot j to position ``j - offset`` (left
padding in ``generate`` gives each row its own offset; padded slots are masked). Schemes whose
table reads the run-time length (``dynamic_ntk``, ``longrope``) use HF's length
``max(position_ids) + 1``, with HF's grow-only state for dynamic NTK (the table of the longest
length seen, reset when a call is shorter than ``max_position_embeddings``). HF rotates each key
once, when it enters the cache; pedsl rotates every key with the current table, so the two differ
in ``generate`` when a dynamic table changes between steps (dynamic NTK past the original length,
LongRoPE crossing it); prefill and everything else agree.

The adapter handles schemes made of position-indexed rotations (any ``rotate`` grid, any channel
groups, interleaved or halves) and a static temperature; data-dependent transports and biases are
refused with a clear error.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pedsl.errors import InteropError
from pedsl.lang.exprs import calls_in, names_in

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
    """What the attention of one model reads: the compiled scheme and HF's dynamic-length state."""

    def __init__(self, module, original: int | None) -> None:
        self.module = module
        self.original = original  # HF's config.max_position_embeddings (the dynamic reset length)
        self.cached = original
        exprs = [module.graph.nodes[t["phase"]]["expr"] for t in module.transforms if t["op"] == "rotate"]
        # HF keeps a grow-only table for dynamic NTK; LongRoPE picks its list from the length of each call
        self.grow_only = any("n" in names_in(e) or "dynamic_ntk" in calls_in(e) for e in exprs)

    def table_length(self, n: int) -> int:
        """The length the tables are built for: n, or HF's grow-only dynamic NTK state
        (``dynamic_rope_update``: grow past the cached length, reset below max_position_embeddings)."""
        if not self.grow_only or self.original is None:
            return n
        if n > self.cached:
            self.cached = n
        if n < self.original and self.cached > self.original:
            self.cached = self.original
        return self.cached


def _supported(scheme) -> None:
    bad = [t.kind for t in scheme.transports if t.kind != "rotate"]
    if bad or scheme.biases:
        what = f"a {bad[0]} transport" if bad else f"a {scheme.biases[0].kind} bias"
        raise InteropError(f"scheme '{scheme.name}' has {what}; the Hugging Face attention adapter runs "
                           "position-indexed rotations and temperatures", code="E964",
                           hint="use a rotate(...) scheme (RoPE, PI, NTK, YaRN, Llama 3, LongRoPE, RoPE-ID, ...)")
    if scheme.temperature is not None and "position" in names_in(scheme.temperature):
        raise InteropError(f"scheme '{scheme.name}' has a per-position temperature; the adapter takes a constant one",
                           code="E964")


def pedsl_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function: (B, H, Lq, D) q, (B, Hkv, Lk, D) un-rotated k, v."""
    from pedsl.ops import rotary

    state: _State = getattr(module, _ATTR)
    mod = state.module
    B, H, Lq, D = query.shape
    Lk = key.shape[2]
    dev = query.device
    pos_ids = kwargs.get("position_ids")
    if pos_ids is None:
        last = torch.full((B,), Lk - 1, device=dev, dtype=torch.long)
    else:
        last = pos_ids[:, -1].to(dev).long().expand(B)
    kpos = torch.arange(Lk, device=dev)[None, :] - ((Lk - 1) - last)[:, None]  # (B, Lk)
    kpos = kpos.clamp(min=0)  # left-padding slots (masked)
    qpos = kpos[:, Lk - Lq:]
    n = int(last.max()) + 1  # HF's seq_len = max(position_ids) + 1
    L = state.table_length(n)
    q, k = query, key
    for t in mod.transforms:
        cos, sin = mod.rope_tables(t, L, dev, torch.float64)  # (L, P), HF's attention factor included
        ch = t["channels"] if len(t["channels"]) != D else None
        cq, sq = cos[qpos].to(q.dtype)[:, None], sin[qpos].to(q.dtype)[:, None]  # (B, 1, Lq, P)
        ck, sk = cos[kpos].to(k.dtype)[:, None], sin[kpos].to(k.dtype)[:, None]
        q = rotary.apply_rotary_channels(q, cq, sq, ch, mod.layout)
        k = rotary.apply_rotary_channels(k, ck, sk, ch, mod.layout)
    if mod.temperature is not None:
        tau = mod.query_scale(1, dev)  # (1, H|1, 1): constant over positions
        q = q * tau.to(q.dtype)[..., None]
    rep = H // key.shape[1]
    if rep > 1:  # GQA: kv head h serves query heads h * rep .. h * rep + rep - 1 (HF's repeat_kv)
        k, value = k.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    mask = None if attention_mask is None else attention_mask[:, :, :, :Lk]  # bool (B, 1, Lq, Lk): True attends
    causal = mask is None and Lq > 1
    if causal and Lq != Lk:  # bottom-right aligned causal mask
        mask = torch.ones(Lq, Lk, dtype=torch.bool, device=dev).tril(Lk - Lq)
        causal = False
    o = F.scaled_dot_product_attention(q, k, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
                                       is_causal=causal, scale=scaling)
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
    state = _State(mod, getattr(cfg, "max_position_embeddings", None))
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
