"""``pedsl explain``: what one resolved scheme does, for a reader who has not seen the file.

Sections: channel layout (which channels rotate, how they pair), a frequency table
(frequency, period, cycles within the training length, whether the pair wraps in
training), random/learned step spreads, bias slopes, the temperature at a few lengths,
the value transport, the lowered graph with the compiler's notes and backend, a rough
cost per token against plain attention, and the lint findings. No torch: the graph
comes from :func:`pedsl.compiler.compile_graph` (networkx and the front end only).
"""

from __future__ import annotations

import math

from pedsl.diffing.facts import (GroupFacts, SchemeFacts, describe_axes, describe_bias, describe_freqs, describe_rotation,
                                 describe_temperature, fmt_num, scheme_facts)
from pedsl.lang.frequencies import axis_runs
from pedsl.formulas import channel_pairs
from pedsl.lang.channels import channel_ranges
from pedsl.lang.scheme import Scheme
from pedsl.lang.layers import layer_map_lines

PATH_BLOCK = 64  # the blockwise PaTH kernel's block size C (pedsl.ops.path.path_attention)


def channel_lines(f: SchemeFacts) -> list[str]:
    out = []
    width = max(len(g.name) for g in f.groups) if f.groups else 4
    for g in f.groups:
        what = describe_rotation(g, f.head_dim, f.layout, where=False) if g.kind else "no transport (NoPE channels)"
        out.append(f"  {g.name.ljust(width)}  {g.spec}: {len(g.channels)} channels ({channel_ranges(g.channels)}): {what}")
        if g.kind in ("rotate", "accumulate_rotation"):
            pairs = channel_pairs(g.channels, f.layout)
            shown = ", ".join(f"({a}, {b})" for a, b in pairs[:4]) + (", ..." if len(pairs) > 4 else "")
            out.append(f"  {' ' * width}  pairs ({f.layout}): {shown} - {len(pairs)} pairs")
        if g.pair_axes:
            out.append(f"  {' ' * width}  axes read: {axis_runs(g.pair_axes)}")
    return out


def frequency_lines(f: SchemeFacts) -> list[str]:
    out = []
    L = f.train_length
    for g in f.rotating:
        freqs, periods = g.freqs, g.periods  # both None or neither
        if freqs is not None and periods is not None:
            head = f"  [{g.name}]" + (" (table recomputed for each run-time length n; shown for n <= training length)"
                                      if g.dynamic else "")
            out.append(head)
            axis = f"  {'axis':>5}" if g.pair_axes else ""
            out.append(f"    {'pair':>4}  {'channels':>9}{axis}  {'w (rad/token)':>13}  {'period':>10}  "
                       f"{'cycles in ' + str(L) if L else 'cycles':>14}  wraps in training")
            for k, ((a, b), w, p) in enumerate(zip(channel_pairs(g.channels, f.layout), freqs, periods)):
                cyc = L / p if L and p != math.inf else 0.0
                wraps = "yes" if L and p <= L else "no"
                ax = f"  {g.pair_axes[k]:>5}" if g.pair_axes else ""
                out.append(f"    {k:>4}  {f'{a}, {b}':>9}{ax}  {w:>13.6g}  {fmt_num(p):>10}  {fmt_num(cyc):>14}  {wraps}")
            d = describe_freqs(g, L)
            if d:
                out.append(f"    {d}")
        elif g.spread is not None:
            out.append(f"  [{g.name}] {describe_freqs(g, L)}")
            mix = [2 / s**2 if s > 0 else math.inf for s in g.spread]
            out.append(f"    {'pair':>4}  {'spread (rad)':>12}  {'mean (rad)':>10}  {'mixes within':>12}  "
                       + (f"mixes within {L}" if L else ""))
            for k, (s, m, t) in enumerate(zip(g.spread, g.mean or [0.0] * len(g.spread), mix)):
                out.append(f"    {k:>4}  {s:>12.4g}  {m:>10.4g}  {fmt_num(t):>12}  "
                           + (("yes" if t <= L else "no") if L else ""))
            if g.learned:
                out.append("    (learned: the spread is the scale at initialisation)")
        elif g.kind == "accumulate_householder":
            out.append(f"  [{g.name}] data-dependent Householder steps: no fixed frequencies"
                       + ("" if g.orthogonal else "; beta in (0, 2), so the transport also shrinks keys"))
    return out or ["  none (no rotated channels)"]


# ---------------------------------------------------------------------- cost


def _dense_cost(g: GroupFacts, H: int) -> tuple[str, float, float, str]:
    """A dense rotation's row: a (b x b) matrix exponential per block and token (~20 b^3 by scaling and squaring,
    shared by the heads unless per = head), the blocks on q and k (4 n b), the basis on q and k (4 n^2)."""
    n, b = len(g.channels), g.block
    expm = 20.0 * (n // b) * b ** 3 / (1 if g.per_head else H)
    apply = 4.0 * n * b + (4.0 * n * n if g.basis else 0.0)
    return (f"dense rotation [{g.name}]", expm + apply, 0.0,
            f"expm of {n // b} blocks {b} x {b} per token (~20 b^3 each{', per head' if g.per_head else ' / H'}) + "
            f"q, k through the blocks 4 n b" + (" and the basis 4 n^2" if g.basis else "") + "; keys cached rotated")


def cost_rows(f: SchemeFacts, L: int) -> list[tuple[str, float, float, str]]:
    """(component, FLOPs per token per head, floats kept per token per head, formula) at context L.

    Rough counts (multiply-add = 2 FLOPs), d_model assumed = heads * head_dim; plain attention
    is 4 L D FLOPs (scores and weighted values against L keys) and 2 D floats of K/V cache.
    """
    D, H = f.head_dim, f.heads
    d = H * D
    rows = [("plain attention (scores + values)", 4.0 * L * D, 2.0 * D, "4 L D FLOPs; K, V cache 2 D")]
    for g in f.rotating:
        Dg, P = len(g.channels), g.pairs
        n = 2 if g.targets == "qk" else 4  # q, k (+ v and the output rotated back)
        if g.kind == "rotate":
            rows.append((f"rotary [{g.name}]", 3.0 * n * Dg, 2.0 * P / H,
                         f"{n} x 3 x {Dg} (cos/sin multiply-add); cos/sin table 2 P shared by heads"))
        elif g.kind == "accumulate_rotation":
            steps = 2.0 * d * P / H if g.learned and g.reads_x else float(P)  # a projection of x, or a lookup
            rows.append((f"accumulated SO(2) [{g.name}]", steps + P + 2 * P + 3.0 * n * Dg, 2.0 * P,
                         f"step angles ({'projection of x 2 d P / H' if steps > P else 'table lookup P'}) + cumsum P "
                         f"+ cos/sin 2 P + {n} x 3 x {Dg}; float64 angles per token"))
        elif g.kind == "dense_rotation":
            rows.append(_dense_cost(g, H))
        else:
            C = min(PATH_BLOCK, L)
            w_cost = 2.0 * d * 16 / H + 2.0 * 16 * Dg + 6.0 * Dg + 3.0 * Dg + 2.0 * d / H
            rows.append((f"PaTH Householder [{g.name}]", w_cost + 4.0 * L * Dg + 4.0 * C * Dg, Dg + 1.0,
                         f"w, beta from x (~{w_cost:.0f}) + queries through block products 4 L D + UT/WY 4 C D "
                         f"(C = {C}); w and beta per token"))
    for b in f.biases:
        if b.kind == "distance" and b.slopes is not None:
            rows.append(("distance bias (extra key channel)", 4.0 * L, 2.0, "one more channel in q.k and v: 4 L"))
        elif b.kind == "distance" and b.axes:
            rows.append((f"distance bias over axes {', '.join(b.axes)}", 3.0 * len(b.axes) * L, float(len(b.axes)),
                         f"per pair: {len(b.axes)} distances and the term, ~3 A L per token; A positions per key"))
        elif b.kind == "distance":
            rows.append(("distance bias (table)", 1.0 * L, 1.0 * L, "add an (L, L) table: L per token, L floats"))
        else:
            rows.append(("forget gate (extra key channel)", 2.0 * d / H + 6 + 4.0 * L, 3.0,
                         "gate linear 2 d / H + log-sigmoid + cumsum, then one more channel: 4 L"))
    if f.temperature is not None:
        rows.append(("temperature (q scale)", float(D), 0.0, "D multiplies on q"))
    if f.cope_max_pos is not None:
        P = f.cope_max_pos
        rows.append(("CoPE (gates, counts, embedding)", 2.0 * P * D + 8.0 * L, 0.0,
                     f"q . e at {P} positions 2 P D + sigmoid, suffix sum, clamp, two gathers, interpolation ~8 L; "
                     "nothing cached beyond K, V"))
    if f.relative is not None:
        kind, R, terms = f.relative
        R = 2 * L if kind == "transformer_xl" else R  # one row per distance of the call
        rows.append((f"content-position terms ({kind})", 2.0 * R * D * terms + 2.0 * L * terms, 0.0,
                     f"q (and k) times {R} table rows 2 R D per term, a gather per pair 2 L; nothing cached "
                     "beyond K, V"))
    return rows


def cost_lines(f: SchemeFacts, L: int) -> list[str]:
    rows = cost_rows(f, L)
    base_f, base_m = rows[0][1], rows[0][2]
    tot_f, tot_m = sum(r[1] for r in rows), sum(r[2] for r in rows)
    width = max(len(r[0]) for r in rows)
    out = [f"  per token and head at context L = {L} (D = {f.head_dim}, d_model ~ {f.heads * f.head_dim}); "
           "rough counts"]
    out.append(f"    {'component'.ljust(width)}  {'FLOPs':>10}  {'floats':>7}  how")
    for name, fl, mem, how in rows:
        out.append(f"    {name.ljust(width)}  {fl:>10.0f}  {mem:>7.0f}  {how}")
    out.append(f"    {'total'.ljust(width)}  {tot_f:>10.0f}  {tot_m:>7.0f}  "
               f"x{tot_f / base_f:.2f} the FLOPs and x{tot_m / base_m:.2f} the memory of plain attention")
    return out


# ---------------------------------------------------------------------- graph and lints


def graph_lines(f: SchemeFacts) -> list[str]:
    if f.compile_error:
        return [f"  does not compile: {f.compile_error}"]
    from pedsl.compiler.plan import plan_lines  # on use: networkx only for a scheme that compiles

    plan = f.graph.graph["plan"]
    return [f"  backend: {plan.backend} - {plan.backend_why}"] + ["  " + line for line in plan_lines(plan)[1:]]


def explain_text(s: Scheme, warnings=(), *, context: int | None = None, file: str | None = None) -> str:
    if s.layers is not None:
        return _explain_layers(s, warnings, context=context, file=file)
    f = scheme_facts(s)
    L = context or f.train_length or 2048
    title = f"pedsl explain: {s.name}" + (f"  ({file})" if file else "")
    lines = [title]
    if s.doc:
        lines.append(f"  {s.doc}")
    lines.append(f"  {s.heads} heads x {s.head_dim} channels, {s.layout} pairing; training length "
                 f"{f.train_length if f.train_length else 'not set'}"
                 + (f"; extends {' -> '.join(s.bases)}" if s.bases else ""))
    if s.params:
        lines.append("  parameters: " + ", ".join(f"{k} = {v}" for k, v in s.params.items()))
    if s.axes:
        lines.append(f"  positions: {describe_axes(f).split(':')[0]}; each pair's frequency is along the axis "
                     "it reads (the table's axis column)")
    lines += ["", "Channels"] + channel_lines(f)
    lines += ["", "Frequencies"] + frequency_lines(f)
    lines += ["", "Bias"] + ([f"  {describe_bias(b)}" for b in f.biases] or ["  none"])
    lines += ["", "Temperature", f"  {describe_temperature(f)}"]
    lines += ["", "Attention", f"  {f.shape}"]
    lines += ["", "Weights", f"  {f.normalize}" + ("" if s.normalize == "softmax" else " (docs/semantics.md §1b)")]
    if s.contextual is not None:
        lines += ["", "Contextual positions", f"  {s.contextual.describe()}: key j of query i sits at p(i, j), "
                  "counted by the query's own gates on the scores of the keys j..i; the logit gains q_i . e[p(i, j)] "
                  "read between integer positions (docs/semantics.md §1c)"]
    vg = f.value_groups
    lines += ["", "Value transport",
              f"  U = T on {', '.join(vg)}: values are transported like keys and the output is rotated back"
              if vg else "  none: values are not transported (U = identity)"]
    lines += ["", "Lowered graph (the plan after the passes)"] + graph_lines(f)
    lines += ["", "Cost"] + cost_lines(f, L)
    lines += ["", "Lint"]
    warns = list(warnings)
    lines += [("  " + d.render().replace("\n", "\n  ")) for d in warns] or ["  no findings"]
    return "\n".join(lines)


def _explain_layers(s: Scheme, warnings, *, context: int | None, file: str | None) -> str:
    """A layers scheme: its layer map, then each part explained as a scheme of its own."""
    lines = [f"pedsl explain: {s.name}" + (f"  ({file})" if file else "")]
    if s.doc:
        lines.append(f"  {s.doc}")
    layers = s.layers
    assert layers is not None  # called for a layers scheme only
    lines += ["", "Layers"] + layer_map_lines(layers)
    for name, part in layers.parts.items():
        lines += ["", f"=== part {name} ===", explain_text(part, (), context=context, file=part.file)]
    lines += ["", "Lint"]
    lines += [("  " + d.render().replace("\n", "\n  ")) for d in warnings] or ["  no findings"]
    return "\n".join(lines)
