"""Hugging Face M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) <-> multi-axis `.pe` schemes, without transformers.

The language models of these vision-language families read three positions per token - time, height,
width: transformers' 3-axis ``position_ids`` of shape (3, B, L) - and rotate pair k of each head by
``inv_freq[k] * position[axis(k)]``, with Llama's halves layout on every channel:

- Qwen2-VL and Qwen2.5-VL (``mrope_section`` [s_t, s_h, s_w]): the first s_t pairs read t, the next s_h
  read h, the last s_w read w (``Qwen2VLRotaryEmbedding.recomposition_frequencies``);
- Qwen3-VL (``mrope_interleaved``): pair k reads h when k % 3 == 1 and k < 3 s_h, w when k % 3 == 2 and
  k < 3 s_w, t otherwise (``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``, always interleaved).

:func:`mrope_spec` reads such a config as transformers 5 does - a flat legacy file (the text fields at
the top, ``rope_scaling: {type: mrope, mrope_section}``), a nested ``text_config`` with
``rope_parameters`` or ``rope_scaling``, or a text model's own config - with HF's defaults for what is
absent, and refuses (naming the field) everything the scheme would not carry: another rope type, a
rope key the rotary does not read, a sliding window, sections that do not cover the pairs, fields that
contradict each other. :func:`mrope_text` writes the scheme in the multi-axis syntax (``axes t, h, w``,
``sections(position, [...])`` / ``interleave(position, [...])``) over the same frequency tables as one-axis
rope (default, linear, llama3, yarn: :mod:`pedsl.hf.rope`); :func:`export_mrope` reads a resolved scheme of
that form back into rope_parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from pedsl import limits
from pedsl.errors import InteropError, PedslError, quoted
from pedsl.hf import arch, rope
from pedsl.hf.rope import (_check_written, _param_lines, _pe_text, _refuse, _shape, _static, _train_length_key,
                           scheme_name)
from pedsl.hf.rope_knobs import _check_knobs, _scaling_knobs
from pedsl.lang import ast
from pedsl.lang.api import format as fmt
from pedsl.lang.scheme import RotateTransport, Scheme


@dataclass(frozen=True)
class Family:
    """What transformers' text model of a vision-language family does with its rotary fields."""

    assignment: str  # "sections" (contiguous) or "interleave" (round-robin): which axis each pair reads
    theta: float  # the text config's default_theta
    sections: tuple[int, int, int]  # the rotary embedding's default mrope_section
    flat: bool  # a composite config without text_config gives its text fields at the top level


FAMILIES = {
    "qwen2_vl": Family("sections", 1000000.0, (16, 24, 24), True),
    "qwen2_5_vl": Family("sections", 1000000.0, (16, 24, 24), True),
    "qwen3_vl": Family("interleave", 500000.0, (24, 20, 20), False),
    "qwen3_vl_moe": Family("interleave", 500000.0, (24, 20, 20), False),  # Qwen3-VL's rotary, MoE blocks
}
assert set(FAMILIES) | {f"{f}_text" for f in FAMILIES} == arch.MROPE_IMPORTED
# The keys of the rope dict these rotary embeddings read besides the rope type's own (rope.KEYS); any other
# key with a value is refused.
ROPE_KEYS = ("rope_type", "type", "rope_theta", "mrope_section", "mrope_interleaved")
# The rope types whose table M-RoPE can take: those of a fixed table (dynamic NTK and LongRoPE read the run-time
# length, which HF takes from the 3-axis positions' maximum: not imported). Their frequencies and attention
# factor, as import-hf writes them for one axis (pedsl.hf.rope).
GRIDS = {
    "default": ("geometric(base)", "", None),
    "linear": ("geometric(base)", " / factor", None),
    "llama3": ("llama3(base, factor, original, low_freq_factor, high_freq_factor)", "", None),
    "yarn": ("yarn(base, factor, original, beta_fast, beta_slow, truncate)", "",
             "yarn_mscale(factor, mscale, mscale_all_dim, attention_factor)"),
}
# Text fields a composite config may repeat at its top level (transformers then reads text_config's).
TEXT_FIELDS = ("rope_scaling", "rope_parameters", "rope_theta", "hidden_size", "num_attention_heads", "head_dim",
               "max_position_embeddings", "partial_rotary_factor", "use_sliding_window", "layer_types")


def family_of(cfg: dict) -> tuple[str, bool] | None:
    """(the family, whether cfg is the composite config) of a config :mod:`pedsl.hf.multimodal` imports."""
    mt = cfg.get("model_type")
    if not isinstance(mt, str):
        return None
    if mt in FAMILIES:
        return mt, True
    if mt.endswith("_text") and mt[: -len("_text")] in FAMILIES:
        return mt[: -len("_text")], False
    return None


def _refuse_config(what: str) -> InteropError:
    return InteropError(f"this model's positional encoding cannot be imported exactly: {what}", code="E961",
                        hint="nothing was written (an approximation would not be the model's encoding)")


def _bad(what: str) -> InteropError:
    return InteropError(what, code="E963", hint="correct the config; nothing was written")


# ---------------------------------------------------------------------- reading a config


def _text_part(cfg: dict, family: str, composite: bool) -> tuple[dict, str]:
    """(the dict holding the text model's fields, the prefix naming its fields in messages)."""
    if not composite:
        return cfg, ""
    text = cfg.get("text_config")
    if text is None:
        if not FAMILIES[family].flat:
            raise _bad(f"a {family} config needs text_config: transformers builds its language model from "
                       "text_config alone (top-level text fields are not read)")
        return cfg, ""
    if not isinstance(text, dict):
        raise _bad(f"text_config must be an object, got {quoted(text, 80)}")
    if text.get("model_type") not in (None, family, f"{family}_text"):
        raise _refuse_config(f"text_config.model_type {quoted(text['model_type'], 80)} is not the text model of "
                             f"{family} ({family}_text)")
    for k in TEXT_FIELDS:  # transformers reads text_config's; a different top-level value would be dropped
        if cfg.get(k) is not None and cfg[k] != text.get(k):
            raise _refuse_config(f"'{k}' = {quoted(cfg[k], 60)} at the top level but "
                                 f"text_config.{k} = {quoted(text.get(k), 60)}; transformers reads only text_config")
    return text, "text_config."


def _rope_dict(text: dict, prefix: str) -> tuple[dict, str]:
    """(the rope dict, its field name): rope_scaling wins over rope_parameters, as in transformers."""
    scaling, params = text.get("rope_scaling"), text.get("rope_parameters")
    for value, key in ((scaling, "rope_scaling"), (params, "rope_parameters")):
        if value is not None and not isinstance(value, dict):
            raise _bad(f"{prefix}{key} must be an object, got {quoted(value, 80)}")
    if scaling and params and scaling != params:
        raise _refuse_config(f"{prefix}rope_scaling and {prefix}rope_parameters differ; transformers reads "
                             "rope_scaling and drops rope_parameters")
    key = "rope_scaling" if scaling else "rope_parameters"
    return dict(scaling or params or {}), prefix + key


def _refuse_unread(text: dict, raw: dict, section: str, prefix: str, kind: str) -> None:
    """Refuse every rope key, partial rotation or window that the rotary embedding would not carry."""
    known = {*ROPE_KEYS, *rope.KEYS[kind], "original_max_position_embeddings"}  # HF reads the last for some types
    problems = [f"{section}.{k}" for k, v in raw.items() if k not in known and v is not None]
    if problems:
        problems = [f"{', '.join(problems)}: not read by M-RoPE with rope_type '{kind}' (pedsl imports "
                    f"{', '.join(sorted(known))})"]
    prf = text.get("partial_rotary_factor")
    if prf is not None and prf != 1:
        problems.append(f"{prefix}partial_rotary_factor = {quoted(prf, 40)}: transformers' M-RoPE rotates every "
                        "channel whatever it says")
    if text.get("use_sliding_window"):
        problems.append(f"{prefix}use_sliding_window = true: sliding-window layers are not part of the "
                        "imported scheme")
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and any(k != "full_attention" for k in kinds):
        problems.append(f"{prefix}layer_types {quoted(kinds, 80)}: layers other than full_attention")
    if problems:
        raise _refuse_config("; ".join(dict.fromkeys(problems)))


def _rope_type(raw: dict, section: str) -> str:
    """The rope type of the table M-RoPE splits over the axes: one of :data:`GRIDS` (the legacy type 'mrope' is
    'default', as transformers reads it)."""
    rt, legacy = raw.get("rope_type"), raw.get("type")
    kind = rt if rt is not None else legacy if legacy is not None else "default"
    kind = "default" if kind == "mrope" else kind
    if not isinstance(kind, str) or kind not in GRIDS:
        raise _refuse_config(f"{section}.{'rope_type' if rt is not None else 'type'} = {quoted(kind, 40)}; pedsl "
                             f"imports M-RoPE over a fixed table ({', '.join(GRIDS)}; or the legacy type 'mrope')")
    if rt is not None and legacy not in (None, "mrope", "default", rt):
        raise _refuse_config(f"{section}.type = {quoted(legacy, 40)} contradicts {section}.rope_type = "
                             f"{quoted(rt, 40)}")
    return kind


def assignment(kind: str, sections: list[int], pairs: int) -> list[int]:
    """The axis (0 t, 1 h, 2 w) each of ``pairs`` rotary pairs reads, as transformers assigns them."""
    if kind == "sections":
        return [axis for axis, n in enumerate(sections) for _ in range(n)]
    out = [0] * pairs
    for axis in (1, 2):
        for k in range(axis, min(3 * sections[axis], pairs), 3):
            out[k] = axis
    return out


def _sections(raw: dict, section: str, spec: dict, family: str) -> list[int]:
    """mrope_section checked: three positive integers whose pairs are the head's, given to each axis as stated."""
    fam = FAMILIES[family]
    got = raw.get("mrope_section")
    field = f"{section}.mrope_section"
    if got is None:
        got, field = list(fam.sections), f"mrope_section (transformers' {family} default {list(fam.sections)})"
    spec["fields"]["sections"] = field
    if not (isinstance(got, list) and len(got) == 3 and all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= limits.MAX_HEAD_DIM for x in got)):
        raise _bad(f"{field} must be a list of three positive integers (rotary pairs for t, h, w), got "
                   f"{quoted(got, 80)}")
    pairs = spec["head_dim"] // 2
    if sum(got) != pairs:
        raise _bad(f"{field} {got} sums to {sum(got)} pairs, but {spec['fields']['head_dim']} = {spec['head_dim']} "
                   f"has {pairs} rotary pairs: the sections must sum to head_dim / 2")
    counts = [assignment(fam.assignment, got, pairs).count(a) for a in range(3)]
    if counts != got:
        raise _bad(f"{field} {got}: transformers' interleaved assignment gives the axes {counts} of the {pairs} "
                   "pairs (h takes pairs 1, 4, ... below 3 s_h, w pairs 2, 5, ... below 3 s_w), not the sizes stated")
    return got


def _interleaved(raw: dict, section: str, family: str) -> None:
    flag = raw.get("mrope_interleaved")
    if flag is not None and not isinstance(flag, bool):
        raise _bad(f"{section}.mrope_interleaved must be true or false, got {quoted(flag, 40)}")
    interleaved = FAMILIES[family].assignment == "interleave"
    if flag is not None and flag != interleaved:
        raise _refuse_config(f"{section}.mrope_interleaved = {str(flag).lower()}: transformers' {family} "
                             f"{'always interleaves' if interleaved else 'reads contiguous sections'} and ignores it")


def mrope_spec(cfg: dict) -> dict:
    """The M-RoPE of a Qwen-VL config as a flat dict: family, assignment, heads, head_dim, theta, sections,
    max_position_embeddings and ``fields`` (the config field of each value); InteropError naming the field
    of anything it cannot carry."""
    found = family_of(cfg)
    if found is None:
        raise _bad(f"model_type {quoted(cfg.get('model_type'), 60)} is not one of {', '.join(FAMILIES)}")
    family, composite = found
    text, prefix = _text_part(cfg, family, composite)
    raw, section = _rope_dict(text, prefix)
    kind = _rope_type(raw, section)
    _refuse_unread(text, raw, section, prefix, kind)
    if text.get("num_attention_heads") is None:
        raise _bad(f"{prefix}num_attention_heads is missing: the scheme needs the model's heads")
    _interleaved(raw, section, family)
    shaped = dict(text, rope_theta=raw.get("rope_theta", text.get("rope_theta", FAMILIES[family].theta)))
    if family.startswith("qwen3_vl") and shaped.get("head_dim") is None:
        shaped["head_dim"] = 128  # Qwen3VLTextConfig's default: the attention and the table read config.head_dim
    spec = _shape(shaped, raw, section)
    spec["rope_type"] = kind
    _scaling_knobs(spec, text, raw, section)
    spec["fields"] = {k: v if v.startswith(prefix) or prefix == "" else prefix + v for k, v in spec["fields"].items()}
    _check_knobs(spec)
    if "rope_theta" not in raw and text.get("rope_theta") is None:
        spec["fields"]["theta"] = f"rope_theta (transformers' {family} default)"
    heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
    if not family.startswith("qwen3_vl") and text.get("head_dim") is not None and heads and hidden and \
            text["head_dim"] != hidden // heads:
        raise _refuse_config(f"{prefix}head_dim = {text['head_dim']} but {prefix}hidden_size / num_attention_heads "
                             f"= {hidden // heads}: transformers' {family} attention and rotary table disagree")
    spec.update(family=family, assignment=FAMILIES[family].assignment, model_type=str(cfg.get("model_type")),
                note=None)
    spec["sections"] = _sections(raw, section, spec, family)
    return spec


# ---------------------------------------------------------------------- writing and reading back a scheme


def _call(spec: dict) -> str:
    return f"{spec['assignment']}(position, [{', '.join(str(s) for s in spec['sections'])}])"


def mrope_text(spec: dict, name: str | None = None) -> str:
    """The `.pe` text of an :func:`mrope_spec` (before formatting)."""
    kind = "interleaved " if spec["assignment"] == "interleave" else ""
    t = spec["rope_type"]
    suffix = ("mrope_interleaved" if kind else "mrope") + ("" if t == "default" else f"_{t}")
    name = name or scheme_name({"model_type": spec["model_type"]}, suffix)
    model_type = _pe_text(spec["model_type"])
    over = "" if t == "default" else f" over rope_type {t}"
    lines = [f"# Imported by pedsl import-hf from a Hugging Face config (model_type {model_type}, {kind}M-RoPE{over}, "
             f"mrope_section {list(spec['sections'])}).",
             "# Equal to the language model's positional encoding at HF's 3-axis position_ids (t, h, w): pedsl "
             "export-hf prints its rope_parameters back.",
             "# The vision tower's own rotary embedding and how positions are given to image tokens are not "
             "part of it.",
             f'scheme {name} "{kind}M-RoPE{over} of a Hugging Face {model_type} config" {{',
             "  axes t, h, w", *_param_lines(spec), "  layout halves"]
    grid, tail, scale = GRIDS[t]
    if t == "default":
        lines.append(f"  qk: rotate(geometric(base) * {_call(spec)})")
    else:
        lines += [f"  let freq = {grid}", *([f"  let m = {scale}"] if scale else []),
                  f"  qk: rotate(freq * {_call(spec)}{tail}" + (", scale = m)" if scale else ")")]
    train_length = spec.get(_train_length_key(spec))
    if train_length is not None and train_length <= limits.MAX_LENGTH:  # longer: pedsl trains no such context
        lines += ["  train {", "    context = train_length", "  }"]
    return "\n".join(lines + ["  allow frayed_frequencies", "}"]) + "\n"


def import_mrope(cfg: dict, name: str | None = None) -> str:
    """The checked, formatted `.pe` text of a Qwen-VL config's M-RoPE (InteropError otherwise)."""
    spec = mrope_spec(cfg)
    text = mrope_text(spec, name)
    try:
        text = fmt(text)
    except PedslError as err:
        d = err.diagnostics[0] if err.diagnostics else None
        raise InteropError(f"the scheme written from this config does not parse ({d.code + ' ' if d else ''}"
                           f"{d.message if d else err}); nothing was written", code="E963",
                           hint="this pedsl does not read multi-axis schemes (`axes`)") from None
    _check_written(text, spec)
    return text


def match_phase(phase) -> tuple[ast.Call, ast.Call] | None:
    """(the frequency call, the sections / interleave call) of a phase ``FREQS * sections(position, [...])``
    (optionally ``/ factor``)."""
    if phase.kind == "binary" and phase.op == "/":
        phase = phase.left
    if phase.kind != "binary" or phase.op != "*":
        return None
    for grid, pick in ((phase.left, phase.right), (phase.right, phase.left)):
        if grid.kind == "call" and pick.kind == "call" and pick.func in ("sections", "interleave") and \
                len(pick.args) == 2 and pick.args[0].kind == "name" and pick.args[0].id == "position" and \
                not pick.kwargs:
            return grid, pick
    return None


def _one_axis(phase, pick: ast.Call):
    """The phase with the axis selection replaced by ``position``: the same table read at one position."""
    if phase is pick:
        return ast.Name(id="position")
    if phase.kind == "binary":
        return phase.model_copy(update={"left": _one_axis(phase.left, pick), "right": _one_axis(phase.right, pick)})
    return phase


def export_mrope(scheme: Scheme, axes: int) -> dict:
    """The rope fields of a resolved 3-axis scheme of M-RoPE's form: one halves-layout rotation of every channel
    whose phase is one of HF's fixed tables (:data:`GRIDS`) times ``sections|interleave(position, [...])``, no
    bias or temperature; the table's rope_parameters are :func:`pedsl.hf.rope.export_rope`'s of the same scheme
    read at one position, plus ``mrope_section`` (and ``mrope_interleaved``). InteropError naming the part with
    no Hugging Face equivalent otherwise."""
    hint = ("HF's M-RoPE: rotate(FREQS * sections(position, [s_t, s_h, s_w])) or interleave(...) over 3 axes, "
            f"FREQS a {'/'.join(GRIDS)} table, halves layout, every channel, no bias or temperature")
    t = scheme.transports[0] if len(scheme.transports) == 1 else None
    if axes != 3:
        raise _refuse(scheme, f"{axes} position axes (HF's M-RoPE has t, h, w)", hint)
    found = match_phase(t.phase) if isinstance(t, RotateTransport) else None
    if found is None or not isinstance(t, RotateTransport):
        raise _refuse(scheme, "no rotation whose phase is a frequency table times sections|interleave(position, "
                      "[...])", hint)
    pick = found[1]
    one = scheme.model_copy(update={"axes": (), "transports": (
        t.model_copy(update={"phase": _one_axis(t.phase, pick)}),)})
    out = rope.export_rope(one)
    rp = out["rope_parameters"]
    if rp["rope_type"] not in GRIDS or "partial_rotary_factor" in rp:
        raise _refuse(scheme, f"rope_type '{rp['rope_type']}'" if rp["rope_type"] not in GRIDS else
                      "a rotation of some channels only", hint)
    pairs = scheme.head_dim // 2
    sizes = [int(s) for s in _static(scheme, pick.args[1], pairs)]
    if pick.func == "interleave" and [assignment("interleave", sizes, pairs).count(a) for a in range(3)] != sizes:
        raise _refuse(scheme, f"interleave sizes {sizes} that transformers' Qwen3-VL assignment does not give each "
                      "axis", hint)
    rp["mrope_section"] = sizes
    if pick.func == "interleave":
        rp["mrope_interleaved"] = True
    return out
