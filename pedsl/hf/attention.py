"""A drop-in attention for Hugging Face Llama-family models: :func:`use_pedsl_attention`.

One call makes a model (Llama, Mistral, Qwen2, Phi-3, ... - any model whose attention goes
through transformers' ``AttentionInterface`` and whose rotary embedding is a ``rotary_emb``
module) attend with a compiled pedsl scheme. Two ways, chosen once per model:

- **HF's rotary path** (a scheme in HF's rope family: what ``export-hf`` accepts - one halves-layout
  rotation of the first channels, no bias, no temperature - and a model whose own rotary application
  computes exactly that rotation, which is probed once): ``rotary_emb`` returns the scheme's cos and
  sin in the model's own format, so HF rotates q and k with them and every key enters HF's cache
  rotated, once, with the table of its call, as in the native model. Beam search, contrastive
  search, assisted decoding, cropping and several conversations with their own caches then
  follow HF's cache by construction; attention is SDPA, at the native model's speed. Tables that read
  the run-time length (``dynamic_ntk``, ``longrope``) use HF's length: ``max(position_ids) + 1``,
  and for dynamic NTK the longest length seen until a call is shorter than the original (HF's
  ``dynamic_rope_update``). Multi-axis models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: ``position_ids`` of
  shape (3, B, L)) take this path with an M-RoPE scheme (``sections`` / ``interleave``): pair k's phase
  is its frequency times the position of its axis; a one-axis scheme runs there only where the three
  positions agree (text).
- **the general path** (every other position-indexed scheme: biases, temperatures, interleaved or
  scattered rotations, ...): every ``rotary_emb`` returns cos = 1, sin = 0, q and k reach HF's cache
  un-rotated, and each call runs the compiled module's general forward (:mod:`pedsl.compiler.stream`)
  on all cached keys with their positions, HF's boolean mask (padding, causality, sliding window) and
  grouped-query heads. Nothing is kept between calls, so reordering or swapping HF's cache is exact. An
  unpadded new sequence (HF passes no mask) is the module's own fresh call and takes its fused kernels.
  A scheme whose table reads the run-time length cannot take this path (each key would need the table
  of the call that cached it, which HF's cache does not hold): refused. So is a multi-axis model or
  scheme: transformers passes 3-axis positions to the rotary embedding only, never to the attention.

Positions on the general path: the cache holds keys in slot order and the last query of a call is
always a real token, so ``offset = (Lk - 1) - position_ids[:, -1]`` maps key slot j to position
``j - offset`` (left padding in ``generate`` gives each row its own offset; padded slots are masked).
A model that does not pass ``position_ids`` to its attention (Llama 4) gets slot indices, which a
relative rotation reads as HF's positions. Where HF's mask carries the layer's window or chunk (a
``layers`` scheme, checked when installed), that mask, not ``p // chunk`` of the positions, decides the
band: HF starts a left-padded row's chunks at its first real token. A one-part scheme's window or chunk
is over its own positions (HF's mask of a model without one is plain causal): a left-padded row's chunks
start at its first real token where ``position_ids`` count from it (``generate``), at slot 0 in a plain
forward, which HF gives slot indices. Llama 4's NoPE temperature reads the slot index (padding
counted), as HF's does.

A scheme with learned parameters (``learned(...)``, ``table``, ``mlp``: T5's relative bias, dynamic
position bias, KERPLE, learned ALiBi) runs on the general path inside the attention, which gets q, k and
v; its one compiled module is the model's submodule ``pedsl_scheme``, shared by every layer as T5 and
x-transformers share their relative bias, so its parameters train, move and save with the model. CoPE
(``contextual = cope(...)``) is the exception: every layer has its own embedding, as in the paper and
x-transformers, so ``pedsl_scheme`` is a ModuleList of one compiled module per attention layer. A
``layers`` scheme with learned values in any part keeps its parts' modules in a ModuleList
``pedsl_scheme`` too.

Every keyword HF passes to the attention function is applied or refused (:data:`APPLIED`,
:data:`NO_EFFECT`): a logit soft-cap, attention sinks, a position bias, packed sequences or dropout
are an :class:`~pedsl.errors.InteropError`, never dropped. Schemes that read the hidden state or the
tokens cannot run here: the attention interface receives q, k, v only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from pedsl.compiler import compile_scheme
from pedsl.compiler.kernel_support import hf_rotary_call
from pedsl.compiler.plan import RUNTIME_LENGTH
from pedsl.errors import InteropError, PedslError
from pedsl.hf import arch, layered, mla, registry, sincos
from pedsl.hf.attention_call import _ATTR, _Q_SCALE, _SSMAX, NAME, _refuse_kwarg, _register
from pedsl.hf.attention_state import F64, _PedslRotary, _State, hf_cos_sin
from pedsl.hf.convert import export_rope, import_config
from pedsl.hf.layered import part_window
from pedsl.lang.api import load
from pedsl.lang.scheme import Scheme

# ---------------------------------------------------------------------- installing it


def _sin_first(model) -> bool:
    """Whether the model's rotary embedding returns (sin, cos) (GPT-J, CodeGen: :mod:`pedsl.hf.sincos`)."""
    return sincos.is_sin_first(model.config.get_text_config().to_dict())


def _mark_q_scale(model, layers) -> None:
    """Layers whose model multiplies q by Llama 4's position scale before the attention function (registry
    ``q_scale``): the attention undoes it (the default scheme carries it as its temperature)."""
    cfg = model.config.get_text_config()
    fam = registry.family((arch.model_types(cfg.to_dict()) or [""])[-1])
    rp = getattr(cfg, "rope_parameters", None) or {}
    if fam is None or not fam.q_scale or rp.get("llama_4_scaling_beta") is None:
        return
    scale = (float(rp["llama_4_scaling_beta"]), rp.get("original_max_position_embeddings"))
    for layer in layers:
        object.__setattr__(layer, _Q_SCALE, scale)


def _mark_ssmax(model, layers, kinds: list[str]) -> None:
    """The NoPE layers whose model multiplies q by Beam's scalable-softmax scale before the attention function
    (registry ``ssmax``): the attention undoes it (the imported scheme carries it as those parts' temperature)."""
    fam = registry.family((arch.model_types(model.config.get_text_config().to_dict()) or [""])[-1])
    if fam is not None and fam.ssmax:
        for layer in layers:
            if kinds[layer.layer_idx] in (layered.NOPE, layered.NOPE_SLIDING):
                object.__setattr__(layer, _SSMAX, True)


def _dims(cfg) -> tuple[int, int]:
    cfg = cfg.get_text_config()  # a vision-language model's language model (the config itself otherwise)
    heads = cfg.num_attention_heads
    wide = mla.qk_head_dim(cfg.to_dict())  # MLA: the query/key head (its config's head_dim is the rotary's)
    return heads, wide or getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def scheme_for(model, scheme=None) -> Scheme:
    """The resolved scheme to use: the model's own rope (import-hf of its config) when None, else a
    path / text / Scheme loaded with the model's heads and head_dim."""
    heads, head_dim = _dims(model.config)
    if scheme is None:
        return load(import_config(model.config.to_dict()))
    if isinstance(scheme, (str, Path, Scheme)):
        return load(scheme, heads=heads, head_dim=head_dim)
    raise InteropError(f"scheme must be a path, .pe text or a pedsl Scheme, not {type(scheme).__name__}", code="E964")


def _refuse_model_features(model, layers) -> None:
    """Attention features of the model that pedsl's attention would not apply: refused up front (the sinks
    of a model whose scheme has none: a ``layers`` scheme's parts may take them, see _layer_state)."""
    if layers and any(isinstance(getattr(layer, "sinks", None), torch.Tensor) for layer in layers):
        _refuse_kwarg("sinks", "per-head sink logits of the model")


def _check_softcap(model, sch: Scheme) -> None:
    """A model that soft-caps its scores (Gemma 2's attn_logit_softcapping) needs a scheme that caps them
    alike in every layer (the default scheme, import-hf of its config, does); pedsl then applies the cap."""
    cap = getattr(model.config.get_text_config(), "attn_logit_softcapping", None)
    if cap is None:
        return
    parts = sch.layers.parts.items() if sch.layers is not None else [(sch.name, sch)]
    other = [(name, p.softcap) for name, p in parts if p.softcap is None or abs(p.softcap - cap) > 1e-12 * cap]
    if other:
        name, got = other[0]
        raise InteropError(f"the model soft-caps its attention scores at {cap:g} (attn_logit_softcapping) but the "
                           f"scheme's '{name}' " + ("has no softcap" if got is None else f"caps at {got:g}") +
                           ": pedsl's attention would silently differ from the model's", code="E964",
                           hint=f"add softcap = {cap:g} to the scheme (import-hf writes it), or use a model without "
                           "soft-capping")


def _rope_width(inner: nn.Module) -> int | None:
    """The last dimension of the cos table the model's rotary embedding returns (None: cannot tell)."""
    try:
        cos, _ = inner(torch.zeros(1, 1, 1), torch.zeros(1, 1, dtype=torch.long))
    except Exception:  # noqa: BLE001 - any rotary embedding with another signature takes the general path
        return None
    return int(cos.shape[-1]) if isinstance(cos, torch.Tensor) else None


def _model_rotates_like(layer, width: int, rot: int, D: int, scale: float) -> bool:
    """Whether the model's own ``apply_rotary_pos_emb`` with our (cos, sin) rotates exactly the first
    ``rot`` channels in pairs (p, p + rot/2), as the scheme does (probed on random vectors)."""
    apply = getattr(sys.modules.get(type(layer).__module__), "apply_rotary_pos_emb", None)
    if apply is None or width not in (rot, rot // 2):
        return False
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 3, D, generator=g, dtype=F64)
    phase = torch.rand(1, 3, rot // 2, generator=g, dtype=F64) * 6
    cos, sin = hf_cos_sin(phase, scale, width, F64)
    try:
        got, _ = apply(q, q, cos, sin)
    except Exception:  # noqa: BLE001 - an application of another shape or signature: not HF's rotary path
        return False
    c, s = torch.cos(phase)[:, None] * scale, torch.sin(phase)[:, None] * scale
    a, b = q[..., : rot // 2], q[..., rot // 2: rot]
    want = torch.cat([a * c - b * s, b * c + a * s, q[..., rot:]], -1)
    return got.shape == want.shape and bool(torch.allclose(got, want, atol=1e-12, rtol=0))


def _hf_family(sch: Scheme):
    """export_rope() of the scheme, or None when it is outside HF's rope family."""
    try:
        return export_rope(sch)
    except PedslError:
        return None


def _choose_path(sch: Scheme, mod, layers, rotaries) -> tuple[dict | None, int | None]:
    """(export_rope of the scheme, the model's cos width) for HF's rotary path, or (None, None): the path's
    declaration (``hf-rotary`` in :mod:`pedsl.compiler.kernel_support`) covers the plan's features and its
    call check admits the model."""
    hf = _hf_family(sch)
    widths = {_rope_width(getattr(parent, name)) for parent, name in rotaries}
    width = widths.pop() if len(widths) == 1 else None
    rotates = False
    if hf is not None and width is not None:
        t = mod.transforms[0]
        rotates = _model_rotates_like(layers[0], width, len(t.channels), sch.head_dim, t.scale)
    if hf_rotary_call(mod.plan.kernels, hf is not None, rotates):
        return hf, width
    if any(t.table == RUNTIME_LENGTH for t in mod.transforms):
        why = ("it is outside HF's rope family" if hf is None else
               "it has more than HF's rotary path computes" if "hf-rotary" not in mod.plan.kernels else
               f"{type(layers[0]).__name__}'s own rotary application does not compute its rotation")
        raise InteropError(f"scheme '{sch.name}' has a table that reads the run-time length and {why}: each cached key "
                           "would need the table of the call that cached it, which HF's cache does not hold",
                           code="E964", hint="use a static table (e.g. ntk() instead of dynamic_ntk()) or a scheme "
                           "in HF's rope family on a Llama-family model")
    return None, None


def _set_text_attention(model) -> bool:
    """Attend through pedsl in the language model only: a vision-language model's vision tower (bidirectional,
    its own 2-D rotary) keeps its attention. Whether the language model now dispatches to pedsl."""
    cfg = model.config
    subs = list(getattr(cfg, "sub_configs", None) or ())
    if "text_config" in subs and len(subs) > 1:
        model.set_attn_implementation({k: NAME if k == "text_config" else getattr(cfg, k)._attn_implementation
                                       for k in subs})
    else:
        model.set_attn_implementation(NAME)
    return cfg.get_text_config()._attn_implementation == NAME


def _refuse_general_multi_axis(model, sch: Scheme) -> None:
    """The general path reads each cached key's position from the attention call; transformers gives a
    multi-axis model's positions (Qwen-VL's (3, B, L)) to its rotary embedding only."""
    multi = [mt for mt in arch.model_types(model.config.to_dict()) if mt in arch.MROPE]
    if getattr(sch, "axes", ()) or multi:
        what = f"model_type '{multi[0]}' (3-axis positions)" if multi else f"{len(sch.axes)} position axes"
        raise InteropError(f"scheme '{sch.name}' is outside HF's rope family (or M-RoPE) and has {what}: pedsl's "
                           "general path needs every cached key's positions in the attention call, and transformers "
                           "passes multi-axis positions to the rotary embedding only", code="E964",
                           hint="on a Qwen-VL model use a scheme HF's rotary application computes: a rope or M-RoPE "
                           "rotation of every channel (e.g. the model's own, use_pedsl_attention(model))")


def _refuse_untaught(model) -> None:
    """A model type pedsl has not been taught, or one whose attention it cannot carry (MLA's rope slice, ALiBi
    in the model's own code, ...), is refused whatever the scheme: the adapter would replace a rotary it does
    not know how the model applies (pedsl.hf.registry, which import-hf reads too)."""
    cfg = model.config.to_dict()
    why = registry.unknown(cfg) or registry.taught_refusal(cfg)
    if why:
        raise InteropError(f"use_pedsl_attention on {type(model).__name__}: {why}", code="E964",
                           hint="docs/hf-compatibility.md lists the model types pedsl's attention runs on")


def use_pedsl_attention(model, scheme=None, *, backend: str = "auto"):
    """Make ``model`` attend with a compiled pedsl scheme (see the module docstring); returns the model.

    ``scheme``: a `.pe` path or text, or a loaded Scheme; by default the model's own rope parameters
    imported with :func:`pedsl.hf.import_config` (then the logits equal the native model's).
    ``backend`` is the compiled module's (the general path; HF's rotary path attends with SDPA)."""
    _refuse_untaught(model)
    sch = scheme_for(model, scheme)
    _check_softcap(model, sch)
    if sch.layers is not None:
        return _use_layers(model, sch, backend)
    _refuse_model_features(model, [m for m in model.modules() if _is_attention(m)])
    if sch.needs_x or sch.needs_tokens:
        raise InteropError(f"scheme '{sch.name}' reads the hidden state or the tokens, which transformers' "
                           "attention interface does not pass", code="E964",
                           hint="use a scheme of position-indexed rotations, biases and temperatures")
    heads, head_dim = _dims(model.config)
    if sch.heads != heads or sch.head_dim != head_dim:
        raise InteropError(f"scheme '{sch.name}' is for {sch.heads} heads of {sch.head_dim}; the model has {heads} "
                           f"of {head_dim}", code="E964", hint="drop heads/head_dim params from the scheme")
    layers, rotaries = _attention_layers(model)
    _check_one_scheme_windows(model, sch, layers)
    mod = compile_scheme(sch, num_heads=heads, head_dim=head_dim, backend=backend, requires_grad=False)
    hf, width = _choose_path(sch, mod, layers, rotaries)
    if hf is None:
        _refuse_general_multi_axis(model, sch)
    state = _State(mod, hf)
    if sch.contextual is not None or sch.relative is not None:  # CoPE's embedding, the relative tables: per layer
        mods = nn.ModuleList([mod] + [compile_scheme(sch, num_heads=heads, head_dim=head_dim, backend=backend,
                                                     requires_grad=False) for _ in layers[1:]])
        model.add_module(SCHEME_MODULE, mods)
        states = [state] + [_State(m, hf) for m in mods[1:]]
    else:
        if any(True for _ in mod.parameters()):  # learned values, tables, MLPs: trained, moved, saved with the model
            model.add_module(SCHEME_MODULE, mod)
        states = [state] * len(layers)
    for layer, st in zip(layers, states):
        object.__setattr__(layer, _ATTR, st)  # a plain attribute: not a submodule, not in the state_dict
    _mark_q_scale(model, layers)
    mla.mark_layers(model, layers)
    for parent, name in rotaries:
        setattr(parent, name, _PedslRotary(getattr(parent, name), state, width, _sin_first(model)))
    _register()
    if not _set_text_attention(model):  # pragma: no cover - a model without the attention interface
        raise InteropError(f"{type(model).__name__} does not dispatch through transformers' AttentionInterface",
                           code="E964")
    return model


SCHEME_MODULE = "pedsl_scheme"  # the model's submodule holding a scheme's learned parameters


# ---------------------------------------------------------------------- a layers scheme


def _is_attention(m) -> bool:
    """An attention layer: its q projection (Llama's q_proj, Phi-3's qkv_proj, GPT-NeoX's query_key_value,
    MiniCPM5-MoE's gated q_gate_proj; JetMoE's kv_proj, its q from experts; MLA's latent kv_a_proj_with_mqa) and
    the layer index transformers' cache reads."""
    return any(hasattr(m, n) for n in ("q_proj", "qkv_proj", "query_key_value", "q_gate_proj", "kv_proj",
                                       "kv_a_proj_with_mqa")) and \
        hasattr(m, "layer_idx")


def _attention_layers(model) -> tuple[list, list]:
    """(the attention layers, the (parent, name) of every rotary embedding), refused when absent or when the
    model attends through pedsl already."""
    layers = [m for m in model.modules() if _is_attention(m)]
    if not layers:
        raise InteropError(f"{type(model).__name__} has no attention layers with q_proj / qkv_proj / query_key_value", code="E964")
    if any(isinstance(m, _PedslRotary) for m in model.modules()):
        raise InteropError(f"{type(model).__name__} already attends through pedsl", code="E964",
                           hint="call use_pedsl_attention once, on a fresh copy of the model")
    rotaries = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
                if name == "rotary_emb" or (name == "pos_emb" and type(child).__name__.endswith("RotaryEmbedding"))]
    # Granite SWA: one rotary embedding per layer base, in a list
    rotaries += [(parent, name) for owner in model.modules() for parent in [getattr(owner, "rotary_embs", None)]
                 if isinstance(parent, nn.ModuleList) for name, _ in parent.named_children()]
    if not rotaries and not registry.is_nope_model(layered.text_config(model.config.to_dict())):
        raise InteropError(f"{type(model).__name__} has no rotary_emb module to replace", code="E964")
    # (a model type without rotary, NoPE in its registry record: nothing to neutralise, the general path applies
    # the scheme's own positions)
    return layers, rotaries


def _hf_mask_window(cfg, kinds: list[str], index: int) -> tuple[int | None, int | None]:
    """(sliding window, chunk) of the mask HF builds for this layer: the registry's description of the model
    (:func:`pedsl.hf.layered.layer_kinds`, which import-hf reads too), never a layer attribute (EXAONE 4's
    global layers keep ``sliding_window`` but are masked without it)."""
    kind = kinds[index]
    window = getattr(cfg, "sliding_window", None) if kind in (layered.SLIDING, layered.NOPE_SLIDING) else None
    chunk = getattr(cfg, "attention_chunk_size", None) if kind == layered.CHUNKED else None
    return window, chunk


BAND_MISMATCH = "the model masks with"  # the refusal of a scheme whose band is not HF's mask (tools/hf_sweep reads it)


def _check_mask_window(cfg, kinds: list[str], index: int, what: str, part: Scheme,
                       own_band: bool) -> tuple[int | None, int | None]:
    """The (window, chunk) of ``part``, refused unless the mask HF gives layer ``index`` is the part's: HF's
    mask applies whatever the scheme says, so a scheme without the model's window would still run windowed
    (and ``pedsl train`` of that scheme would not). ``own_band``: pedsl also applies the part's own band (one
    scheme on every layer), so a model masked without any window or chunk takes any scheme's."""
    hf_window, hf_chunk = _hf_mask_window(cfg, kinds, index)
    window, chunk, _ = part_window(part)
    if (hf_window, hf_chunk) != (window, chunk) and not (own_band and hf_window is None and hf_chunk is None):
        say = lambda w, c: f"window {w}" if w else f"chunk {c}" if c else "no window"  # noqa: E731
        raise InteropError(f"layer {index}: {BAND_MISMATCH} {say(hf_window, hf_chunk)} but the {what} has "
                           f"{say(window, chunk)}; HF's mask would apply its own band whatever the scheme says, so "
                           "the scheme and the model's mask must agree", code="E964",
                           hint="use the scheme import-hf writes for this config (pedsl.hf.import_config)")
    return window, chunk


def _check_one_scheme_windows(model, sch: Scheme, layers) -> None:
    """One scheme on every layer: each layer HF masks with a window or chunk needs the scheme's (``sliding_window``
    / ``attention_chunk_size`` as :func:`pedsl.hf.layered.layer_kinds` reads them, import-hf's description)."""
    cfg = model.config.get_text_config()
    if getattr(cfg, "sliding_window", None) is None and getattr(cfg, "attention_chunk_size", None) is None:
        return  # HF's mask has no band of its own
    d = layered.text_config(model.config.to_dict())
    kinds = layered.layer_kinds({**d, "num_hidden_layers": d.get("num_hidden_layers") or cfg.num_hidden_layers})
    for layer in layers:
        _check_mask_window(cfg, kinds, layer.layer_idx, f"scheme '{sch.name}'", sch, own_band=True)


def _layer_state(layer, cfg, kinds: list[str], index: int, name: str, part: Scheme, module) -> _State:
    """The general path of one layer: its part's module, checked against the mask HF gives the layer."""
    if part.needs_x or part.needs_tokens:
        raise InteropError(f"layer {index} ({name}) reads the hidden state or the tokens, which transformers' "
                           "attention interface does not pass", code="E964")
    window, chunk = _check_mask_window(cfg, kinds, index, f"scheme's part '{name}'", part, own_band=False)
    sinks = getattr(layer, "sinks", None)
    if isinstance(sinks, torch.Tensor) or part.sink is not None:
        if part.sink != "logit" or not isinstance(sinks, nn.Parameter):
            raise InteropError(f"layer {index}: the model has {'a sink logit per head' if sinks is not None else 'no sink'}"
                               f" but the scheme's part '{name}' has " + (f"sink = {part.sink}" if part.sink else "none"),
                               code="E964", hint="a part with sink = logit takes the model's sink logits")
        module.sink_logit = sinks  # the layer's own trained logits (the part's module is this layer's)
    state = _State(module, None)
    state.hf_band = window is not None or chunk is not None
    if getattr(layer, "attn_temperature_tuning", False) and not getattr(layer, "use_rope", True):
        state.hf_tuning = (float(layer.floor_scale), float(layer.attn_scale))  # undone: the part's applies
    return state


def _use_layers(model, sch: Scheme, backend: str):
    """A ``layers`` scheme: each attention layer runs its part on the general path (the rotary embeddings
    return the identity), with HF's mask, which must carry the part's window or chunk."""
    cfg = model.config.get_text_config()
    heads, head_dim = _dims(cfg)
    sch = load(sch, heads=heads, head_dim=head_dim, layers=cfg.num_hidden_layers)
    layer_map = sch.layers
    assert layer_map is not None  # a layers scheme loads as one
    kinds = layered.layer_kinds(layered.text_config(model.config.to_dict()))
    names = layer_map.assign(cfg.num_hidden_layers)
    layers, rotaries = _attention_layers(model)
    modules: dict[tuple, nn.Module] = {}
    for layer in layers:
        index = layer.layer_idx
        name = names[index]
        part = layer_map.parts[name]
        # a sink, CoPE's embedding and the relative tables are each layer's own parameters
        key = (name, index if part.sink is not None or part.contextual is not None or part.relative is not None
               else None)
        if key not in modules:
            modules[key] = compile_scheme(part, num_heads=heads, head_dim=head_dim, backend=backend,
                                          requires_grad=False)
        object.__setattr__(layer, _ATTR, _layer_state(layer, cfg, kinds, index, name, part, modules[key]))
    if any(True for m in modules.values() for _ in m.parameters()):  # learned parts train, move, save with the model
        model.add_module(SCHEME_MODULE, nn.ModuleList(list(modules.values())))
    _mark_q_scale(model, layers)
    _mark_ssmax(model, layers, kinds)
    identity = _State(next(iter(modules.values())), None)
    for parent, name in rotaries:
        setattr(parent, name, _PedslRotary(getattr(parent, name), identity, None, _sin_first(model)))
    _register()
    model.set_attn_implementation(NAME)
    return model


__all__ = ["use_pedsl_attention"]
