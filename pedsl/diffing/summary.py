"""What an edit script means: the facts of A and B side by side, changed ones first.

Each item is ``(topic, before, after)``; ``before == after`` marks an unchanged
topic. The text report prints the changed ones as ``topic: before -> after`` and
the unchanged ones on one line, so a reviewer sees what the change does (which
channels rotate, the frequency range and how many pairs wrap in training, bias,
temperature, value transport, the backend, parameters) without reading
expressions.
"""

from __future__ import annotations

import math

from pedsl.diffing.facts import (SchemeFacts, describe_axes, describe_bias, describe_freqs, describe_rotation,
                                 describe_temperature, fmt_num)
from pedsl.diffing.edits import Insert, Move, Remove, Update


def _rotation(f: SchemeFacts) -> str:
    if not f.rotating:
        return "none: no channel is rotated (NoPE)"
    return "; ".join(f"[{g.name}] " + describe_rotation(g, f.head_dim, f.layout) for g in f.rotating)


def _freqs(f: SchemeFacts) -> str:
    parts = []
    for g in f.rotating:
        if g.pair_axes and g.periods is not None:  # several axes: the periods of the pairs reading each axis
            by: dict[str, list[float]] = {}
            for axis, p in zip(g.pair_axes, g.periods):
                by.setdefault(axis, []).append(p)
            parts.append(f"[{g.name}] " + "; ".join(f"{axis}: periods {fmt_num(min(ps))} .. {fmt_num(max(ps))} over "
                                                    f"{len(ps)} pairs" for axis, ps in by.items()))
            continue
        d = describe_freqs(g, f.train_length)
        if d is not None:
            parts.append(f"[{g.name}] {d}")
        elif g.kind == "accumulate_householder":
            parts.append(f"[{g.name}] data-dependent (no fixed frequencies)")
    return "; ".join(parts) or "none"


def _scale_note(a: SchemeFacts, b: SchemeFacts) -> str | None:
    """'every period x4' when B's frequencies are A's times one constant."""
    fa = [g.freqs for g in a.rotating if g.freqs]
    fb = [g.freqs for g in b.rotating if g.freqs]
    if len(fa) != 1 or len(fb) != 1 or len(fa[0]) != len(fb[0]):
        return None
    ratios = [x / y for x, y in zip(fa[0], fb[0]) if y > 0]
    if not ratios or len(ratios) != len(fa[0]):
        return None
    if max(ratios) - min(ratios) <= 1e-9 * max(ratios) and abs(ratios[0] - 1) > 1e-12:
        return f"every period x{fmt_num(ratios[0])} (all frequencies / {fmt_num(ratios[0])})"
    changed = sum(abs(r - 1) > 1e-9 for r in ratios)
    if changed:
        return (f"{changed} of {len(ratios)} pairs change frequency (period ratio B/A "
                f"{fmt_num(min(ratios))} .. {fmt_num(max(ratios))})")
    return None


def _bias(f: SchemeFacts) -> str:
    return "; ".join(describe_bias(b) for b in f.biases) or "none"


def _value(f: SchemeFacts) -> str:
    vg = f.value_groups
    if not vg:
        return "none (U = identity)"
    return "U = T on " + ", ".join(vg) + " (values transported like keys; the output is moved back)"


def _backend(f: SchemeFacts) -> str:
    if f.compile_error:
        return f"does not compile: {f.compile_error}"
    return f"{f.backend}: {f.backend_note}" if f.backend_note else str(f.backend)


def _params(f: SchemeFacts) -> str:
    return ", ".join(f"{k} = {v}" for k, v in f.params.items()) or "none"


def summarize(a: SchemeFacts, b: SchemeFacts, edits: list) -> list[tuple[str, str, str]]:
    """[(topic, before, after)] for the topics a reviewer cares about, in a fixed order."""
    items = [
        ("shape", f"{a.heads} heads x {a.head_dim} channels", f"{b.heads} heads x {b.head_dim} channels"),
        ("rotation", _rotation(a), _rotation(b)),
        ("frequencies", _freqs(a), _freqs(b)),
        ("bias", _bias(a), _bias(b)),
        ("temperature", describe_temperature(a), describe_temperature(b)),
        ("attention", a.shape, b.shape),
        ("weights", a.normalize, b.normalize),
        ("contextual positions", a.contextual, b.contextual),
        ("value transport", _value(a), _value(b)),
        ("backend", _backend(a), _backend(b)),
        ("training length", str(a.train_length), str(b.train_length)),
    ]
    if a.axes or b.axes:  # multi-axis positions: which pairs read which axis
        items.insert(1, ("position axes", describe_axes(a), describe_axes(b)))
    note = _scale_note(a, b)
    if note:
        items.insert(3, ("frequency change", "", note))
    shared = next((e for e in edits if e.path == "learned.shared"), None)
    if shared is not None:  # the same text, but one set of learned parameters read twice, or two sets
        items.append(("learned parameters", "; ".join(shared.old) or "no value read twice",
                      "; ".join(shared.new) or "no value read twice"))
    pe = [e for e in edits if e.path.startswith("params.")]
    if pe:
        words = []
        for e in pe:
            name = e.path.split(".", 1)[1]
            if isinstance(e, Insert):
                words.append(f"added {name} = {e.value}")
            elif isinstance(e, Remove):
                words.append(f"removed {name} (was {e.value})")
            elif isinstance(e, Move):
                words.append(f"{name} renamed to {e.new_path.split('.', 1)[1]}")
            elif isinstance(e, Update):
                words.append(f"{name}: {e.old} -> {e.new}")
        items.append(("parameters", "", "; ".join(words)))
    else:
        items.append(("parameters", _params(a), _params(b)))
    return items


def changed(items: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [it for it in items if it[1] != it[2]]


def same_meaning_note(a: SchemeFacts, b: SchemeFacts) -> str | None:
    """A note when two differently written schemes lower to the same kernels (e.g. RoPE as constant steps)."""
    if a.graph is None or b.graph is None or a.backend != b.backend:
        return None
    if [(g.name, g.channels, g.targets) for g in a.rotating] != [(g.name, g.channels, g.targets) for g in b.rotating]:
        return None
    for ga, gb in zip(a.rotating, b.rotating):
        if ga.freqs is None or gb.freqs is None or len(ga.freqs) != len(gb.freqs):
            return None
        if any(not math.isclose(x, y, rel_tol=1e-12) for x, y in zip(ga.freqs, gb.freqs)):
            return None
    if _bias(a) != _bias(b) or describe_temperature(a) != describe_temperature(b) or a.layout != b.layout:
        return None
    if a.rotating and any(ga.kind != gb.kind for ga, gb in zip(a.rotating, b.rotating)):
        return "written differently, but the compiler lowers both to the same rotary tables and kernel"
    return None
