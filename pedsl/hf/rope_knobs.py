"""The knobs of Hugging Face's scaled rope types (linear, dynamic, yarn, longrope, llama3, and a family's query
scale): how :mod:`pedsl.hf.rope` reads a config's, as transformers 5 reads them (0 or absent: HF's default), what
pedsl's grids need of each value (refused on import, naming the config field it came from), and the ``-P``
constraints an imported scheme declares for them, so that an override the grids cannot take is refused where it
is given. :mod:`pedsl.hf.multimodal` reads the knobs of each axis with the same functions.
"""

from __future__ import annotations

import math

from pedsl.errors import InteropError, quoted
from pedsl.hf import arch, registry


def _number(cfg: dict, key: str, default=None, *, integer: bool = False, where: str = "config"):
    v = cfg.get(key)
    if v is None:  # absent or null: HF's default
        return default
    if isinstance(v, (int, float)) and not isinstance(v, bool) and (abs(v) > 2**63 or v != v):  # 1e400, NaN, 10**400
        raise InteropError(f"{where} key '{key}' must be a finite number below 2**63, got {str(v)[:40]}",
                           code="E963")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
        raise InteropError(f"{where} key '{key}' must be {'an integer' if integer else 'a number'}, got {quoted(v)}",
                           code="E963")
    return int(v) if integer else v


def _original(spec: dict, cfg: dict, raw: dict, section: str) -> int:
    """The original length of llama3 / yarn / longrope: transformers 5 takes a top-level
    original_max_position_embeddings (Phi-3), else the rope dict's, else max_position_embeddings."""
    key = "original_max_position_embeddings"
    if cfg.get(key) is not None:
        spec["fields"]["original"] = key
        return _number(cfg, key, integer=True)
    if raw.get(key) is not None:
        spec["fields"]["original"] = f"{section}.{key}"
        return _number(raw, key, integer=True, where=section)
    if spec["max_position_embeddings"] is None:
        raise InteropError(f"rope_type '{spec['rope_type']}' needs original_max_position_embeddings (or "
                           "max_position_embeddings)", code="E963")
    spec["fields"]["original"] = "max_position_embeddings"
    return spec["max_position_embeddings"]


def _scaling_knobs(spec: dict, cfg: dict, raw: dict, section: str) -> None:
    """The knobs of the scaled rope types, read as transformers 5 reads them (0 or absent: HF's default)."""
    rope_type, max_pos = spec["rope_type"], spec["max_position_embeddings"]
    p = lambda k, d=None, **kw: _number(raw, k, d, where=section, **kw)  # noqa: E731
    if rope_type in ("llama3", "yarn", "longrope"):
        spec["original"] = _original(spec, cfg, raw, section)
        _check_value(spec, "original", spec["original"] >= 2, _KNOBS["original"][1])
    if rope_type in ("linear", "dynamic", "llama3"):
        if p("factor") is None:
            raise InteropError(f"rope_type '{rope_type}' needs a factor ({section}.factor)", code="E963")
        spec["factor"] = float(p("factor"))
    if rope_type == "dynamic":
        if max_pos is None:
            raise InteropError("rope_type 'dynamic' needs max_position_embeddings (its original length)", code="E963")
        spec["original"] = max_pos
        spec["fields"]["original"] = "max_position_embeddings"
    if rope_type == "llama3":
        for k in ("low_freq_factor", "high_freq_factor"):
            if p(k) is None:
                raise InteropError(f"rope_type 'llama3' needs {k} ({section}.{k})", code="E963")
            spec[k] = float(p(k))
    if rope_type in ("yarn", "longrope"):
        factor = p("factor")
        if factor is None:  # HF: max_position_embeddings / original
            if max_pos is None:
                raise InteropError(f"rope_type '{rope_type}' without a factor needs max_position_embeddings",
                                   code="E963")
            factor = max_pos / spec["original"]
            spec["fields"]["factor"] = f"max_position_embeddings / {spec['fields']['original']} (no {section}.factor)"
        spec["factor"] = float(factor)
        spec["attention_factor"] = float(p("attention_factor") or 0.0)
    if rope_type == "yarn":
        spec["beta_fast"] = float(p("beta_fast") or 32.0)  # HF: `or 32`, `or 1`
        spec["beta_slow"] = float(p("beta_slow") or 1.0)
        spec["mscale"] = float(p("mscale") or 0.0)
        spec["mscale_all_dim"] = float(p("mscale_all_dim") or 0.0)
        truncate = raw.get("truncate", True)
        if not isinstance(truncate, bool):
            raise InteropError(f"{section}.truncate must be true or false, got {quoted(truncate, 80)}", code="E963")
        spec["truncate"] = truncate
    if rope_type == "longrope":
        for k in ("short_factor", "long_factor"):
            lst = raw.get(k)
            if not isinstance(lst, list) or len(lst) != spec["rotated"] // 2 or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf for x in lst):
                f = spec["fields"]
                raise InteropError(f"{section}.{k}: rope_type 'longrope' needs a list of {spec['rotated'] // 2} "
                                   f"positive finite numbers, one per rotated pair ({f['head_dim']} = "
                                   f"{spec['head_dim']}, {f['partial_rotary_factor']} = "
                                   f"{spec['partial_rotary_factor']:g}), got {quoted(lst, 80)}", code="E963")
            spec[k] = [float(x) for x in lst]


def fixed_longrope(cfg: dict, raw: dict, rope_type, section: str) -> tuple[dict, str | None]:
    """PhiMoE's rotary (registry ``fixed_longrope``) as the LongRoPE parameters pedsl imports, and a note: it calls
    the longrope init without the length (short_factor at every length) and multiplies cos and sin by
    ``short_mscale`` or ``long_mscale``, picked by whether the call's max(position_ids) + 1 exceeds the original
    length. Equal, that is one attention factor; unequal, the keys cached under one meet queries under the other
    (no function of positions): refused naming both."""
    mt = (arch.model_types(cfg) or [""])[-1]
    fam = registry.family(mt)
    if fam is None or not fam.fixed_longrope or rope_type == "default":
        return raw, None
    if rope_type != "longrope":
        raise InteropError(f"model_type '{mt}' with rope_type '{rope_type}' calls that type's init without the length "
                           f"(a fixed table) and scales cos and sin by {section}.short_mscale or long_mscale: pedsl "
                           "imports its 'default' and 'longrope' rope types", code="E961", hint="nothing was written")
    short, long = (_number(raw, k, where=section) for k in ("short_mscale", "long_mscale"))
    if short is None or short != long:
        raise InteropError(f"model_type '{mt}' scales cos and sin by {section}.short_mscale ({quoted(short)}) or "
                           f"long_mscale ({quoted(long)}), picked by whether the call's max(position_ids) + 1 exceeds "
                           "original_max_position_embeddings: with a cache, keys scaled by one meet queries scaled "
                           "by the other, which no function of the positions gives; pedsl imports it when the two are "
                           "equal", code="E961", hint="nothing was written")
    if not 0 < short < math.inf:
        raise InteropError(f"{section}.short_mscale must be a positive number, got {quoted(short)}", code="E963")
    out = {k: v for k, v in raw.items() if k not in ("short_mscale", "long_mscale")}
    out.update(long_factor=raw.get("short_factor"), attention_factor=float(short))
    return out, (f"{mt} rotates with short_factor at every length (its rotary calls the longrope init without the "
                 f"length) and scales cos and sin by short_mscale = long_mscale = {short:g}: written as longrope() "
                 "with long_factor = short_factor and that attention factor")


def _q_scale(spec: dict, cfg: dict, raw: dict, section: str) -> None:
    """``llama_4_scaling_beta`` and the original length HF divides the positions by (the rope dict's own
    ``original_max_position_embeddings``), for a family whose attention scales q so (registry ``q_scale``)."""
    fam = registry.family((arch.model_types(cfg) or [""])[-1])
    if fam is None or not fam.q_scale or raw.get("llama_4_scaling_beta") is None:
        return
    beta = _number(raw, "llama_4_scaling_beta", where=section)
    original = _number(raw, "original_max_position_embeddings", where=section, integer=True)
    if original is None:
        raise InteropError(f"{section}.llama_4_scaling_beta needs {section}.original_max_position_embeddings (HF "
                           "divides the positions by it)", code="E963")
    spec["llama_4_scaling_beta"], spec["scaling_original"] = float(beta), original
    spec["fields"].update(llama_4_scaling_beta=f"{section}.llama_4_scaling_beta",
                          scaling_original=f"{section}.original_max_position_embeddings")
    _check_value(spec, "llama_4_scaling_beta", 0 <= beta < math.inf, "a finite llama_4_scaling_beta >= 0")
    _check_value(spec, "scaling_original", original >= 1, "an original_max_position_embeddings >= 1")


def _check_value(spec: dict, key: str, ok: bool, need: str) -> None:
    """Refuse a value of the spec that the written scheme could not use, naming the config field it came from."""
    if not ok:
        field = spec["fields"].get(key, key)
        raise InteropError(f"{field} = {quoted(spec[key], 80)}: pedsl needs {need}; nothing was written", code="E963",
                           hint=f"correct {field.split(' ')[0]} in the config")


#: The knobs of the scaled rope types and what pedsl's grids need of them (HF's unset 0s are allowed where HF
#: reads 0 as "use the default").
_KNOBS = {
    "factor": (lambda v, s: v > 0, "a factor > 0"),
    "original": (lambda v, s: v >= 2, "an integer >= 2 (a training length)"),
    "low_freq_factor": (lambda v, s: v > 0, "a low_freq_factor > 0"),
    "high_freq_factor": (lambda v, s: v >= s["low_freq_factor"], "a high_freq_factor at or above "
                         "low_freq_factor ({low_freq_factor:g})"),
    "beta_fast": (lambda v, s: v > 0, "beta_fast > 0"),
    "beta_slow": (lambda v, s: v > 0, "beta_slow > 0"),
    "mscale": (lambda v, s: v >= 0, "mscale >= 0"),
    "mscale_all_dim": (lambda v, s: v >= 0, "mscale_all_dim >= 0"),
    "attention_factor": (lambda v, s: v >= 0, "an attention_factor >= 0"),
}


def _check_knobs(spec: dict) -> None:
    for key, (ok, need) in _KNOBS.items():
        if key in spec:
            _check_value(spec, key, ok(spec[key], spec), need.format(**spec))


#: The constraints of the parameters an imported scheme declares: what the grids need (as in the library's
#: schemes), so that a -P override the grids cannot take is refused where it is given.
_CONSTRAINTS = {"base": "(> 1)", "train_length": "(>= 2)", "partial_rotary_factor": "(> 0, <= 1)",
                "factor": "(> 0)", "original": "(>= 2)", "low_freq_factor": "(> 0)",
                "high_freq_factor": "(>= low_freq_factor)", "beta_fast": "(> 0)", "beta_slow": "(> 0)",
                "mscale": "(>= 0)", "mscale_all_dim": "(>= 0)", "attention_factor": "(>= 0)",
                "llama_4_scaling_beta": "(>= 0)", "scaling_original": "(>= 1)",
                "rope_head_dim": "(>= 2, <= head_dim)"}
_KNOB_ORDER = ("factor", "original", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "truncate",
               "mscale", "mscale_all_dim", "attention_factor", "llama_4_scaling_beta", "scaling_original")
