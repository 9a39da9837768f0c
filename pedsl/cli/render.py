"""Human-readable, YAML-like rendering of a resolved scheme for `pedsl show`."""

from __future__ import annotations

import json
import math
from typing import Any

from pedsl.lang.channels import channel_ranges
from pedsl.lang.exprs import format_number, to_source
from pedsl.lang.frequencies import rotary_frequencies
from pedsl.lang.layers import layer_map_lines
from pedsl.lang.statements import shown


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float):
        return format_number(v)  # shortest round trip; a float keeps its '.0
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return str(v)


def render_scheme(scheme) -> str:
    """A human-readable, YAML-like view of a resolved scheme."""
    lines = [f"scheme: {scheme.name}"]
    if scheme.doc:
        lines.append(f"doc: {json.dumps(scheme.doc)}")
    if scheme.file:
        lines.append(f"file: {scheme.file}")
    if scheme.bases:
        lines.append("extends: " + " -> ".join(scheme.bases))
    lines.append(f"heads: {scheme.heads}")
    lines.append(f"head_dim: {scheme.head_dim}")
    lines += shown(scheme, "header")
    if scheme.layers is not None:
        lines += ["layers:", *layer_map_lines(scheme.layers)]
        lines += ["parts:"] + [f"  {n}: {p.file or '-'}" + (f" (extends {' -> '.join(p.bases)})" if p.bases else "")
                               for n, p in scheme.layers.parts.items()]
        return "\n".join(lines + _settings_lines(scheme))  # the layers' attention is their parts'
    if scheme.params:
        lines.append("params:")
        lines += [f"  {k}: {_scalar(v)}" for k, v in scheme.params.items()]
    lines.append("groups:")
    for g in scheme.groups:
        lines.append(f"  {g.name}: channels {channel_ranges(g.channels)} ({len(g.channels)}; {g.spec})")
    try:
        freqs = rotary_frequencies(scheme)
    except Exception:  # pragma: no cover - a display nicety must never break show
        freqs = {}
    if scheme.transports:
        lines.append("transports:")
        for t in scheme.transports:
            lines.append(f"  - kind: {t.kind}")
            lines.append(f"    targets: {t.targets}")
            lines.append(f"    group: {t.group}")
            if t.kind == "rotate":
                lines.append(f"    phase: {to_source(t.phase)}")
                if t.dynamic:
                    lines.append("    dynamic: true  # the table depends on the run-time length n")
                if t.scale != 1:
                    lines.append(f"    scale: {t.scale!r}  # q and k of the group (logits of the group x scale^2)")
                if t.xpos_gamma is not None:
                    lines.append(f"    xpos: {{gamma: {t.xpos_gamma!r}, zeta: {t.xpos_zeta!r}}}  # pair k decays as "
                                 "zeta_k^((i - j) / gamma)")
            elif t.kind == "accumulate_rotation":
                lines.append(f"    angle: {to_source(t.angle)}")
                lines.append(f"    data: {_scalar(t.data)}")
                lines.append(f"    learned: {_scalar(t.learned)}")
            elif t.kind == "dense_rotation":
                lines.append(f"    rotation: {t.source()}  # R(p) = P^T expm(sum_a p_a A_a) P, learned")
                lines.append(f"    relative: {_scalar(t.commuting)}  # the generators commute: R(p_i)^T R(p_j) = R(p_j - p_i)")
            else:
                lines.append(f"    w: {to_source(t.w)}")
                lines.append(f"    beta: {to_source(t.beta)}")
                lines.append(f"    orthogonal: {_scalar(t.orthogonal)}")
            if t.group in freqs and t.kind == "rotate" and not t.dynamic:
                periods = [2 * math.pi / w if w > 0 else float("inf") for w in freqs[t.group]]
                lines.append("    periods: " + _scalar([round(p, 1) for p in periods]))
    else:
        lines.append("transports: []  # no positional transport (NoPE)")
    lines += shown(scheme, "body")  # the biases and the attention's statements (pedsl.lang.statements)
    return "\n".join(lines + _settings_lines(scheme))


def _settings_lines(scheme) -> list[str]:
    """The train / eval blocks and ``allow``."""
    lines = []
    for name in ("train", "eval"):
        table = getattr(scheme, name)
        if table:
            lines.append(f"{name}:")
            lines += [f"  {k}: {_scalar(v)}" for k, v in table.items()]
    if scheme.allow:
        lines.append("allow: [" + ", ".join(scheme.allow) + "]")
    return lines
