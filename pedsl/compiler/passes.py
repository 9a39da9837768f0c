"""Graph passes: small pure functions ``(graph, options) -> graph``, run in the order of :data:`PASSES`.

Each pass copies the graph and rewrites what its identity allows (docs/semantics.md
§5): the node's ``kernel`` is the decision, its ``note`` the reason. The last pass,
:func:`record_plan`, records every decision in the typed :class:`~pedsl.compiler.plan.Plan`
(``graph.graph["plan"]``) that the module, codegen, the reference backend and ``pedsl graph``
read; nothing downstream reads the node attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import networkx as nx

from pedsl.compiler import plan as P
from pedsl.compiler.graph import bias_nodes, transform_nodes
from pedsl.compiler.kernel_support import kernel_decl, plan_features, static_kernels
from pedsl.errors import CompileError
from pedsl.formulas import xpos_decays
from pedsl.lang import ast
from pedsl.lang.builtins import CONSTANTS
from pedsl.lang.exprs import to_source
from pedsl.lang.statements import CARRIED
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


def _decide(g: nx.DiGraph, ops: tuple[str, ...], decide: Callable[[dict], tuple[str, str]]) -> nx.DiGraph:
    """A copy of g where every node whose op is in ``ops`` gets ``(kernel, note) = decide(attrs)``."""
    g = g.copy()
    for _, d in g.nodes(data=True):
        if d["op"] in ops:
            d["kernel"], d["note"] = decide(d)
    return g


_STATIC_NOTE = "static table: folded in float64, cached as cos/sin buffers, grown for longer inputs"


def fold_static_tables(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Frequency/phase tables that depend only on positions are constants: compute once in float64."""
    return _decide(g, ("phase_table",), lambda d: (
        (P.PER_TOKEN, "per head: the phases are evaluated (float64) at every call, no cached table")
        if d.get("per_token") else
        (P.LEARNED_TABLE, "reads learned values: evaluated (float64) at every call, never cached")
        if d["ty"].learned else
        (P.RUNTIME_LENGTH, "depends on the run-time length n: recomputed (float64) for each new length")
        if d.get("dynamic") else (P.STATIC, _STATIC_NOTE)))


def constant_steps_are_rope(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """accumulate(rotation(w)) with constant w rotates pair k by w_k times the tokens from j to i: RoPE at
    consecutive positions. The node keeps its step (``folded_step``) for calls whose positions are not the
    tokens' indices (gaps, padding, a cache), which sum the steps over the tokens (docs/semantics.md §2b)."""
    g = g.copy()
    for n in [n for n, d in g.nodes(data=True) if d["op"] == "accumulate_so2"]:
        d = g.nodes[n]
        steps = d["steps"]
        angle = g.nodes[steps]["expr"]
        if not _is_static(g.nodes[steps]):
            continue
        phase = ast.Binary(op="*", left=angle, right=ast.Name(id="position"))
        ty = join(g.nodes[steps]["ty"], CONSTANTS["position"])
        table = P.site_name("phase", d["group"])
        g.remove_node(steps)
        g.add_node(table, op="phase_table", expr=phase, label=f"phase = {to_source(phase)}", dynamic=False,
                   ty=ty, kernel=P.STATIC, note="constant steps accumulate to w times the tokens from j to i: folded into a RoPE table")
        g.add_edge("positions", table)
        g.add_edge(table, n)
        d.update(op="rotate", phase=table, label=f"rotate {d['targets']} on {d['group']}", folded_step=(steps, angle),
                 note="accumulated constant SO(2) steps recognised as RoPE at consecutive positions (calls with "
                      "positions, padding or a cache sum the steps over the tokens)")
        d.pop("steps", None)
    return g


def factor_orthogonal_steps(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Orthogonal steps factor: P(j->i) = A_i A_j^T, so q and k are pre-transformed once."""
    def kernel(d: dict) -> tuple[str, str]:
        if d["op"] == "accumulate_so2":
            return "cumulative angles", ("SO(2) steps commute: cumulative angles A_t (float64 cumsum, O(L D)) "
                                         "rotate q and k absolutely, then any fused causal kernel")
        if d["op"] == "rotate":
            return "rotary", d.get("note", "q and k rotated by their own phases (standard RoPE form)")
        if d["op"] == "dense_rotate":
            return "matrix exponential", ("q and k rotated by their own R(p) = P^T expm(sum_a p_a A_a) P (block-diagonal "
                                          "matrix exponentials per token, batched), then any causal kernel")
        return "blockwise", ("Householder steps with beta = 2 are reflections (orthogonal)" if d.get("orthogonal")
                             else "beta in (0, 2): not orthogonal, no absolute factoring; UT/WY blockwise algorithm")

    return _decide(g, ("accumulate_so2", "rotate", "accumulate_householder", "dense_rotate"), kernel)


def constant_gate_is_alibi(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """accumulate(c) with a constant log-gate c sums to c * (i - j): a linear distance bias."""
    g = g.copy()
    for n, d in list(g.nodes(data=True)):
        if d["op"] == "gate_bias" and _is_static(d):
            slope = d["expr"]
            term = ast.Binary(op="*", left=slope, right=ast.Name(id="distance"))
            d.update(op="distance_bias", expr=term, slope=slope, linear=True, counts=P.TOKENS,
                     ty=join(d["ty"], CONSTANTS["distance"]),
                     label=f"bias = {to_source(term)}",
                     note="a constant accumulated log-gate is a linear distance bias (ALiBi form)")
    return g


def fold_temperature_into_q(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """A per-query temperature is a scale of q_i: free inside any kernel."""
    g = _decide(g, ("temperature",), lambda d: ("q scale", "folded into a per-query scale of q"))
    if "temperature" in g:  # one that reads nothing but the position is a table over positions (decoding reads rows)
        d = g.nodes["temperature"]
        d["table"] = P.POSITION_TABLE if d["ty"].dep <= Dep.POSITION else P.RUNTIME
    return g


def separable_biases(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """Biases f(i) + g(j) only act through g(j): one extra key channel instead of an (H, L, L) tensor."""
    def carry(d: dict) -> tuple[str, str]:
        if d["op"] == "gate_bias":
            return P.KEY_CHANNEL, "G_i - G_j with G = cumsum(log gate) in float64: the key term -G_j rides in one " \
                                  "extra channel"
        if d.get("axes"):
            return "table", (f"over the per-axis distances of {', '.join(d['axes'])}: evaluated per pair of tokens "
                             "(score_mod or mask), in blocks of queries on the general path")
        if d.get("linear"):
            return P.KEY_CHANNEL, "slope * (i - j): the key term -slope * j rides in one extra channel (no L x L tensor)"
        return "table", "non-linear in the distance: a per-(head, distance) table (score_mod or mask)"

    return _decide(g, ("distance_bias", "gate_bias"), carry)


def _carry_biases(g: nx.DiGraph, backend: str, table_bias: bool) -> nx.DiGraph:
    """How each bias reaches the chosen backend (the plan's ``carried``, with the reason)."""
    carrier = {"blockwise": (P.STEP_LOG_TERM, "enters the blockwise scan as a per-step log term: "
                                              "b(i, j) = sum_{s=j+1..i} log f_s"),
               "masked": (P.MATERIALISED, "materialised as a (B, H, L, L) bias"),
               "reference": (P.MATERIALISED, "materialised as a (B, H, L, L) bias"),
               "flex": (P.SCORE_MOD, "score_mod on (h, i - j)")}.get(backend)
    if carrier is not None:
        g = _decide(g, ("distance_bias", "gate_bias"), lambda d: carrier)
    elif backend == "sdpa" and table_bias:  # every bias through the general path's blocks of queries
        g = _decide(g, ("distance_bias", "gate_bias"), _query_blocks)
    return g


def _query_blocks(d: dict) -> tuple[str, str]:
    """A bias on the general path's blocks of queries (the sdpa backend with a table bias), and how."""
    if d.get("kernel") != "table":
        return P.QUERY_BLOCKS, "its float64 coordinate differenced per block of queries (with the table biases)"
    if d.get("axes"):
        return P.QUERY_BLOCKS, ("evaluated per block of queries at the per-axis distances of its (query, key) "
                                "pairs: no (B, H, L, L) tensor")
    if "pos" in d["ty"].axes:
        return P.QUERY_BLOCKS, ("a (head, query, distance) table evaluated per block of queries at their positions "
                                "(it reads query_position): no (B, H, L, L) tensor")
    return P.QUERY_BLOCKS, ("a (head, distance) table computed once per call (O(H L)), gathered per block of "
                            "queries: no (B, H, L, L) tensor")


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
        "sdpa": not householder,  # a distance table: gathered per block of queries (general path)
        "masked": not householder,
        "flex": not householder and opt.device != "meta",
        "blockwise": not table_bias and not hh_value and hh_groups <= 1,
    }
    why = {
        "sdpa": "it has Householder steps (not orthogonal: no pre-transform)",
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
        missing = _flex_refusal(g, opt, table_bias) if opt.backend == "flex" else ""
        if missing:
            raise CompileError(
                f"FlexAttention cannot lower scheme '{g.graph['scheme']}': no score_mod or mask_mod computes its "
                f"{missing} (pedsl.compiler.flex_lowering)", code="E406",
                hint="use --backend auto (the general path computes it), or drop that statement from the scheme")
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
    elif _flex_engine(g, opt, table_bias):
        backend = "flex"
    else:
        backend = "sdpa"
    g.graph["backend"] = backend
    g = _carry_biases(g, backend, table_bias)
    g.graph["backend_note"] = _backend_note(g, backend, table_bias)
    return g


def _flex_plan(g: nx.DiGraph, opt: Options, table_bias: bool) -> P.Plan:
    """The plan the graph would record with the flex backend (what the capability registry is asked about)."""
    trial = _carry_biases(g, "flex", table_bias)
    trial.graph.update(backend="flex", backend_note="")
    return record_plan(trial, opt).graph["plan"]


def _flex_refusal(g: nx.DiGraph, opt: Options, table_bias: bool) -> str:
    """The features of the scheme the flex lowering does not declare, in words ("" where it lowers them all)."""
    missing = plan_features(_flex_plan(g, opt, table_bias)) - kernel_decl("flex").takes
    return ", ".join(sorted(missing))


def _flex_engine(g: nx.DiGraph, opt: Options, table_bias: bool) -> bool:
    """Whether the automatic choice is FlexAttention: on CUDA, for a plan with something beyond what causal
    SDPA computes (a bias, a soft cap, a window or chunk, a mask, a sink) that the flex lowering declares; on
    another device, or on CPU without gradients, for a bias over distance tables. The device-side engine
    for such plans (the general path's blocks of queries would materialise the scores per block)."""
    if opt.device == "meta" or not (opt.device == "cuda" or table_bias) or (opt.requires_grad and opt.device == "cpu"):
        return False
    plan = _flex_plan(g, opt, table_bias)
    beyond = plan_features(plan) - kernel_decl("causal-sdpa").takes
    return "flex" in plan.kernels and bool(beyond)


def _backend_note(g: nx.DiGraph, backend: str, table_bias: bool) -> str:
    """What the chosen backend does with the scheme, in words (the general path's reason where a statement
    sends every call there)."""
    note = {
        "sdpa": "pre-transformed q/k (and v), fused causal scaled_dot_product_attention; no L x L tensor" + (
            " (distance tables: SDPA per block of queries, the table gathered)" if table_bias else ""),
        "flex": ("FlexAttention (compiled): biases and soft cap in its score_mod, masks, documents, padding, "
                 "windows and chunks in its mask_mod and block mask, a sink as one more key; cached calls and "
                 "CPU calls with gradients run the general path"),
        "masked": "scaled_dot_product_attention with a materialised (H, L, L) bias",
        "blockwise": "PaTH UT/WY blockwise algorithm with forget/distance gates as per-step log terms",
        "reference": "naive float64 interpreter of docs/semantics.md §1 (explicit transports per (i, j))",
    }[backend]
    normalizer = _carried(g)["normalize"]
    if normalizer in (P.STICK_BREAKING, P.SIGMOID) and backend != "reference":
        note = (f"{normalizer} weights: every call runs the general path's blocks of explicit "
                "scores (memory O(L x block)); " + backend + " names its bias carrier")
    if normalizer == P.DIFFERENTIAL and backend != "reference":
        note = ("differential attention: the general path's blocks of queries, each value widened by its pair "
                "partner's, then the two heads' outputs combined by the learned lambda; " + backend +
                " names its bias carrier")
    if normalizer == P.SOFTMAX1 and backend != "reference":
        note = ("softmax plus one: the general path, with a logit-0 column as a sink's; "
                + backend + " names its bias carrier")
    if g.graph.get("contextual") is not None and backend != "reference":
        note = ("CoPE: every call runs the general path's blocks of explicit scores (gates, "
                "their suffix sums and the interpolated embedding per block of queries, memory "
                "O(L x block)); " + backend + " names its bias carrier")
    if g.graph.get("relative") is not None and backend != "reference":
        note = ("content-position terms: every call runs the general path's blocks of queries, q (and k) times "
                "the position table once per block, gathered at each pair's distance (memory O(L x block)); "
                + backend + " names its bias carrier")
    if g.graph.get("remap") is not None and backend != "reference":
        note = ("remapped positions: every call runs the general path's blocks of queries, one "
                "rotated score block per regime and a select by distance (memory O(L x block)); "
                + backend + " names its bias carrier")
    return note


_KINDS = {"rotate": P.ROPE, "accumulate_so2": P.SO2, "accumulate_householder": P.HOUSEHOLDER, "dense_rotate": P.DENSE}


def _xpos_fields(d: dict) -> dict:
    """The plan's xPos fields of a transform node: gamma and the decay of each of its pairs."""
    if not d.get("xpos_decay"):
        return {}
    gamma, zeta = d["xpos_decay"]
    return {"xpos_gamma": float(gamma), "xpos_zeta": xpos_decays(zeta, len(d["channels"]) // 2)}


def record_plan(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    """The decisions of the passes as a typed :class:`~pedsl.compiler.plan.Plan` in ``graph.graph["plan"]``."""
    g = g.copy()
    transports = []
    for n in transform_nodes(g):
        d = g.nodes[n]
        roles = {"rotate": ("phase",), "accumulate_so2": ("steps",), "accumulate_householder": ("w", "beta"),
                 "dense_rotate": ()}[d["op"]]
        sites = tuple(P.Site(d[r], r, g.nodes[d[r]]["expr"], d["group"]) for r in roles)
        table = P.PER_TOKEN if d["op"] != "rotate" else g.nodes[d["phase"]]["kernel"]
        why = "; ".join(x for x in (g.nodes[d["phase"]].get("note") if d["op"] == "rotate" else None, d.get("note")) if x)
        folded = d.get("folded_step")
        step = None if folded is None else P.Site(folded[0], "steps", folded[1], d["group"])
        transports.append(P.TransportStep(
            group=d["group"], index=d["index"], kind=_KINDS[d["op"]], channels=tuple(int(c) for c in d["channels"]),
            targets=d["targets"], table=table, kernel=d["kernel"], sites=sites, scale=float(d.get("scale", 1.0)),
            orthogonal=bool(d.get("orthogonal")), why=why, **_xpos_fields(d), pair_axes=g.graph.get("pair_axes", {}).get(d["group"], ()),
            step=step, dense=d.get("dense")))
    biases = []
    for n in bias_nodes(g):
        d = g.nodes[n]
        kind = (P.GATE_BIAS if d["op"] == "gate_bias" else P.AXIS_BIAS if d.get("axes") else P.LINEAR_BIAS
                if d.get("slope") is not None else P.TABLE_BIAS)
        biases.append(P.BiasTerm(index=d["index"], kind=kind, site=P.Site(n, "bias", d["expr"]),
                                 carried=d["kernel"], slope=d.get("slope") if kind == P.LINEAR_BIAS else None,
                                 counts=d.get("counts", P.POSITIONS), why=d.get("note", ""),
                                 query=kind == P.TABLE_BIAS and "pos" in d["ty"].axes, axes=tuple(d.get("axes", ()))))
    tau = None
    if "temperature" in g:
        d = g.nodes["temperature"]
        tau = P.Temperature(P.Site("temperature", "temperature", d["expr"]), d["table"], d["kernel"], d.get("note", ""))
    backend = g.graph["backend"]
    g.graph["plan"] = P.Plan(
        scheme=g.graph["scheme"], layout=g.graph["layout"], heads=g.graph["heads"], head_dim=g.graph["head_dim"],
        transports=tuple(transports), biases=tuple(biases), temperature=tau, backend=backend,
        backend_why=g.graph["backend_note"],
        half_via_general=backend not in ("blockwise", "flex") and any(b.coordinate for b in biases), axes=g.graph.get("axes", ()),
        contextual=g.graph.get("contextual"), remap=g.graph.get("remap"), relative=g.graph.get("relative"),
        **P.carried_fields(_carried(g)))
    g.graph["plan"] = replace(g.graph["plan"], kernels=static_kernels(g.graph["plan"]))
    return g


def _carried(g: nx.DiGraph) -> dict[str, Any]:
    """The statements' carried values of the graph's scheme, every one (the declared default where a graph was
    built without it)."""
    given = g.graph.get("carried", {})
    return {c.name: given.get(c.name, c.default) for c in CARRIED}


PASSES = (
    fold_static_tables,
    constant_steps_are_rope,
    factor_orthogonal_steps,
    constant_gate_is_alibi,
    fold_temperature_into_q,
    separable_biases,
    choose_backend,
    record_plan,
)


def optimize(g: nx.DiGraph, opt: Options) -> nx.DiGraph:
    for p in PASSES:
        g = p(g, opt)
    return g
