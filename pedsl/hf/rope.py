"""Hugging Face rope parameters <-> `.pe` schemes, without transformers.

:func:`import_config` reads a model's ``config.json`` (the ``rope_parameters`` of transformers 5,
or the older top-level ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor``) and writes a
scheme equal to that model's positional encoding: each HF knob becomes a ``param`` (0 stands for
HF's unset ``None``), the factor lists of LongRoPE become ``let`` lists, the attention factor of
YaRN and LongRoPE is ``rotate(..., scale = ...)`` (HF multiplies cos and sin, so only the rotated
channels are scaled). What pedsl cannot express exactly (``mrope_section``, per-layer-type rope
parameters, rope types outside the HF family below) is an :class:`~pedsl.errors.InteropError`
listing every such key, never an approximation.

:func:`export_rope` goes the other way on a resolved scheme: the ``rope_parameters`` of a scheme
in HF's family (one halves-layout ``rotate`` of the first channels, phase ``GRID * position``
[``/ factor``] with GRID one of ``geometric``, ``dynamic_ntk``, ``yarn``, ``longrope``,
``llama3``, the attention factor from ``yarn_mscale`` / ``longrope_mscale`` or a number, no
bias, no temperature), or an error naming the part with no HF equivalent.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pedsl import limits
from pedsl.errors import InteropError, PedslError, quoted
from pedsl.formulas import yarn_mscale_value
from pedsl.fsio import read_text
from pedsl.hf import arch, mla, registry, sincos
from pedsl.hf.rope_knobs import (_CONSTRAINTS, _KNOB_ORDER, _check_knobs, _check_value, _number, _q_scale,
                                 _scaling_knobs, fixed_longrope)
from pedsl.lang import ast, statements
from pedsl.lang.api import check, format as fmt
from pedsl.lang.parser import name_problem
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.fold import DYNAMIC, EvalIssue, StaticEnv, bind_args, fold_expr
from pedsl.lang.exprs import format_number, to_source
from pedsl.lang.scheme import Scheme
from pedsl.strictparse import StrictParseError, load_json

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# The keys each rope type reads (transformers 5 modeling_rope_utils); anything else is refused.
COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}
# Top-level config keys that change positions or the rotary application in ways import-hf does not read
# (multimodal sections, other rotary dimensions or pairings, per-layer NoPE or bases, biases): refused.
UNSUPPORTED_TOP = ("mrope_section", "use_mrope", "rope_interleaved", "rope_interleave", "mrope_interleaved",
                   "position_embedding_type", "rotary_emb_base", "rotary_pct", "rotary_dim", "qk_rope_head_dim",
                   "no_rope_layers", "nope_layer_interval", "rope_local_base_freq", "use_alibi", "alibi")
DEFAULT_THETA = 10000.0
MAX_CONFIG_BYTES = 10_000_000  # config.json files are a few kB


# ---------------------------------------------------------------------- reading a config


def default_theta(cfg: dict) -> float:
    """The base a config without rope_theta gets: its model type's default_theta (the registry's record)."""
    fam = registry.family((arch.model_types(cfg) or [""])[-1])
    return DEFAULT_THETA if fam is None else fam.theta


def read_config(path: str | Path) -> dict:
    """The dict of a config.json, or of the config.json inside a folder."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = read_text(p, limit=MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise InteropError(f"no such file: {p}", code="E963", file=str(p),
                           hint="give a model's config.json or the folder holding it") from None
    except OSError as exc:
        raise InteropError(f"cannot read {p}: {exc.strerror}", code="E963", file=str(p)) from None
    except ValueError:
        raise InteropError(f"{p} is not UTF-8 text", code="E963", file=str(p)) from None
    if len(text) > MAX_CONFIG_BYTES:
        raise InteropError(f"{p} is over {MAX_CONFIG_BYTES // 1_000_000} MB: not a model config", code="E963",
                           file=str(p))
    try:
        cfg = load_json(text)
    except StrictParseError as exc:  # malformed, a key given twice, [[[[...]]]] nested past the parser's stack
        raise InteropError(f"{p} is not a model config pedsl reads: {exc.message}", code="E963", file=str(p),
                           line=exc.line, hint="a Hugging Face config.json is one JSON object, each key once") from None
    if not isinstance(cfg, dict):
        raise InteropError(f"{p} holds a JSON {type(cfg).__name__}, not an object", code="E963", file=str(p))
    return cfg


def rope_spec(cfg: dict) -> dict:
    """The positional encoding of a config as a flat dict: head_dim, heads, rope_type, theta,
    partial_rotary_factor and the type's knobs, standardised as transformers 5 does, and ``fields``: the
    config field each value was read from. A value no scheme can use (a rope_theta <= 1, a factor <= 0,
    a head_dim of 2**62, ...) is an InteropError naming its field."""
    cfg = sincos.rotary_config(cfg)  # GPT-J / CodeGen: a partial rotary of rotary_dim channels, base 10000
    cfg = mla.rotary_config(cfg)  # an MLA model's rotary: the width of its last qk_rope_head_dim channels
    section = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    raw = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(raw, dict):
        raise InteropError(f"{section} must be an object, got {quoted(raw, 80)}", code="E963")
    rope_type = raw.get("rope_type", raw.get("type", "default"))
    alpha = _ntk_alpha(cfg, raw, rope_type, section)
    if alpha is not None:  # HunYuan's fixed-alpha NTK: a static table, default rope at a stretched base
        raw = {k: v for k, v in raw.items() if k not in ("alpha", "factor")}
        rope_type = raw["rope_type"] = "default"
    raw, fixed = fixed_longrope(cfg, raw, rope_type, section)  # PhiMoE's short_factor table, its one mscale
    _refuse_inexact(cfg, raw, rope_type)
    spec = _shape(cfg, raw, section)
    spec["rope_type"] = rope_type
    if alpha is not None:
        d = spec["head_dim"]
        spec["theta"] = spec["theta"] * alpha ** (d / (d - 2))
        spec["fields"]["theta"] = f"{section}.rope_theta * {section}.alpha ** (head_dim / (head_dim - 2))"
    _architecture_rotation(spec, cfg)
    if fixed:
        spec["note"] = "; ".join(n for n in (spec["note"], fixed) if n)
    _scaling_knobs(spec, cfg, raw, section)
    _q_scale(spec, cfg, raw, section)
    _check_knobs(spec)
    if mla.is_mla(cfg):  # the whole query/key head, its rotary on the last channels
        mla.widen(spec, cfg)
    return spec


def _ntk_alpha(cfg: dict, raw: dict, rope_type, section: str) -> float | None:
    """HunYuan's ``alpha`` (its rotary turns 'dynamic' with an alpha into a fixed base theta * alpha ** (d / (d - 2)),
    registry.NTK_ALPHA), or None."""
    if rope_type != "dynamic" or not raw.get("alpha") or not set(arch.model_types(cfg)) & registry.NTK_ALPHA:
        return None
    alpha = _number(raw, "alpha", where=section)
    if not 0 < alpha < math.inf:
        raise InteropError(f"{section}.alpha must be a positive number, got {quoted(alpha)}", code="E963")
    return float(alpha)


def _refuse_inexact(cfg: dict, raw: dict, rope_type) -> None:
    """Refuse (E961, listing every one) what pedsl cannot express exactly."""
    fam = registry.family((arch.model_types(cfg) or [""])[-1])
    switch = fam.rope_switch if fam is not None and not fam.refused else None  # 'rope': read, the rotary on
    read = mla.read_keys(cfg)  # an MLA type's rotary width and layout
    problems = [f"'{k}'" for k in UNSUPPORTED_TOP if cfg.get(k) not in (None, False)
                and not (k == switch and cfg[k] == "rope") and k not in read]
    nested = [k for k, v in raw.items() if isinstance(v, dict)]
    why = arch.refusal(cfg)
    if why:  # the architecture itself (M-RoPE, another rotary layout): its keys are not the reason
        problems = [why]
    elif nested:  # the keys are layer types: their own rope types are not read at this level
        problems.append(f"rope parameters per layer type ({', '.join(nested)}); pedsl imports one scheme for all "
                        "layers")
    elif rope_type not in ROPE_TYPES:
        problems.append(f"rope_type '{rope_type}' (pedsl imports {', '.join(ROPE_TYPES)})")
    else:
        # HF reads original_max_position_embeddings only for yarn/longrope/llama3: elsewhere it has no effect
        # (a q_scale family reads llama_4_scaling_beta; its rope dict's max_position_embeddings is read by nothing)
        q_keys = {"llama_4_scaling_beta", "max_position_embeddings"} if fam is not None and fam.q_scale else set()
        extra = sorted(set(raw) - COMMON - KEYS[rope_type] - {"original_max_position_embeddings"} - q_keys)
        problems += [f"'{k}' in rope_parameters (not read by rope_type '{rope_type}')" for k in extra
                     if raw[k] is not None]
    if problems:
        raise InteropError(
            "this model's positional encoding cannot be expressed exactly in pedsl: " + "; ".join(problems),
            code="E961", hint="pedsl imports the rope types of Llama-family models; nothing was written "
            "(an approximation would not be the model's encoding)")


def _shape(cfg: dict, raw: dict, section: str) -> dict:
    """heads, head_dim, theta, partial_rotary_factor and max_position_embeddings, each checked, with ``fields``."""
    heads = _number(cfg, "num_attention_heads", integer=True)
    hidden = _number(cfg, "hidden_size", integer=True)
    head_dim = _number(cfg, "head_dim", integer=True)
    if head_dim is None:
        if not heads or not hidden:
            raise InteropError("the config gives neither head_dim nor hidden_size and num_attention_heads",
                               code="E963", hint="a decoder config.json has num_attention_heads and hidden_size")
        head_dim = hidden // heads
    where = {k: (raw, section) if k in raw else (cfg, "config") for k in ("rope_theta", "partial_rotary_factor")}
    theta = _number(where["rope_theta"][0], "rope_theta", default_theta(cfg), where=where["rope_theta"][1])
    prf = _number(where["partial_rotary_factor"][0], "partial_rotary_factor", 1.0,
                  where=where["partial_rotary_factor"][1])
    fields = {"heads": "num_attention_heads", "max_position_embeddings": "max_position_embeddings",
              "head_dim": "head_dim" if cfg.get("head_dim") is not None else "hidden_size / num_attention_heads",
              **{k: f"{section}.{k}" for k in raw}}
    for key, name in (("theta", "rope_theta"), ("partial_rotary_factor", "partial_rotary_factor")):
        fields[key] = f"{section}.{name}" if name in raw else name
    spec: dict[str, Any] = dict(heads=1 if heads is None else heads, head_dim=head_dim, theta=float(theta),
                                partial_rotary_factor=1.0 if prf is None else float(prf),
                                max_position_embeddings=_number(cfg, "max_position_embeddings", integer=True),
                                fields=fields)
    _check_value(spec, "heads", 1 <= spec["heads"] <= limits.MAX_HEADS, f"1 to {limits.MAX_HEADS:,} heads")
    _check_value(spec, "head_dim", 1 <= head_dim <= limits.MAX_HEAD_DIM,
                 f"a head_dim of 1 to {limits.MAX_HEAD_DIM:,} channels")
    _check_value(spec, "theta", spec["theta"] > 1, "a rope_theta > 1 (the base of the frequencies)")
    prf = spec["partial_rotary_factor"]
    _check_value(spec, "partial_rotary_factor", 0 < prf <= 1, "a fraction in (0, 1]")
    max_pos = spec["max_position_embeddings"]
    _check_value(spec, "max_position_embeddings", max_pos is None or max_pos >= 2, "an integer >= 2")
    rot = int(head_dim * prf)
    if rot != head_dim * prf or rot % 2 or rot <= 0:
        raise InteropError(f"{fields['partial_rotary_factor']} {prf} of {fields['head_dim']} = {head_dim} is "
                           f"{head_dim * prf:g} channels; pedsl rotates an even whole number of channels", code="E961",
                           hint="HF truncates to int(head_dim * partial_rotary_factor); use a factor giving an even count")
    spec["rotated"] = rot
    return spec


def _architecture_rotation(spec: dict, cfg: dict) -> None:
    """The fraction of channels the named architecture really rotates (:mod:`pedsl.hf.arch`: Llama's
    default rope ignores partial_rotary_factor), and a ``note`` when it ignores the config's."""
    try:
        prf, spec["note"] = arch.partial_rotary(cfg, spec["rope_type"], spec["partial_rotary_factor"])
    except ValueError as exc:
        raise InteropError(str(exc), code="E961", hint="nothing was written") from None
    spec["partial_rotary_factor"] = prf
    spec["rotated"] = int(spec["head_dim"] * prf)


#: Ministral 3's query scale (HF's get_llama_4_attn_scale), a temperature at the query's position
Q_SCALE_TEMPERATURE = "1 + llama_4_scaling_beta * log(1 + floor(position / scaling_original))"


# ---------------------------------------------------------------------- writing a scheme


def _num(v) -> str:
    return format_number(v)


def scheme_name(cfg: dict, rope_type: str) -> str:
    """MODELTYPE_ROPETYPE as a .pe name: ASCII letters, digits and '_' ('llamé' -> 'llam_default'), short."""
    base = re.sub(r"[^0-9a-z]+", "_", str(cfg.get("model_type") or "model").lower()).strip("_") or "model"
    base = base if base[0].isalpha() else f"m_{base}"
    return f"{base[: limits.MAX_NAME - len(rope_type) - 1].rstrip('_')}_{rope_type}"


def _pe_text(value: Any) -> str:
    """A config string as plain text for a .pe comment or string: printable, no quote, backslash or newline."""
    return "".join(c if c.isprintable() and c not in '"\\' else "?" for c in str(value))[:100]


def _train_length_key(s: dict) -> str:
    """The spec value an imported scheme's train_length is: the original length of the scaled types."""
    return "original" if s["rope_type"] in ("llama3", "yarn", "longrope", "dynamic") else "max_position_embeddings"


def _param_lines(s: dict) -> list[str]:
    lines = [f"  param heads: int = {s['heads']}", f"  param head_dim: int = {s['head_dim']}"]
    values = {"base": s["theta"], "train_length": s.get(_train_length_key(s))}
    if "mla_rope" in s:  # MLA: the rotary's width, the last channels of the head
        values["rope_head_dim"] = s["mla_rope"]
    elif s["rotated"] != s["head_dim"]:
        values["partial_rotary_factor"] = s["partial_rotary_factor"]
    values.update({k: s[k] for k in _KNOB_ORDER if k in s})
    for k, v in values.items():
        if v is not None:
            kind = "bool" if isinstance(v, bool) else "int" if k in ("original", "train_length", "scaling_original",
                                                                        "rope_head_dim") else "float"
            lines.append(f"  param {k}: {kind} {_CONSTRAINTS.get(k, '')} = {_num(v)}")
    return lines


def import_config(config: dict | str | Path, name: str | None = None) -> str:
    """The `.pe` text (canonical form) of a config's positional encoding; the text is checked before it is
    returned (InteropError naming the config field otherwise), so what import-hf writes always loads."""
    cfg = config if isinstance(config, dict) else read_config(config)
    if name is not None and name_problem(name):
        raise InteropError(f"scheme name {quoted(name, 80)}: {name_problem(name)}", code="E963")
    s = rope_spec(cfg)
    t = s["rope_type"]
    name = name or scheme_name(cfg, t)
    model_type = _pe_text(cfg.get("model_type", "?"))  # config text is data: never a line or a quote of .pe
    lines = [f"# Imported by pedsl import-hf from a Hugging Face config (model_type {model_type}, "
             f"rope_type {t}).",
             ("# Read as transformers computes this model type (pedsl/hf/registry.py); the type's logits were compared "
              "with the native model by tools/hf_sweep (docs/hf-compatibility.md)." if cfg.get("model_type") else
              "# Read as transformers' rope utilities read a config without model_type (no model compared)."),
             *([f"# {s['note']}."] if s["note"] else []),
             f'scheme {name} "{t} rotary embedding of a Hugging Face {_pe_text(cfg.get("model_type", "model"))} '
             f'config" {{', *_param_lines(s)]
    if t == "longrope":
        lines.append("  let short_factor = [" + ", ".join(_num(x) for x in s["short_factor"]) + "]")
        lines.append("  let long_factor = [" + ", ".join(_num(x) for x in s["long_factor"]) + "]")
    fam = registry.family((arch.model_types(cfg) or [""])[-1])
    lines.append(f"  layout {mla.layout(cfg, fam)}")
    on = ""
    if "mla_rope" in s:
        lines += mla.channel_lines()
        on = " on rot"
    elif s["rotated"] != s["head_dim"]:
        lines += ["  channels {", "    rot = fraction(partial_rotary_factor)", "    plain = rest", "  }"]
        on = " on rot"
    grid, phase_tail, scale = {
        "default": ("geometric(base)", "", None),
        "linear": ("geometric(base)", " / factor", None),
        "dynamic": ("dynamic_ntk(base, factor, original)", "", None),
        "llama3": ("llama3(base, factor, original, low_freq_factor, high_freq_factor)", "", None),
        "yarn": ("yarn(base, factor, original, beta_fast, beta_slow, truncate)", "",
                 "yarn_mscale(factor, mscale, mscale_all_dim, attention_factor)"),
        "longrope": ("longrope(base, short_factor, long_factor, original)", "",
                     "longrope_mscale(factor, original, attention_factor)"),
    }[t]
    lines.append(f"  let w = {grid}")
    if scale:
        lines.append(f"  let m = {scale}")
    phase = f"w * position{phase_tail}"
    if fam is not None and fam.reversed:  # its rotate_half is cat(x2, -x1): the rotation by minus the phase
        phase = f"-({phase})"
    lines.append(f"  qk{on}: rotate({phase}" + (", scale = m)" if scale else ")"))
    train_length = s.get(_train_length_key(s))
    if train_length is not None and train_length <= limits.MAX_LENGTH:  # longer: pedsl trains no such context
        lines += ["  train {", "    context = train_length", "  }"]
    # MLA's YaRN softmax scale (yarn_apply_mscale) times the attention's q scale at the query's position (registry
    # q_scale): one temperature
    lines += mla.temperature_lines(s, Q_SCALE_TEMPERATURE if "llama_4_scaling_beta" in s else None)
    lines += ["  allow frayed_frequencies", "}"]
    text = fmt("\n".join(lines) + "\n")
    _check_written(text, s)
    return text


def _check_written(text: str, s: dict) -> None:
    """Refuse a scheme that `pedsl check` would reject, naming the config fields of the line at fault (a safety
    net behind rope_spec's own checks: every value is checked there, by what the grids need)."""

    try:
        errors = [d for d in check(text) if d.severity == "error"]
    except PedslError as err:
        errors = [d for d in err.diagnostics if d.severity == "error"]
    if not errors:
        return
    d = errors[0]
    lines = text.split("\n")
    lets = {m.group(1): m.group(2) for m in re.finditer(r"^\s*let (\w+) = (.*)$", text, re.M)}
    todo = re.findall(r"[A-Za-z_]\w*", lines[d.line - 1] if d.line and d.line <= len(lines) else "")
    used: list[str] = []
    while todo:  # the names on the line at fault, and those of the lets it uses
        word = todo.pop(0)
        if word not in used:
            used.append(word)
            todo += re.findall(r"[A-Za-z_]\w*", lets.get(word, ""))
    spec_key = {"base": "theta", "train_length": _train_length_key(s)}
    fields = list(dict.fromkeys(s["fields"][k] for k in (spec_key.get(w, w) for w in used) if k in s["fields"]))
    raise InteropError(f"the scheme written from this config would not check ({d.code} {d.message}); it comes from "
                       f"{', '.join(fields) or 'the config'}; nothing was written", code="E963",
                       hint="check those fields; if they are right, the message names a pedsl limit "
                       "(pedsl/limits.py)")


# ---------------------------------------------------------------------- exporting a scheme


def _refuse(scheme: Scheme, what: str, hint: str | None = None) -> InteropError:
    return InteropError(f"scheme '{scheme.name}' has no Hugging Face rope_parameters equivalent: {what}",
                        code="E962", file=scheme.file,
                        hint=hint or "HF's family: geometric, dynamic_ntk, yarn, longrope or llama3 frequencies times "
                        "position (optionally / factor), halves layout, on the first channels, no bias or temperature")


def _static(scheme: Scheme, e, pairs: int):
    env = StaticEnv(values={**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}, pairs=pairs)
    try:
        v = fold_expr(e, env)
    except EvalIssue as issue:
        raise _refuse(scheme, f"{to_source(e)} cannot be evaluated ({issue})") from None
    if v is DYNAMIC:
        raise _refuse(scheme, f"{to_source(e)} is not a compile-time value")
    return v


def _call_args(call: ast.Call) -> dict:
    return bind_args(call, FUNCTIONS[call.func].params)


# The statements rope_parameters carry (the rotation and the shape of the head) or that leave the scores as they
# are (parameters, lets, train/eval settings, lint allowances; the layer map is pedsl.hf.layered's). Every other
# statement a scheme has is refused, so a statement added to the registry is never dropped by export.
ROTATION_KINDS = frozenset({"param", "let", "layout", "axes", "channels", "transport", "section", "allow", "layers"})


def _without(field: str):
    """A field's value on a scheme without the statement: its declared default, or a carried value's (a statement
    carried in ``Scheme.settings`` has no field of its own)."""
    declared = Scheme.model_fields.get(field)
    if declared is not None:
        return declared.get_default(call_default_factory=True)
    return next(c.default for c in statements.CARRIED if c.name == field)


def _has(scheme: Scheme, record: statements.Statement) -> bool:
    """Whether the scheme's value of the statement differs from the value of a scheme without it."""
    return any(getattr(scheme, f) != _without(f) for f in record.fields)


def _refuse_shape(scheme: Scheme) -> None:
    """A statement beyond the rotation (a window, chunk, sink, soft cap, any statement the registry adds) has no
    place in rope_parameters (the model's config fields hold the ones HF has)."""
    shape = [f"{r.keywords[0]} = {getattr(scheme, r.fields[0])}" for r in statements.RECORDS
             if r.kind not in ROTATION_KINDS and _has(scheme, r)]
    if shape:
        raise _refuse(scheme, f"{', '.join(shape)}; rope_parameters hold the rotation only (the attention's "
                      "shape lives in the model's own config fields)")


def _one_rotation(scheme: Scheme):
    """The one position-indexed rotation of q and k that HF's rope family can carry; :class:`InteropError`
    naming what the scheme has beyond it (a bias, a window, a temperature, other transports ...)."""
    if scheme.biases:
        raise _refuse(scheme, f"a logit bias ({scheme.biases[0].kind}); HF rope has none")
    if scheme.temperature is not None:
        raise _refuse(scheme, f"temperature = {to_source(scheme.temperature)} scales every channel's logit; HF's "
                      "attention factor scales the rotated channels only", "write rotate(..., scale = m) instead "
                      "(logits of the rotated channels times m^2)")
    if scheme.normalize != "softmax":
        raise _refuse(scheme, f"normalize = {scheme.normalize}; HF's attention is a softmax")
    if scheme.contextual is not None:
        raise _refuse(scheme, f"contextual = {scheme.contextual.source()}: CoPE's learned embedding and gated "
                      "counts have no rope_parameters", "load the model with use_pedsl_attention, which carries "
                      "CoPE inside the attention")
    if scheme.remap is not None:
        raise _refuse(scheme, f"{scheme.remap.source()}: positions remapped per distance regime; HF's rotary "
                      "turns each token at its own position", "load the model with use_pedsl_attention, which "
                      "computes the regimes inside the attention")
    _refuse_shape(scheme)
    if len(scheme.transports) != 1:
        raise _refuse(scheme, "no rotary transport (NoPE)" if not scheme.transports else
                      f"{len(scheme.transports)} transports; HF rotates one channel group")
    t = scheme.transports[0]
    if t.kind != "rotate":
        raise _refuse(scheme, f"a {t.kind} transport; HF applies a position-indexed rotation")
    if t.targets != "qk":
        raise _refuse(scheme, "value rotation (qkv); HF rotates q and k only")
    if t.xpos_gamma is not None:
        raise _refuse(scheme, "xPos's per-pair decay of q and k; HF's rotary has no per-position scale")
    return t


def export_rope(scheme: Scheme, *, allow_interleaved: bool = False) -> dict:
    """``{"head_dim", "num_attention_heads", "max_position_embeddings"?, "rope_parameters"}`` of a scheme
    in HF's rope family; :class:`InteropError` naming the part that has no HF equivalent otherwise.
    ``allow_interleaved``: accept the interleaved layout (the caller permutes q/k weights to halves)."""
    t = _one_rotation(scheme)
    if scheme.layout != "halves" and not allow_interleaved:
        raise _refuse(scheme, "the interleaved layout; HF's rotate_half pairs channel k with k + rot/2",
                      "use layout halves (pedsl export --hf permutes trained weights for you)")
    chans = scheme.group(t.group).channels
    rot = len(chans)
    if tuple(chans) != tuple(range(rot)):
        raise _refuse(scheme, f"rotated channels {list(chans)[:4]}...; HF rotates the first "
                      "int(head_dim * partial_rotary_factor) channels")
    pairs = rot // 2
    # phase = GRID * position [/ factor]
    ph = t.phase
    linear = None
    if ph.kind == "binary" and ph.op == "/":
        linear = float(_static(scheme, ph.right, pairs))
        ph = ph.left
    grid = None
    if ph.kind == "binary" and ph.op == "*":
        for a, b in ((ph.left, ph.right), (ph.right, ph.left)):
            if b.kind == "name" and b.id == "position" and a.kind == "call":
                grid = a
    if grid is None:
        raise _refuse(scheme, f"phase {to_source(t.phase)} is not FREQUENCIES * position [/ factor]")
    args = {k: (_static(scheme, v, pairs) if isinstance(v, ast.Node) else v) for k, v in _call_args(grid).items()}
    f = grid.func
    rp: dict[str, Any] = {}
    out: dict[str, Any] = {"head_dim": scheme.head_dim, "num_attention_heads": scheme.heads}
    if linear is not None and f != "geometric":
        raise _refuse(scheme, f"{f}() frequencies divided by a factor; HF's 'linear' divides the plain RoPE grid")
    if f == "geometric":
        rp = {"rope_type": "linear", "factor": linear} if linear is not None and linear != 1 else {"rope_type": "default"}
    elif f == "dynamic_ntk":
        rp = {"rope_type": "dynamic", "factor": float(args["factor"])}
        out["max_position_embeddings"] = int(args["original"])  # HF's dynamic grows past max_position_embeddings
    elif f == "llama3":
        rp = {"rope_type": "llama3", "factor": float(args["factor"]), "original_max_position_embeddings":
              int(args["original"]), "low_freq_factor": float(args["low_freq_factor"]),
              "high_freq_factor": float(args["high_freq_factor"])}
    elif f == "yarn":
        rp = {"rope_type": "yarn", "factor": float(args["factor"]), "original_max_position_embeddings":
              int(args["original"])}
        if args["beta_fast"] != 32:
            rp["beta_fast"] = float(args["beta_fast"])
        if args["beta_slow"] != 1:
            rp["beta_slow"] = float(args["beta_slow"])
        if args["truncate"] is not True:
            rp["truncate"] = bool(args["truncate"])
    elif f == "longrope":
        rp = {"rope_type": "longrope", "original_max_position_embeddings": int(args["original"]),
              "short_factor": [float(x) for x in args["short_factor"]],
              "long_factor": [float(x) for x in args["long_factor"]]}
    else:
        hint = {"ntk": "HF has no static NTK-aware type ('dynamic' recomputes the base from the length)",
                "yarn_wavelength": "HF's yarn ramps over the pair index: use yarn(...)"}.get(f)
        raise _refuse(scheme, f"{f}() frequencies" + (f" ({hint})" if hint else ""))
    rp["rope_theta"] = float(args["base"])
    if rot != scheme.head_dim:
        rp["partial_rotary_factor"] = rot / scheme.head_dim
    _export_scale(scheme, t, rp)
    out["rope_parameters"] = rp
    return out


def _export_scale(scheme: Scheme, t, rp: dict) -> None:
    """HF's attention factor of yarn/longrope from rotate(..., scale = ...); other types have none."""
    kind = rp["rope_type"]
    e = t.scale_expr
    if kind not in ("yarn", "longrope"):
        if t.scale != 1:
            raise _refuse(scheme, f"a scale on the rotated channels ({t.scale:g}) with rope_type '{kind}', which has "
                          "no attention factor in HF")
        return
    if e is not None and e.kind == "call" and e.func == ("yarn_mscale" if kind == "yarn" else "longrope_mscale"):
        a = {k: (_static(scheme, v, 1) if isinstance(v, ast.Node) else v) for k, v in _call_args(e).items()}
        if kind == "yarn" and float(a["factor"]) != rp["factor"]:
            raise _refuse(scheme, f"yarn_mscale() reads factor {a['factor']} but the frequencies use {rp['factor']}")
        if kind == "longrope":
            rp["factor"] = float(a["factor"])
            if int(a["original"]) != rp["original_max_position_embeddings"]:
                raise _refuse(scheme, "longrope_mscale() and longrope() read different original lengths")
        for k in (("attention_factor", "mscale", "mscale_all_dim") if kind == "yarn" else ("attention_factor",)):
            if a[k]:
                rp[k] = float(a[k])
        return
    # any other scale: HF's explicit attention_factor (a number)
    if kind == "longrope" or t.scale != yarn_mscale_value(rp["factor"]):
        rp["attention_factor"] = t.scale
