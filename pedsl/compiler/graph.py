"""Lower a resolved scheme to its dataflow graph (a networkx DAG).

Nodes are the stages of docs/semantics.md §1 - inputs (q, k, v, positions, x,
tokens), frequency tables, phases, step sources, per-group transforms, biases,
temperature, scores, softmax, value transport, output - each with a ``op``
attribute, the expression it computes and its type ``ty`` (from the resolved IR; an
edge from every run-time input its type reads, docs/semantics.md §1a). The passes in
:mod:`pedsl.compiler.passes` rewrite node attributes (what is folded, which
identity applies, which kernel runs) and record their decisions in the typed
:class:`~pedsl.compiler.plan.Plan` that the module and codegen execute. Node names of
evaluation sites (``phase[g]``, ``bias[i]``, ...) are names from :func:`~pedsl.compiler.plan.site_name`:
they prefix the names of learned parameters.
"""

from __future__ import annotations

import networkx as nx

from pedsl.errors import CompileError
from pedsl.compiler.plan import site_name
from pedsl.lang.exprs import to_source
from pedsl.lang.frequencies import pair_axes
from pedsl.lang.normalizers import weights_words
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import CARRIED
from pedsl.lang.types import Dep, Ty

# the input node of each run-time input an expression reads (its type's ``reads``), in edge order
_INPUTS = ((Dep.POSITION, "positions"), (Dep.DATA, "x"), (Dep.TOKEN, "tokens"), (Dep.LENGTH, "length n"),
           (Dep.LEARNED, "learned"))


def _sources(ty: Ty) -> list[str]:
    return [node for dep, node in _INPUTS if dep in ty.reads]


def lower(scheme: Scheme) -> nx.DiGraph:
    if scheme.layers is not None:
        parts = ", ".join(scheme.layers.parts)
        raise CompileError(f"scheme '{scheme.name}' gives its layers different schemes ({parts}): one attention "
                           "module is one of them", code="E400",
                           hint="compile a part (--scheme NAME), or train a model with the layers scheme")
    # carried: the statements' plain values by name (pedsl.lang.statements.CARRIED), recorded on the plan as they are
    g = nx.DiGraph(scheme=scheme.name, layout=scheme.layout, heads=scheme.heads, head_dim=scheme.head_dim,
                   axes=scheme.axes, pair_axes=pair_axes(scheme), carried={c.name: c.value_of(scheme) for c in CARRIED},
                   contextual=scheme.contextual, remap=scheme.remap, relative=scheme.relative)
    for name in ("q", "k", "v"):
        g.add_node(name, op="input", label=f"{name} (B, H, L, D)")
    g.add_node("positions", op="input", label="positions 0..L-1")
    g.add_node("scores", op="scores", label="scores <q_i, T(j->i) k_j> / sqrt(D)")
    g.add_node("softmax", op="softmax", label="causal " + weights_words(scheme))
    g.add_node("output", op="output", label="o (B, H, L, D)")
    g.add_edge("softmax", "output")
    g.add_edge("v", "softmax")
    if scheme.contextual is None:
        g.add_edge("scores", "softmax")
    else:  # CoPE: gates on the scores count the keys in between; q reads the embedding at that count
        c = scheme.contextual
        g.add_node("contextual", op="contextual", max_pos=c.max_pos, shared=c.shared,
                   label=f"CoPE: p(i, j) = sum_(t = j..i) sigmoid(s(i, t)) clamped to {c.max_pos - 1}, "
                   f"+ q_i . e[p(i, j)] (e: {c.max_pos} x D learned" + (", shared by the heads)" if c.shared
                                                                          else " per head)"))
        g.add_edge("scores", "contextual")
        g.add_edge("q", "contextual")
        g.add_edge("contextual", "softmax")

    if scheme.relative is not None:  # content-position terms: q and k read a table at each pair's distance
        g.add_node("relative", op="relative", label=scheme.relative.describe())
        g.add_edge("q", "relative")
        g.add_edge("k", "relative")
        g.add_edge("relative", "scores")
    for idx, t in enumerate(scheme.transports):
        node = _add_transport(g, scheme, idx, t)
        g.add_edge("q", node)
        g.add_edge("k", node)
        g.add_edge(node, "scores")
        if t.targets == "qkv":
            vt = f"value_transport[{t.group}]"
            g.add_node(vt, op="value_transport", label=f"U = T on {t.group}", group=t.group)
            g.add_edge(node, vt)
            g.add_edge("softmax", vt)
            g.add_edge(vt, "output")
    if not scheme.transports:
        g.add_edge("q", "scores")
        g.add_edge("k", "scores")

    for idx, b in enumerate(scheme.biases):
        node = site_name("bias", idx)
        if b.kind == "distance":
            g.add_node(node, op="distance_bias", index=idx, expr=b.term, slope=b.slope,
                       label=f"bias = {to_source(b.term)}", linear=b.slope is not None, ty=b.term_ty, axes=b.axes)
            g.add_edge("positions", node)
        else:
            g.add_node(node, op="gate_bias", index=idx, expr=b.log_gate,
                       label=f"bias = accumulate({to_source(b.log_gate)})", data=b.data, ty=b.log_gate_ty)
            for s in _sources(b.log_gate_ty):
                g.add_edge(_ensure(g, s), node)
        g.add_edge(node, "scores")
    if scheme.temperature is not None:
        assert scheme.temperature_ty is not None  # the resolver types the temperature it sets
        g.add_node(site_name("temperature"), op="temperature", expr=scheme.temperature,
                   label=f"tau = {to_source(scheme.temperature)}", ty=scheme.temperature_ty)
        for s in _sources(scheme.temperature_ty):
            g.add_edge(_ensure(g, s), "temperature")
        g.add_edge("temperature", "scores")
    assert nx.is_directed_acyclic_graph(g)
    return g


def _ensure(g: nx.DiGraph, src: str) -> str:
    """The input node ``src`` (x, tokens, the run-time length, learned parameters), added on first use."""
    if src not in g:
        labels = {"x": "x (B, L, d_model)", "tokens": "tokens (B, L)", "length n": "run-time length n",
                  "learned": "learned parameters"}
        g.add_node(src, op="input", label=labels.get(src, src))
    return src


def _add_transport(g: nx.DiGraph, scheme: Scheme, idx: int, t) -> str:
    """The nodes of transport ``t`` (its phase table, step angles or Householder w and beta, and the
    transform itself); the transform's node."""
    grp = scheme.group(t.group)
    node = site_name("transport", t.group)
    attrs = dict(group=t.group, channels=grp.channels, targets=t.targets, index=idx)
    if t.kind == "rotate":
        table = site_name("phase", t.group)
        g.add_node(table, op="phase_table", expr=t.phase, label=f"phase = {to_source(t.phase)}",
                   dynamic=t.dynamic, ty=t.phase_ty, per_token="head" in t.phase_ty.axes)
        for s in _sources(t.phase_ty):
            g.add_edge(_ensure(g, s), table)
        g.add_node(node, op="rotate", label=f"rotate {t.targets} on {t.group}" + (
            f", q and k scaled by {t.scale:g}" if t.scale != 1 else "") + (
            f", xPos decay (gamma {t.xpos_gamma:g}, zeta {t.xpos_zeta:g})" if t.xpos_gamma is not None else ""),
            phase=table, scale=t.scale, xpos_decay=None if t.xpos_gamma is None else (t.xpos_gamma, t.xpos_zeta), **attrs)
        g.add_edge(table, node)
    elif t.kind == "accumulate_rotation":
        steps = site_name("steps", t.group)
        g.add_node(steps, op="step_angles", expr=t.angle, label=f"step angle = {to_source(t.angle)}",
                   data=t.data, learned=t.learned, ty=t.angle_ty)
        for s in _sources(t.angle_ty):
            g.add_edge(_ensure(g, s), steps)
        g.add_node(node, op="accumulate_so2", label=f"accumulate SO(2) {t.targets} on {t.group}",
                   steps=steps, **attrs)
        g.add_edge(steps, node)
    elif t.kind == "dense_rotation":
        g.add_node(node, op="dense_rotate", label=f"{t.source()} {t.targets} on {t.group}", dense=t, **attrs)
        g.add_edge(_ensure(g, "learned"), node)
    else:
        w, beta = site_name("w", t.group), site_name("beta", t.group)
        g.add_node(w, op="householder_w", expr=t.w, label=f"w = {to_source(t.w)}", ty=t.w_ty)
        g.add_node(beta, op="householder_beta", expr=t.beta, label=f"beta = {to_source(t.beta)}", ty=t.beta_ty)
        for s in _sources(t.w_ty):
            g.add_edge(_ensure(g, s), w)
        for s in _sources(t.beta_ty):
            g.add_edge(_ensure(g, s), beta)
        g.add_node(node, op="accumulate_householder", label=f"accumulate Householder {t.targets} on {t.group}",
                   w=w, beta=beta, orthogonal=t.orthogonal, **attrs)
        g.add_edge(w, node)
        g.add_edge(beta, node)
    return node


def transform_nodes(g: nx.DiGraph) -> list[str]:
    """The per-group transform nodes, in the scheme's order."""
    nodes = [n for n, d in g.nodes(data=True) if d.get("op") in ("rotate", "accumulate_so2", "accumulate_householder",
                                                                   "dense_rotate")]
    return sorted(nodes, key=lambda n: g.nodes[n]["index"])


def bias_nodes(g: nx.DiGraph) -> list[str]:
    """The bias nodes, in the scheme's order."""
    nodes = [n for n, d in g.nodes(data=True) if d.get("op") in ("distance_bias", "gate_bias")]
    return sorted(nodes, key=lambda n: g.nodes[n]["index"])
