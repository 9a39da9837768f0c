"""Hugging Face configs whose layers differ, as a pedsl ``layers`` scheme, and back; no transformers needed.

Read from transformers 5's configs and model files:

- **Gemma 2 / Gemma 3 text**: ``layer_types`` (``sliding_attention`` / ``full_attention``; absent in old
  files: Gemma 2 alternates from a sliding layer 0, Gemma 3 has a full layer every
  ``sliding_window_pattern`` = 6), ``sliding_window`` (key j visible to query i iff i - j < N:
  ``window = N``), one rope for both (Gemma 2) or ``rope_parameters`` per layer type (Gemma 3; in
  legacy files ``rope_theta`` + ``rope_scaling`` for the full layers and ``rope_local_base_freq`` for
  the sliding ones), ``attn_logit_softcapping`` (every part's ``softcap = c``: the scores pass
  through ``c * tanh(s / c)``). ``query_pre_attn_scalar`` is not positional: the model passes it to
  its attention function (``scaling``) and the scheme does not carry it (the written header names it).
- **Llama 4 text**: ``no_rope_layers`` (1: a RoPE layer, 0: a NoPE layer), rotary pairs (2k, 2k + 1)
  (``layout interleaved``), ``attention_chunk_size`` on the RoPE layers (``chunk = N``) and, on the
  NoPE layers, ``attn_temperature_tuning``: q is scaled by
  ``log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1`` (a ``temperature``).
- **Qwen2**: ``use_sliding_window`` with the layers from ``max_window_layers`` on sliding
  (``layer_types`` when present).
- **GPT-OSS**: ``layer_types`` alternating a ``sliding_window`` (128) with full layers, a learned
  per-head sink logit in every layer (``sink = logit``) and YaRN (a part's rope, as import-hf writes it).

The mixture-of-experts blocks, norms and MLPs of these models are not positional: not read.
Each part's rope is written by :func:`pedsl.hf.rope.import_config` on the config restricted to that
layer kind; :func:`export_layers` writes the config fields back from a resolved ``layers`` scheme.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from pedsl import limits
from pedsl.errors import InteropError, PedslError, quoted
from pedsl.hf import arch, mla, registry
from pedsl.hf.registry import (CHUNKED, FULL, NOPE, NOPE_SLIDING, SLIDING, _int, is_layered, layer_kinds,  # noqa: F401
                                text_config)
from pedsl.hf.rope import _pe_text, export_rope, import_config, read_config
from pedsl.lang.api import check
from pedsl.lang.exprs import format_number
from pedsl.lang.parser import name_problem
from pedsl.lang.statements import BY_KIND

# the temperature of Llama 4's NoPE layers (HF: log1p(floor((positions + 1) / floor_scale)) * attn_scale + 1)
LLAMA4_TEMPERATURE = "log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1"
# the query scale of Beam's NoPE layers (HF's compute_attention_scaling: exp(0.1 * log1p((position + 1) / 2048)))
SSMAX_TEMPERATURE = "exp(0.1 * log(1 + (position + 1) / 2048))"
# config keys import_config must not see in a part's config: the layered module reads them
_LAYER_KEYS = ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers", "no_rope_layers",
               "attention_chunk_size", "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern",
               "no_rope_layer_interval", "layer_rope_theta")


def _per_type_rope(cfg: dict, kind: str, mt: str, fam: registry.Family) -> dict:
    """``rope_parameters`` of one layer type of Gemma 3 / OLMo 3, as their config classes fill them in."""
    key = SLIDING if kind == SLIDING else FULL
    rp = cfg.get("rope_parameters")
    if not rp and mt in registry.PER_TYPE_DEFAULT_ROPE:  # the whole dicts its config class fills in, keys unread
        return dict(registry.PER_TYPE_DEFAULT_ROPE[mt][key])
    if fam.nope == "local" and isinstance(rp, dict) and rp.get(FULL) is not None:
        raise InteropError(f"rope_parameters.{FULL} of model_type '{mt}' is {quoted(rp[FULL], 60)}: its full layers "
                           "would rotate, and pedsl reads this type's full layers as NoPE (the value its config "
                           "class writes, null)", code="E961", hint="nothing was written")
    local = registry.GEMMA3_LOCAL_THETA if mt.startswith("gemma3") else fam.theta
    own = registry.PER_TYPE_THETA.get(mt, {FULL: fam.theta, SLIDING: fam.theta})
    theta = {FULL: ("rope_theta", own[FULL]),
             SLIDING: ("rope_local_base_freq", local) if mt.startswith("gemma3") else ("rope_theta", own[SLIDING])}[key]
    if isinstance(rp, dict) and rp and not set(rp) & {FULL, SLIDING}:
        raise InteropError(f"rope_parameters of model_type '{mt}' must hold one object per layer type "
                           f"({FULL}, {SLIDING}), got the keys {quoted(sorted(rp), 80)}", code="E963")
    if isinstance(rp, dict) and rp:
        one = rp.get(key, {"rope_type": "default"})
        if not isinstance(one, dict):
            raise InteropError(f"rope_parameters.{key} must be an object (the rope of the {key} layers), got "
                               f"{quoted(one, 60)}", code="E963")
        return {"rope_theta": _theta_value(cfg, *theta), **one}
    legacy = {"rope_type": "default"}
    if key == FULL and isinstance(cfg.get("rope_scaling"), dict):
        legacy.update(cfg["rope_scaling"])
    return {**legacy, "rope_theta": _theta_value(cfg, *theta)}


def _theta_value(cfg: dict, key: str, default: float):
    v = cfg.get(key)
    return default if v is None else v


def _rope_for(cfg: dict, kind: str, mt: str) -> dict:
    """The config a part's rope is imported from: the layer kind's rope parameters, no layer keys."""
    sub = {k: v for k, v in cfg.items() if k not in _LAYER_KEYS}
    sub[arch.PART] = True
    fam = registry.family(mt) or registry.Family()
    if fam.per_type_rope:
        sub.pop("rope_scaling", None)
        sub.pop("rope_theta", None)
        sub["rope_parameters"] = _per_type_rope(cfg, kind, mt, fam)
    if fam.layer_theta:  # the kind's base from layer_rope_theta, the rest of the one rope_parameters
        rp = cfg.get("rope_parameters")
        sub.pop("rope_theta", None)
        sub["rope_parameters"] = {**(rp if isinstance(rp, dict) else {"rope_type": "default"}),
                                  "rope_theta": registry.kind_theta(cfg, kind)}
    return sub


def _part_text(cfg: dict, kind: str, mt: str, name: str) -> str:
    """One part: the layer kind's rope (or a NoPE layer) with its window, chunk and sink."""
    extra = []
    if kind in (SLIDING, NOPE_SLIDING):
        extra.append(f"window = {_int(cfg, 'sliding_window')}")
    if kind == CHUNKED:
        extra.append(f"chunk = {_int(cfg, 'attention_chunk_size')}")
    if (registry.family(mt) or registry.Family()).sinks:
        extra.append("sink = logit")
    cap = cfg.get("attn_logit_softcapping")
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf:
            raise InteropError(f"config key 'attn_logit_softcapping' must be a positive number or null, got "
                               f"{quoted(cap, 60)}", code="E963")
        extra.append(f"softcap = {format_number(float(cap))}")
    if kind in (NOPE, NOPE_SLIDING):
        return _nope_text(cfg, name, extra, mt)
    text = import_config(_rope_for(cfg, kind, mt), name=name)  # its layout: the registry's record
    lines = text.rstrip("\n").split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(("  train {", "  allow", "}")))
    return "\n".join(lines[:at] + [f"  {e}" for e in extra] + lines[at:]) + "\n"


def _heads(cfg: dict) -> tuple[int, int]:
    """(heads, head_dim) of a NoPE layer, each read from its field (InteropError naming a missing one)."""
    heads = _int(cfg, "num_attention_heads")
    head_dim = mla.qk_head_dim(cfg) or _int(cfg, "head_dim")  # MLA: the whole query/key head
    if heads is None or (head_dim is None and _int(cfg, "hidden_size") is None):
        missing = "num_attention_heads" if heads is None else "head_dim (or hidden_size)"
        raise InteropError(f"the config gives no {missing}: a NoPE layer's scheme needs the heads and their width",
                           code="E963", hint="a decoder config.json has num_attention_heads and hidden_size or "
                           "head_dim")
    if head_dim is None:
        head_dim = _int(cfg, "hidden_size") // heads
    if not 1 <= head_dim <= limits.MAX_HEAD_DIM or heads > limits.MAX_HEADS:
        raise InteropError(f"the config's {heads} heads of {head_dim} channels are outside pedsl's limits "
                           f"({limits.MAX_HEADS} heads, {limits.MAX_HEAD_DIM} channels)", code="E963")
    return heads, head_dim


def _nope_text(cfg: dict, name: str, extra: list[str], mt: str) -> str:
    heads, head_dim = _heads(cfg)
    llama4 = mt.startswith("llama4")
    lines = [f'scheme {name} "NoPE layer of a Hugging Face {_pe_text(mt)} config" {{',
             f"  param heads: int = {heads}", f"  param head_dim: int = {head_dim}"]
    tuning = llama4 and cfg.get("attn_temperature_tuning", True)
    if tuning:
        floor_scale = cfg.get("floor_scale", 8192)
        attn_scale = cfg.get("attn_scale", 0.1)
        for key, v in (("floor_scale", floor_scale), ("attn_scale", attn_scale)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise InteropError(f"config key '{key}' must be a positive number, got {quoted(v, 60)}", code="E963")
        lines += [f"  param floor_scale: float (> 0) = {format_number(float(floor_scale))}",
                  f"  param attn_scale: float (> 0) = {format_number(float(attn_scale))}",
                  f"  temperature = {LLAMA4_TEMPERATURE}"]
    if (registry.family(mt) or registry.Family()).ssmax:
        lines.append(f"  temperature = {SSMAX_TEMPERATURE}")
        tuning = True
    lines += [f"  {e}" for e in extra]
    if tuning:
        lines.append("  allow temperature_without_length")
    return "\n".join(lines + ["}"]) + "\n"


def import_nope(config: dict, name: str | None = None) -> str:
    """The checked `.pe` text of a model type whose attention layers have no rotary (registry.is_nope_model):
    one NoPE scheme for every attention layer (its other layers, Mamba or linear attention, are not pedsl's)."""
    cfg = text_config(config)
    mt = (arch.model_types(cfg) or ["model"])[-1]
    if name is not None and name_problem(name):
        raise InteropError(f"scheme name {quoted(name, 80)}: {name_problem(name)}", code="E963")
    fam = registry.family(mt) or registry.Family()
    why = (f"{fam.rope_switch} = {_pe_text(cfg.get(fam.rope_switch))}, not 'rope'" if fam.rope_switch else
           "the model type's attention layers apply no rotary")
    text = (f"# Imported by pedsl import-hf from a Hugging Face {_pe_text(mt)} config: NoPE in every attention layer "
            f"({why}).\n# Its Mamba / linear-attention layers carry position themselves and are not pedsl's.\n"
            + _nope_text(cfg, name or f"{_base_name(mt)}_nope", [], mt))
    errors = [d for d in check(text) if d.severity == "error"]
    if errors:  # pragma: no cover - a NoPE scheme of checked heads always loads
        raise InteropError(f"the NoPE scheme written from this config does not load ({errors[0].message})", code="E961")
    return text


def layer_rules(kinds: list[str], names: dict[str, str]) -> list[str]:
    """The ``layers`` rules of a kind per layer: a pattern when a cycle repeats at least twice, ``first(n)``
    for a prefix of another kind (Qwen2), else ``default`` with ``at([...])`` for the other kinds."""
    n = len(kinds)
    period = next(p for p in range(1, n + 1) if all(kinds[i] == kinds[i % p] for i in range(n)))
    if period == 1:
        return [f"default = {names[kinds[0]]}"]
    if 2 * period <= n:  # a cycle that repeats (cut at the last layer as the models cut theirs)
        runs: list[list] = []
        for k in kinds[:period]:
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return ["pattern = [" + ", ".join(names[k] + (f" * {c}" if c > 1 else "") for k, c in runs) + "]"]
    head = next(i for i in range(n) if kinds[i] != kinds[0])
    if len(set(kinds[head:])) == 1:
        return [f"default = {names[kinds[-1]]}", f"first({head}) = {names[kinds[0]]}"]
    common = Counter(kinds).most_common(1)[0][0]
    rules = [f"default = {names[common]}"]
    for kind in dict.fromkeys(kinds):
        if kind != common:
            rules.append(f"at([{', '.join(str(i) for i, k in enumerate(kinds) if k == kind)}]) = {names[kind]}")
    return rules


def layered_text(config: dict, name: str | None = None) -> str:
    """The `.pe` text (parts, then the ``layers`` scheme) of a layered config, not yet checked."""
    cfg = text_config(config)
    mt = (arch.model_types(cfg) or ["model"])[-1]
    base = name or _base_name(mt)
    kinds = layer_kinds(cfg)
    _refuse_heads_per_layer(cfg)
    short = {FULL: "full", SLIDING: "sliding", CHUNKED: "chunked", NOPE: "nope", NOPE_SLIDING: "nope_sliding"}
    names = {k: f"{base}_{short[k]}" for k in dict.fromkeys(kinds)}
    notes = [f"# Imported by pedsl import-hf from a Hugging Face {_pe_text(mt)} config: {len(kinds)} layers."]
    for key in ("query_pre_attn_scalar", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            notes.append(f"# {key} = {_pe_text(cfg[key])}: not positional (the model applies it; not in the scheme).")
    parts = [_part_text(cfg, k, mt, names[k]) for k in names]
    rules = layer_rules(kinds, names)
    main = [f'scheme {base} "the layers of a Hugging Face {_pe_text(mt)} config" {{', "  layers {",
            *(f"    {r}" for r in rules), "  }", "}"]
    # written in the canonical form (the parts come formatted from import_config): `pedsl fmt` keeps it
    return "\n".join(notes) + "\n\n" + "\n".join(parts) + "\n" + "\n".join(main) + "\n"


def _refuse_heads_per_layer(cfg: dict) -> None:
    """Laguna's ``num_attention_heads_per_layer``: layers with other head counts than num_attention_heads, which
    one scheme compiled for the config's heads cannot run."""
    per = cfg.get("num_attention_heads_per_layer")
    if per is not None and (not isinstance(per, list) or any(h != cfg.get("num_attention_heads") for h in per)):
        raise InteropError(f"num_attention_heads_per_layer {quoted(per, 80)} gives layers other head counts than "
                           f"num_attention_heads {quoted(cfg.get('num_attention_heads'))}: pedsl imports one scheme "
                           "for the config's heads", code="E961", hint="nothing was written")


def _base_name(mt: str) -> str:
    base = re.sub(r"[^0-9a-z]+", "_", mt.lower()).strip("_") or "model"
    return (base if base[0].isalpha() else f"m_{base}")[: limits.MAX_NAME - 10]


def import_layered(config: dict | str | Path, name: str | None = None) -> str:
    """:func:`layered_text`, checked: InteropError (E961) when pedsl cannot load what it wrote."""
    cfg = config if isinstance(config, dict) else read_config(config)
    if name is not None and name_problem(name):
        raise InteropError(f"scheme name {quoted(name, 80)}: {name_problem(name)}", code="E963")
    text = layered_text(cfg, name)
    try:
        errors = [d for d in check(text) if d.severity == "error"]
    except PedslError as err:
        errors = [d for d in err.diagnostics if d.severity == "error"]
    if errors:
        d = errors[0]
        raise InteropError(f"the layers scheme written from this config does not load in this pedsl ({d.code} line "
                           f"{d.line}: {d.message}); nothing was written", code="E961",
                           hint="a window, chunk or sink statement needs a pedsl with them (`window = N`, "
                           "`chunk = N`, `sink = logit`)")
    return text


# ---------------------------------------------------------------------- writing the config back


# The statements a model's config holds in its own fields (sliding_window, attention_chunk_size, the family's
# sinks, attn_logit_softcapping), not in rope_parameters: export_layers writes them, then exports the rotation
# without them; any other statement is the rotation's to carry or refuse (pedsl.hf.rope.export_rope).
CONFIG_STATEMENTS = ("window", "chunk", "sink", "softcap")


def part_window(part) -> tuple[int | None, int | None, Any]:
    """(window, chunk, sink) of a resolved part; None where it has none."""
    return part.window, part.chunk, part.sink


def _rotation(part):
    """The part without the statements the config holds itself (:data:`CONFIG_STATEMENTS`, their fields read
    off the statement registry)."""
    fields = [f for kind in CONFIG_STATEMENTS for f in BY_KIND[kind].fields]
    return part.model_copy(update={f: type(part).model_fields[f].default for f in fields})


def _softcap(scheme, parts: list[str]) -> dict:
    """``attn_logit_softcapping`` of the layers' parts: one cap for every layer (HF has one), or none."""
    caps = {name: scheme.layers.parts[name].softcap for name in dict.fromkeys(parts)}
    if len(set(caps.values())) > 1:
        shown = ", ".join(f"{n}: {c if c is not None else 'none'}" for n, c in caps.items())
        raise InteropError(f"scheme '{scheme.name}' soft-caps its layers differently ({shown}); HF has one "
                           "attn_logit_softcapping for every layer", code="E962")
    cap = next(iter(caps.values()))
    return {} if cap is None else {"attn_logit_softcapping": cap}


def _nope_tuning(part) -> dict | None:
    """Llama 4's attn_temperature_tuning fields of a NoPE part whose temperature is the one import writes;
    {} for no temperature; None for another temperature."""
    from pedsl.lang.exprs import to_source

    if part.temperature is None:
        return {"attn_temperature_tuning": False}
    if to_source(part.temperature) != LLAMA4_TEMPERATURE or not {"floor_scale", "attn_scale"} <= set(part.params):
        return None
    return {"attn_temperature_tuning": True, "floor_scale": part.params["floor_scale"],
            "attn_scale": part.params["attn_scale"]}


def export_layers(scheme, n_layers: int) -> dict:
    """The config fields of a resolved ``layers`` scheme for a model of ``n_layers`` layers: ``layer_types``,
    ``sliding_window``, ``rope_parameters`` (one, or per layer type as Gemma 3's), ``no_rope_layers``,
    Llama 4's temperature fields and ``attn_logit_softcapping``; InteropError (E962) naming the layer whose part has no such field."""
    parts = scheme.layers.assign(n_layers)
    kinds: list[str] = []
    ropes: dict[str, dict] = {}  # a layer kind's rope_parameters
    tuning: dict[int, dict] = {}
    windows: set[tuple[str, int | None]] = set()
    for i, name in enumerate(parts):
        part = scheme.layers.parts[name]
        window, chunk, sink = part_window(part)
        if not part.transports:
            t = _nope_tuning(part)
            if t is None:
                raise InteropError(f"layer {i} ({name}): a NoPE layer whose temperature is not Llama 4's "
                                   f"({LLAMA4_TEMPERATURE})", code="E962")
            tuning[i] = t
            kinds.append(NOPE)
            continue
        kind = SLIDING if window is not None else CHUNKED if chunk is not None else FULL
        windows.add((kind, window or chunk))
        # the rotation alone: the window, chunk and sink are the config's own fields (written below)
        rope = export_rope(_rotation(part), allow_interleaved=True)["rope_parameters"]
        if ropes.setdefault(kind, rope) != rope:
            raise InteropError(f"layer {i} ({name}) has another rope than the earlier {kind} layers; HF gives one rope "
                               "per layer type", code="E962")
        kinds.append(kind)
    return {**_fields(scheme, kinds, ropes, tuning, windows), **_softcap(scheme, parts)}


def _fields(scheme, kinds, ropes, tuning, windows) -> dict:
    out: dict[str, Any] = {"num_hidden_layers": len(kinds)}
    for kind, key in ((SLIDING, "sliding_window"), (CHUNKED, "attention_chunk_size")):
        sizes = {n for k, n in windows if k == kind}
        if len(sizes) > 1:
            raise InteropError(f"scheme '{scheme.name}' gives its {kind} layers different sizes "
                               f"({', '.join(map(str, sorted(sizes)))}); HF has one {key}", code="E962")
        if sizes:
            out[key] = sizes.pop()
    if NOPE in kinds:
        if len({tuple(sorted(t.items())) for t in tuning.values()}) > 1:
            raise InteropError(f"scheme '{scheme.name}' has NoPE layers with different temperatures; Llama 4 has one "
                               "attn_temperature_tuning", code="E962")
        out.update(next(iter(tuning.values())))
        out["no_rope_layers"] = [0 if k == NOPE else 1 for k in kinds]
    out["layer_types"] = [FULL if k == NOPE else k for k in kinds]
    if ropes:
        unique = {str(sorted(r.items())) for r in ropes.values()}
        out["rope_parameters"] = next(iter(ropes.values())) if len(unique) == 1 else dict(ropes)
    return out
