"""Render a diff for people (a code-review-like text) and for machines (JSON + its JSON Schema).

The JSON document is built by :func:`to_json`; :data:`JSON_SCHEMA` describes it
(``pedsl diff --json-schema`` prints it) and :func:`validate` checks a document
against it with a small hand-written checker (``jsonschema`` is not a
dependency): ``type``, ``properties``, ``required``, ``additionalProperties``,
``items``, ``enum``, ``minimum`` and ``oneOf`` - the keywords the schema uses.
"""

from __future__ import annotations

import json
from typing import Any

from pedsl.diffing.edits import Edit, Insert, Keep, Move, Remove, Update, edit_kind, equivalent, is_semantic

# ---------------------------------------------------------------------- JSON

_ANY = {"type": ["string", "number", "integer", "boolean", "null", "array", "object"]}
_SIDE = {
    "type": "object",
    "required": ["file", "scheme"],
    "additionalProperties": False,
    "properties": {"file": {"type": ["string", "null"]}, "scheme": {"type": "string"},
                   "params": {"type": "object"}},
}
_EDIT = {
    "type": "object",
    "required": ["op", "path", "semantic"],
    "additionalProperties": False,
    "properties": {
        "op": {"enum": ["insert", "remove", "move", "update", "keep"]},
        "path": {"type": "string"},
        "new_path": {"type": "string"},
        "value": _ANY, "old": _ANY, "new": _ANY,
        "semantic": {"type": "boolean"},
    },
}
_CURVE = {
    "type": "object",
    "required": ["curve", "max_abs", "at", "a", "b"],
    "additionalProperties": False,
    "properties": {"curve": {"type": "string"}, "max_abs": {"type": "number", "minimum": 0},
                   "at": {"type": "integer", "minimum": 0}, "a": {"type": "number"}, "b": {"type": "number"}},
}
JSON_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "pedsl diff",
    "description": "The output of `pedsl diff --json`: typed edits from scheme a to scheme b, what they mean, "
                   "and (with --numeric) the largest differences of the score kernels.",
    "type": "object",
    "required": ["a", "b", "equivalent", "edits", "summary", "numeric"],
    "additionalProperties": False,
    "properties": {
        "a": _SIDE,
        "b": _SIDE,
        "equivalent": {"type": "boolean"},
        "edits": {"type": "array", "items": _EDIT},
        "summary": {
            "type": "array",
            "items": {
                "type": "object", "required": ["topic", "before", "after", "changed"], "additionalProperties": False,
                "properties": {"topic": {"type": "string"}, "before": {"type": "string"},
                               "after": {"type": "string"}, "changed": {"type": "boolean"}},
            },
        },
        "note": {"type": ["string", "null"]},
        "numeric": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["lmax", "samples", "seed", "method_a", "method_b", "largest", "curves"],
                    "additionalProperties": False,
                    "properties": {
                        "lmax": {"type": "integer", "minimum": 0}, "samples": {"type": "integer", "minimum": 1},
                        "seed": {"type": "integer"}, "method_a": {"type": "string"}, "method_b": {"type": "string"},
                        "largest": _CURVE, "curves": {"type": "array", "items": _CURVE},
                        "transport_a": {"type": "array", "items": {"type": "number"}},
                        "transport_b": {"type": "array", "items": {"type": "number"}},
                        "plot": {"type": ["string", "null"]},
                        "not_in_curves": {"type": "array", "items": {"type": "string"}},
                        "noise": {"oneOf": [{"type": "null"},
                                            {"type": "object", "additionalProperties": {"type": "number"}}]},
                    },
                },
            ]
        },
    },
}


def edit_json(e: Edit) -> dict:
    out: dict[str, Any] = {"op": edit_kind(e), "path": e.path}
    if isinstance(e, Move):
        out["new_path"] = e.new_path
    elif isinstance(e, Update):
        out["old"], out["new"] = _plain(e.old), _plain(e.new)
    else:
        out["value"] = _plain(e.value)
    out["semantic"] = is_semantic(e)
    return out


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def to_json(side_a: dict, side_b: dict, edits: list[Edit], summary: list, note: str | None,
            numeric: dict | None) -> dict:
    return {
        "a": side_a,
        "b": side_b,
        "equivalent": equivalent(edits),
        "edits": [edit_json(e) for e in edits],
        "summary": [{"topic": t, "before": x, "after": y, "changed": x != y} for t, x, y in summary],
        "note": note,
        "numeric": numeric,
    }


_TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def validate(doc: Any, schema: dict = JSON_SCHEMA, where: str = "$") -> list[str]:
    """Every way ``doc`` violates ``schema`` (an empty list when it is valid)."""
    errs: list[str] = []
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not validate(doc, s, where)]
        if len(ok) != 1:
            errs.append(f"{where}: matches {len(ok)} of the oneOf alternatives, not exactly one")
        return errs
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](doc) for t in types):
            return [f"{where}: expected {' or '.join(types)}, got {type(doc).__name__}"]
    if "enum" in schema and doc not in schema["enum"]:
        errs.append(f"{where}: {doc!r} is not one of {schema['enum']}")
    if "minimum" in schema and _TYPES["number"](doc) and doc < schema["minimum"]:
        errs.append(f"{where}: {doc} is below the minimum {schema['minimum']}")
    if isinstance(doc, dict):
        props = schema.get("properties", {})
        errs += [f"{where}: missing required property '{k}'" for k in schema.get("required", []) if k not in doc]
        for k, v in doc.items():
            if k in props:
                errs += validate(v, props[k], f"{where}.{k}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{where}: unexpected property '{k}'")
    if isinstance(doc, list) and "items" in schema:
        for i, v in enumerate(doc):
            errs += validate(v, schema["items"], f"{where}[{i}]")
    return errs


# ---------------------------------------------------------------------- text


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def _short(v: str) -> str:
    """An unchanged topic's value, shortened for the one-line 'unchanged' list."""
    if len(v) <= 40:
        return v
    for sep in (":", " ("):
        head = v.split(sep, 1)[0]
        if len(head) <= 40:
            return head
    return ""


def edit_line(e: Edit) -> list[str]:
    if e.path == "doc" and isinstance(e, Update):
        return ["~ doc:", f"    - {json.dumps(e.old)}", f"    + {json.dumps(e.new)}"]
    if isinstance(e, Insert):
        return [f"+ {e.path} = {_show(e.value)}"]
    if isinstance(e, Remove):
        return [f"- {e.path} = {_show(e.value)}"]
    if isinstance(e, Move):
        if e.path.startswith("transport["):
            what = "moved to channel group " + e.new_path[len("transport["):-1]
        else:
            what = "renamed"
        return [f"> {e.path} -> {e.new_path} ({what})"]
    if isinstance(e, Keep):
        return [f"  {e.path} = {_show(e.value)}"]
    old, new = _show(e.old), _show(e.new)
    if len(e.path) + len(old) + len(new) > 90:
        return [f"~ {e.path}:", f"    - {old}", f"    + {new}"]
    return [f"~ {e.path}: {old} -> {new}"]


def render_text(label_a: str, label_b: str, edits: list[Edit], summary: list, note: str | None,
                numeric: dict | None) -> str:
    sem = sum(is_semantic(e) for e in edits)
    head = f"pedsl diff: {label_a} -> {label_b}: "
    if not edits:
        head += "no differences (the resolved schemes are identical)"
    elif not sem:
        head += f"equivalent ({len(edits)} edit{'s' * (len(edits) != 1)} to the name, doc or lint allowances only)"
    else:
        head += f"{len(edits)} edit{'s' * (len(edits) != 1)}, {sem} changing the meaning"
    lines = [head]
    if edits:
        lines += ["", "Edits"] + ["  " + x for e in edits for x in edit_line(e)]
    if summary:
        lines += ["", "What this means"]
        ch = [(t, x, y) for t, x, y in summary if x != y]
        same = [(t, x) for t, x, y in summary if x == y]
        if not ch:
            lines.append("  nothing that the compiler or the kernels see changes")
        for t, x, y in ch:
            if not x:
                lines.append(f"  {t}: {y}")
            else:
                lines += [f"  {t}:", f"    was: {x}", f"    now: {y}"]
        if note:
            lines.append(f"  note: {note}")
        if same:
            lines.append("  unchanged: " + "; ".join(f"{t} ({_short(x)})" if _short(x) else t for t, x in same))
    if numeric:
        lines += ["", *numeric_lines(numeric)]
    return "\n".join(lines)


def _within_noise(c: dict, noise: dict | None) -> str:
    if noise and c["max_abs"] <= noise.get(c["curve"], 0.0):
        return " - within sampling noise"
    return ""


def numeric_lines(n: dict) -> list[str]:
    big, noise = n["largest"], n.get("noise")
    where = "query position" if big["curve"] == "temperature" else "distance"
    how = n["method_a"] if n["method_a"] == n["method_b"] else f"A: {n['method_a']}; B: {n['method_b']}"
    out = [f"Numeric (distances 0..{n['lmax']}; {how})"]
    if big["max_abs"] == 0:
        out.append("  identical: every curve (transport correlation, bias per head, temperature) matches exactly")
    else:
        out.append(f"  largest difference: {big['curve']} {big['max_abs']:.4g} at {where} {big['at']} "
                   f"(A {big['a']:.4g}, B {big['b']:.4g}){_within_noise(big, noise)}")
    ta, tb = n.get("transport_a"), n.get("transport_b")
    if ta and tb:
        ds = [d for d in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if d < min(len(ta), len(tb))]
        out.append("  mean <u, T(d) u>  d = " + " ".join(f"{d:>7}" for d in ds))
        out.append("                    A = " + " ".join(f"{ta[d]:>7.3f}" for d in ds))
        out.append("                    B = " + " ".join(f"{tb[d]:>7.3f}" for d in ds))
    rows = [c for c in n["curves"] if c["max_abs"] > 0]
    if rows and big["max_abs"] > 0:
        out.append("  per curve: " + "; ".join(f"{c['curve']} {c['max_abs']:.3g} at {c['at']}{_within_noise(c, noise)}"
                                               for c in rows))
    if noise:
        moved = "; ".join(f"{k} {v:.3g}" for k, v in noise.items() if v > 0)
        out.append(f"  sampling noise (a data-dependent side drawn at seeds {n['seed']} and {n['seed'] + 1}): "
                   + (moved or "none: every curve is the same at both seeds (its learned values start at constants)"))
    for what in n.get("not_in_curves") or ():
        out.append(f"  not in these curves: {what}")
    if n.get("plot"):
        out.append(f"  plot: {n['plot']}")
    return out
