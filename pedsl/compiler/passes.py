"""Graph passes: small pure functions ``(graph, options) -> graph``, run in the order of :data:`PASSES`.

Each pass copies the graph, rewrites what its identity allows (docs/semantics.md
§5) and records why in the node's ``note``, so ``pedsl graph`` shows
what the compiler decided.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.builtins import CONSTANTS
from pedsl.lang.types import Dep, join

BACKENDS = ("auto", "sdpa", "flex", "blockwise", "masked", "reference")


@dataclass(frozen=True)
class Options:
    backend: str = "auto"
    requires_grad: bool = True
    device: str = "cpu"


def _is_static(node: dict) -> bool:
    """The node's expression is a compile-time constant: its type's dependence class (docs/semantics.md §1a)."""
    return node["ty"].dep is Dep.STATIC


def fold_static_tables(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Frequency/phase tables that depend only on positions are constants: compute once in float64."""
    g = g.copy()
    for n, d in g.nodes(data=True):
        if d["op"] == "phase_table":
            if d.get("dynamic"):
                d["note"] = "depends on the run-time length n: recomputed (float64) for each new length"
            else:
                d["folded"] = True
                d["note"] = "static table: folded in float64, cached as cos/sin buffers, grown for longer inputs"
    return g


def constant_steps_are_rope(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """accumulate(rotation(w)) with constant w rotates pair k by w_k * (i - j): it is RoPE."""
    g = g.copy()
    for n in [n for n, d in g.nodes(data=True) if d["op"] == "accumulate_so2"]:
        d = g.nodes[n]
        steps = d["steps"]
        angle = g.nodes[steps]["expr"]
        if not _is_static(g.nodes[steps]):
            continue
        phase = ast.Binary(op="*", left=angle, right=ast.Name(id="position"))
        ty = join(g.nodes[steps]["ty"], CONSTANTS["position"])
        table = f"phase[{d['group']}]"
        g.remove_node(steps)
        g.add_node(table, op="phase_table", expr=phase, label=f"phase = {to_source(phase)}", dynamic=False,
                   ty=ty, folded=True, note="constant steps accumulate to w * (i - j): folded into a RoPE table")
        g.add_edge("positions", table)
        g.add_edge(table, n)
        d.update(op="rotate", phase=table, label=f"rotate {d['targets']} on {d['group']}",
                 note="accumulated constant SO(2) steps recognised as position-indexed rotation (RoPE)")
        d.pop("steps", None)
    return g


def factor_orthogonal_steps(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Orthogonal steps factor: P(j->i) = A_i A_j^T, so q and k are pre-transformed once."""
    g = g.copy()
    for n, d in g.nodes(data=True):
        if d["op"] == "accumulate_so2":
            d["kernel"] = "cumulative angles"
            d["note"] = ("SO(2) steps commute: cumulative angles A_t (float64 cumsum, O(L D)) rotate q and k "
                         "absolutely, then any fused causal kernel")
        elif d["op"] == "rotate":
            d["kernel"] = "rotary"
            d.setdefault("note", "q and k rotated by their own phases (standard RoPE form)")
        elif d["op"] == "accumulate_householder":
            d["kernel"] = "blockwise"
            d["note"] = ("Householder steps with beta = 2 are reflections (orthogonal)" if d.get("orthogonal") else
                         "beta in (0, 2): not orthogonal, no absolute factoring; UT/WY blockwise algorithm")
    return g


def constant_gate_is_alibi(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """accumulate(c) with a constant log-gate c sums to c * (i - j): a linear distance bias."""
    g = g.copy()
    for n, d in list(g.nodes(data=True)):
        if d["op"] == "gate_bias" and _is_static(d):
            slope = d["expr"]
            term = ast.Binary(op="*", left=slope, right=ast.Name(id="distance"))
            d.update(op="distance_bias", expr=term, slope=slope, linear=True,
                     ty=join(d["ty"], CONSTANTS["distance"]),
                     label=f"bias = {to_source(term)}",
                     note="a constant accumulated log-gate is a linear distance bias (ALiBi form)")
    return g


def fold_temperature_into_q(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """A per-query temperature is a scale of q_i: free inside any kernel."""
    g = g.copy()
    if "temperature" in g:
        g.nodes["temperature"]["note"] = "folded into a per-query scale of q"
        g.nodes["temperature"]["kernel"] = "q scale"
    return g


def separable_biases(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Biases f(i) + g(j) only act through g(j): one extra key channel instead of an (H, L, L) tensor."""
    g = g.copy()
    for n, d in g.nodes(data=True):
        if d["op"] == "distance_bias":
            if d.get("linear"):
                d["kernel"] = "key channel"
                d["note"] = "slope * (i - j): the key term -slope * j rides in one extra channel (no L x L tensor)"
            else:
                d["kernel"] = "table"
                d["note"] = "non-linear in the distance: a per-(head, distance) table (score_mod or mask)"
        elif d["op"] == "gate_bias":
            d["kernel"] = "key channel"
            d["note"] = "G_i - G_j with G = cumsum(log gate) in float64: the key term -G_j rides in one extra channel"
    return g


def choose_backend(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Pick the fastest backend that can run the scheme, or check a forced one."""
    g = g.copy()
    ops = {d["op"] for _, d in g.nodes(data=True)}
    kernels = {d.get("kernel") for _, d in g.nodes(data=True)}
    householder = "accumulate_householder" in ops
    table_bias = "table" in kernels
    hh_value = any(d["op"] == "accumulate_householder" and d["targets"] == "qkv" for _, d in g.nodes(data=True))
    hh_groups = sum(d["op"] == "accumulate_householder" for _, d in g.nodes(data=True))
    can = {
        "reference": True,
        "sdpa": not householder and not table_bias,
        "masked": not householder,
        "flex": not householder and opt.device != "meta",
        "blockwise": not table_bias and not hh_value and hh_groups <= 1,
    }
    why = {
        "sdpa": "it has Householder steps (not orthogonal: no pre-transform) or a bias that is not separable",
        "masked": "it has Householder steps",
        "flex": "it has Householder steps",
        "blockwise": "it has a non-linear distance bias, value transport on Householder steps, or Householder "
                     "steps in more than one channel group",
    }
    if opt.backend not in BACKENDS:
        raise CompileError(f"unknown backend '{opt.backend}'", code="E401",
                           hint="choose one of: " + ", ".join(BACKENDS))
    if opt.backend != "auto":
        if not can[opt.backend]:
            raise CompileError(
                f"backend '{opt.backend}' cannot run scheme '{g.graph['scheme']}': {why[opt.backend]}",
                code="E402", hint="use --backend auto, or one of: " + ", ".join(b for b in BACKENDS[1:] if can[b]),
            )
        if opt.backend == "flex" and opt.requires_grad and opt.device == "cpu":
            raise CompileError(
                "FlexAttention has no backward on CPU (torch 2.13), and this module needs gradients", code="E403",
                hint="use --backend masked or sdpa for CPU training, or requires_grad=False for evaluation",
            )
        backend = opt.backend
    elif householder:
        if hh_groups > 1:
            raise CompileError(
                f"scheme '{g.graph['scheme']}' has Householder steps in {hh_groups} channel groups; the blockwise "
                "kernel takes one step per token", code="E404",
                hint="use one Householder group (other groups may rotate), or --backend reference (slow)",
            )
        if hh_value:
            raise CompileError(
                f"scheme '{g.graph['scheme']}' transports values with non-orthogonal Householder steps; only the "
                "naive reference interpreter runs that", code="E404",
                hint="use qk: for PaTH steps, or --backend reference (slow, for checking)",
            )
        backend = "blockwise"
    elif table_bias:
        backend = "flex" if (not opt.requires_grad or opt.device != "cpu") else "masked"
    else:
        backend = "sdpa"
    g.graph["backend"] = backend
    if backend == "blockwise":
        for _, d in g.nodes(data=True):
            if d["op"] in ("distance_bias", "gate_bias"):
                d["kernel"] = "step log term"
                d["note"] = "enters the blockwise scan as a per-step log term: b(i, j) = sum_{s=j+1..i} log f_s"
    elif backend in ("masked", "flex", "reference"):
        for _, d in g.nodes(data=True):
            if d["op"] in ("distance_bias", "gate_bias"):
                d["note"] = "materialised as a (B, H, L, L) bias" if backend != "flex" else "score_mod on (h, i - j)"
    g.graph["backend_note"] = {
        "sdpa": "pre-transformed q/k (and v), fused causal scaled_dot_product_attention; no L x L tensor",
        "flex": "FlexAttention with a score_mod for the bias (forward; compiled)",
        "masked": "scaled_dot_product_attention with a materialised (H, L, L) bias",
        "blockwise": "PaTH UT/WY blockwise algorithm with forget/distance gates as per-step log terms",
        "reference": "naive float64 interpreter of docs/semantics.md §1 (explicit transports per (i, j))",
    }[backend]
    return g


PASSES = (
    fold_static_tables,
    constant_steps_are_rope,
    factor_orthogonal_steps,
    constant_gate_is_alibi,
    fold_temperature_into_q,
    separable_biases,
    choose_backend,
)


def optimize(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    for p in PASSES:
        g = p(g, opt)
    return g
