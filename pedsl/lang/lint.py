"""Warnings for legal but suspicious schemes. Each can be silenced with `allow NAME`.

- W101 frayed_frequencies: rotated frequencies whose period exceeds the training
  length never complete a cycle in training, so their phases leave the training
  distribution when the model runs longer (the "Frayed RoPE" criterion).
- W102 temperature_without_length: a temperature but no ``train { context = ... }``.
- W103 nonorthogonal_value: value transport (``qkv``) on Householder steps whose
  beta is not the constant 2: the value transport is then not a rotation.
- W104 no_spectral_gap: accumulated random steps whose pairs drift with a mean
  and mix too slowly to forget within the training length (docs/semantics.md §2b).
- W105 unused: a ``let`` or ``param`` that nothing uses.
- W106 constant_bias: a bias term that depends on neither the distance nor the route cancels in
  the softmax (reported while the bias is resolved, since the term is dropped from the scheme).
"""

from __future__ import annotations

import math

from pedsl.errors import Diagnostic, DiagnosticSink
from pedsl.lang import ast
from pedsl.lang.diagnostics import node_pos
from pedsl.lang.fold import fold_expr
from pedsl.lang.exprs import calls_in, names_in, transform
from pedsl.lang.frequencies import axis_frequencies, rotary_frequencies, scheme_env
from pedsl.lang.imports import Source
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import BY_KIND
from pedsl.lang.values import EvalIssue, StaticEnv, Vec



def lint(scheme: Scheme, src: Source) -> list[Diagnostic]:
    """The warnings about a resolved scheme of the file ``src`` (W101-W105)."""
    out: list[Diagnostic] = []
    allowed = set(scheme.allow)
    sink = DiagnosticSink(file=src.file, source=src.text)

    def where(node) -> dict:
        span = getattr(node, "span", None)
        return {"line": span.line, "col": span.col} if span else {"line": None, "col": None}

    decl = next((d for d in src.module.schemes if d.name == scheme.name), None)
    anchor = decl
    train_length = scheme.train.get("context")

    if "frayed_frequencies" not in allowed and isinstance(train_length, (int, float)) and scheme.axes:
        for group, axis, count, pairs, longest, extent in frayed_axes(scheme, train_length):
            sink.add(
                "W101",
                f"{count} of {pairs} rotary pairs in group '{group}' have periods along axis '{axis}' longer than "
                f"the training extent along it ({longest:.4g} > {extent:g} positions): they never complete a cycle "
                "in training and rotate out of distribution past it",
                severity="warning",
                hint="give that axis faster frequencies (a smaller base), fewer pairs, or "
                "'allow frayed_frequencies' for a baseline",
                **where(anchor),
            )
    elif "frayed_frequencies" not in allowed and isinstance(train_length, (int, float)):
        for group, freqs in rotary_frequencies(scheme).items():
            slow = [2 * math.pi / w for w in freqs if w > 0 and 2 * math.pi / w > train_length]
            if slow:
                sink.add(
                    "W101",
                    f"{len(slow)} of {len(freqs)} rotary pairs in group '{group}' have periods longer than the "
                    f"training length ({max(slow):.4g} > {train_length} tokens): they never complete a cycle in "
                    "training and rotate out of distribution past it",
                    severity="warning",
                    hint="use span(train_length) for a grid that completes >= 2 cycles, rotate fewer channels, "
                    "or 'allow frayed_frequencies' for a baseline",
                    **where(anchor),
                )
    if scheme.temperature is not None and train_length is None and "temperature_without_length" not in allowed:
        sink.add("W102", "a temperature is set but the scheme has no training length (train { context = ... })",
                 severity="warning", hint="length-dependent temperatures are calibrated to the training length",
                 **where(anchor))
    if "nonorthogonal_value" not in allowed:
        for t in scheme.transports:
            if t.kind == "accumulate_householder" and t.targets == "qkv" and not t.orthogonal:
                sink.add("W103", f"value transport on non-orthogonal Householder steps (group '{t.group}'): "
                         "U(j->i) then scales values as well as turning them", severity="warning",
                         hint="use beta = 2 for reflections, or say 'allow nonorthogonal_value'", **where(anchor))
    if "no_spectral_gap" not in allowed and isinstance(train_length, (int, float)):
        env = scheme_env(scheme)
        for t in scheme.transports:
            if t.kind != "accumulate_rotation" or "frozen_random" not in calls_in(t.angle):
                continue
            pairs = len(scheme.group(t.group).channels) // 2
            spread = _random_part(t.angle, env, pairs, 1.0)
            mean = _random_part(t.angle, env, pairs, 0.0)
            if spread is None or mean is None:
                continue
            sigma = [abs(a - b) for a, b in zip(spread, mean)]
            slow = [k for k, (s, mu) in enumerate(zip(sigma, mean))
                    if mu != 0 and (s == 0 or 2 / s**2 > train_length)]
            if slow:
                sink.add("W104", f"{len(slow)} of {pairs} pairs in group '{t.group}' drift with a mean step but "
                         f"mix more slowly than the training length: they extrapolate no better than RoPE",
                         severity="warning", hint="use zero-mean random angles with a per-pair spread "
                         "(sigma * frozen_random(token))", **where(anchor))
    if "unused" not in allowed and decl is not None:
        used: set[str] = set()
        for st in decl.body:
            for e in _exprs(st):
                used |= names_in(e)
        for st in decl.body:
            if st.kind == "let" and st.name not in used and decl.base is None:
                sink.add("W105", f"'{st.name}' is defined but never used", severity="warning",
                         hint="remove it or 'allow unused'", **where(st))
    out.extend(sink.items)
    return out


def axis_extents(scheme: Scheme, context: float) -> dict[str, float]:
    """The training extent along each axis of a multi-axis scheme: a grid of ``context = H x W`` tokens
    of width ``grid_width`` (the grid tasks' setting; square when absent) for two axes; for A >= 3 axes a
    clip of equal sides when the context is a whole A-th power (``context = 512``: 8 x 8 x 8 frames, rows and
    columns), else ``context`` along every axis (no axis position goes further than the tokens of a text-like
    layout, as text interleaved with images has)."""
    width = scheme.train.get("grid_width")
    A = len(scheme.axes)
    if A == 2:
        w = width if isinstance(width, (int, float)) and width > 0 else math.isqrt(int(context))
        return {scheme.axes[0]: max(1.0, context / w), scheme.axes[1]: float(w)}
    side = round(context ** (1.0 / A)) if A and context >= 1 else 0
    if A >= 3 and side >= 2 and side ** A == context:
        return {a: float(side) for a in scheme.axes}
    return {a: float(context) for a in scheme.axes}


def frayed_axes(scheme: Scheme, context: float) -> list[tuple[str, str, int, int, float, float]]:
    """W101 per axis: (group, axis, frayed pairs, pairs, longest period, extent) where a pair reading the
    axis has a period beyond the training extent along it."""
    out = []
    extents = axis_extents(scheme, context)
    for group, per_axis in axis_frequencies(scheme).items():
        for axis, freqs in per_axis.items():
            slow = [2 * math.pi / w for w in freqs if w > 0 and 2 * math.pi / w > extents[axis]]
            if slow:
                out.append((group, axis, len(slow), len(freqs), max(slow), extents[axis]))
    return out


def _random_part(angle: ast.Expr, env: StaticEnv, pairs: int, value: float):
    """Evaluate the angle with every frozen_random(...) replaced by ``value``."""

    def sub(node):
        if node.kind == "call" and node.func == "frozen_random":
            return ast.Num(value=value)
        return None

    try:
        v = fold_expr(transform(angle, sub), env.child(pairs=pairs))
    except EvalIssue:
        return None
    if isinstance(v, Vec):
        return v.values
    if isinstance(v, (int, float)):
        return (float(v),) * pairs
    return None


def _exprs(st) -> list[ast.Expr]:
    return BY_KIND[st.kind].reads(st)


def constant_bias_terms(terms: list[ast.Expr], src: Source, allowed: set[str]) -> list[Diagnostic]:
    """W106 for the bias terms that depend on neither i - j nor the route (they cancel in the softmax)."""
    if "constant_bias" in allowed:
        return []
    sink = DiagnosticSink(file=src.file, source=src.text)
    for term in terms:
        sink.add("W106", "this bias term does not depend on the distance: it cancels in the softmax",
                 severity="warning", hint="remove it, or 'allow constant_bias'", **node_pos(term))
    return sink.items
