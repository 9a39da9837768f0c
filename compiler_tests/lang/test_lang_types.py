"""The typed IR (docs/semantics.md §1a): the checker stores every transport, bias and temperature
expression's type - its kind (an enum), axes and the run-time inputs it reads, whose highest member
is its dependence class - on the resolved scheme, and the graph, the passes, the facts and the
run-time walk decide by it."""

from __future__ import annotations

import pytest

import pedsl
from lang_helpers import SCHEMES
from pedsl.compiler.graph import lower
from pedsl.compiler.passes import Options, optimize
from pedsl.diffing.facts import scheme_facts
from pedsl.lang.scheme import Scheme
from pedsl.lang.typed import type_of
from pedsl.lang.types import Dep, Kind

S, P, L, T, D, W = Dep.STATIC, Dep.POSITION, Dep.LENGTH, Dep.TOKEN, Dep.DATA, Dep.LEARNED

# (name, scheme body, the IR field holding the expression, its axes, what it reads)
CASES = [
    ("static rope", "qk: rotate(geometric(10000) * position)", "transports[0].phase_ty", {"pos", "pair"}, {P}),
    ("yarn", "qk: rotate(yarn(10000, 8, 128) * position)", "transports[0].phase_ty", {"pos", "pair"}, {P}),
    ("dynamic_ntk", "qk: rotate(dynamic_ntk(10000, 8, 128) * position)", "transports[0].phase_ty",
     {"pos", "pair"}, {P, L}),
    ("longrope", f"qk: rotate(longrope(10000, {[1.0] * 16}, {[2.0] * 16}, 128) * position)",
     "transports[0].phase_ty", {"pos", "pair"}, {P, L}),
    ("length n", "qk: rotate(geometric(n) * position)", "transports[0].phase_ty", {"pos", "pair"}, {P, L}),
    ("constant steps", "qk: accumulate(rotation(geometric(10000)))", "transports[0].angle_ty", {"pair"}, set()),
    ("position steps", "qk: accumulate(rotation(frozen_random(position)))", "transports[0].angle_ty",
     {"pos", "pair"}, {P}),
    ("token steps", "qk: accumulate(rotation(frozen_random(token)))", "transports[0].angle_ty", {"pos", "pair"}, {T}),
    ("learned embedding", "qk: accumulate(rotation(embedding(token, to = pair)))", "transports[0].angle_ty",
     {"pos", "head", "pair"}, {T, W}),
    ("learned, not data", "qk: accumulate(rotation(shortconv(frozen_random(position))))", "transports[0].angle_ty",
     {"pos", "pair"}, {P, W}),
    ("linear(x) steps", "qk: accumulate(rotation(linear(x)))", "transports[0].angle_ty", {"pos", "head", "pair"},
     {D, W}),
    ("householder w", "qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2))",
     "transports[0].w_ty", {"pos", "head", "chan"}, {D, W}),
    ("householder beta", "qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2))",
     "transports[0].beta_ty", set(), set()),
    ("alibi", "bias = -slopes(heads) * distance", "biases[0].term_ty", {"head", "dist"}, {P}),
    ("linear(x) gate", "bias = accumulate(log_sigmoid(linear(x, to = head)))", "biases[0].log_gate_ty",
     {"pos", "head"}, {D, W}),
    ("token gate", "bias = accumulate(log_sigmoid(embedding(token, to = head)))", "biases[0].log_gate_ty",
     {"pos", "head"}, {T, W}),
    ("constant gate", "bias = accumulate(-0.1)", "biases[0].log_gate_ty", set(), set()),
    ("log_length", "temperature = log_length(128)", "temperature_ty", {"pos"}, {P}),
    ("constant temperature", "temperature = yarn_mscale(8)", "temperature_ty", set(), set()),
]


def _field(s: Scheme, path: str):
    obj = s
    for part in path.split("."):
        name, _, idx = part.partition("[")
        obj = getattr(obj, name)
        if idx:
            obj = obj[int(idx[:-1])]
    return obj


def _scheme(body: str) -> Scheme:
    return pedsl.load(f"scheme s {{ {body} }}")


@pytest.mark.parametrize("name,body,path,axes,reads", CASES, ids=[c[0] for c in CASES])
def test_stored_kind_axes_and_dependence(name, body, path, axes, reads):
    s = _scheme(body)
    ty = _field(s, path)
    assert ty.kind is Kind.NUM
    assert ty.axes == axes
    assert ty.reads == reads
    assert ty.dep is max(reads, default=Dep.STATIC)
    assert all(isinstance(d, Dep) for d in ty.reads)
    hash(ty)  # hashable, float-free: usable as a key
    assert Scheme.model_validate_json(s.model_dump_json()) == s  # the types survive `show --json`


def _value(stmt: str):
    return pedsl.parse(f"scheme s {{ {stmt} }}").schemes[0].body[0].value


def test_dependence_classes_are_ordered():
    assert list(Dep) == [S, P, L, T, D, W]
    assert S < P < L < T < D < W and max(T, W, P) is W and sorted([W, S, L]) == [S, L, W]


def test_whole_expressions_have_enum_kinds():
    s = _scheme("qk: accumulate(rotation(frozen_random(token)))\n bias = accumulate(log_sigmoid(linear(x, to = head)))")
    env = {**s.params, "heads": s.heads, "head_dim": s.head_dim}
    transport = _value("qk: rotate(dynamic_ntk(10000, 8, 128) * position)")
    ty = type_of(transport, env)
    assert ty.kind is Kind.TRANSPORT and ty.kind == "transport" and ty.reads == {P, L} and ty.runtime
    gate = _value("bias = accumulate(-0.1)")
    assert type_of(gate, env).kind is Kind.BIAS and type_of(gate, env).dep is S
    assert s.transports[0].data and not s.transports[0].learned
    assert s.biases[0].data and s.needs_x and s.needs_tokens


# (scheme body, graph node, the input nodes feeding it, the node's op after the passes)
GRAPH = [
    ("qk: rotate(geometric(10000) * position)", "phase[all]", {"positions"}, "phase_table"),
    ("qk: rotate(dynamic_ntk(10000, 8, 128) * position)", "phase[all]", {"positions", "length n"}, "phase_table"),
    ("qk: accumulate(rotation(geometric(10000)))", "phase[all]", {"positions"}, "phase_table"),
    ("qk: accumulate(rotation(frozen_random(token)))", "steps[all]", {"tokens"}, "step_angles"),
    ("qk: accumulate(rotation(embedding(token, to = pair)))", "steps[all]", {"tokens", "learned"}, "step_angles"),
    ("bias = accumulate(log_sigmoid(linear(x, to = head)))", "bias[0]", {"x", "learned"}, "gate_bias"),
    ("bias = accumulate(-0.1)", "bias[0]", set(), "distance_bias"),
    ("temperature = log_length(128)", "temperature", {"positions"}, "temperature"),
]


@pytest.mark.parametrize("body,node,sources,op", GRAPH)
def test_graph_edges_and_pass_decisions_follow_the_types(body, node, sources, op):
    g = optimize(lower(_scheme(body)), Options())
    inputs_in = {p for p in g.predecessors(node) if g.nodes[p]["op"] == "input"}
    assert inputs_in == sources
    assert g.nodes[node]["op"] == op
    if op == "phase_table":
        assert g.nodes[node]["dynamic"] == g.nodes[node]["ty"].runtime == ("length n" in sources)


def test_facts_read_the_stored_types():
    f = scheme_facts(pedsl.load(SCHEMES / "path.pe"))
    hh = next(g for g in f.groups if g.kind == "accumulate_householder")
    assert hh.data and hh.learned
    f = scheme_facts(_scheme("qk: accumulate(rotation(frozen_random(token)))"))
    assert f.groups[0].data and not f.groups[0].learned


def test_what_builtins_read_comes_from_their_records():
    from pedsl.lang.builtin_defs.record import own_reads
    from pedsl.lang.builtins import FUNCTIONS

    def reading(dep):
        return {n for n, b in FUNCTIONS.items() if dep in own_reads(b)}

    assert reading(W) == {"embedding", "linear", "shortconv", "learned"}
    assert reading(L) == {"dynamic_ntk", "longrope"}
    assert reading(P) == {"log_length"}
    assert reading(T) == reading(D) == set()  # only the names token and x read those


def test_graph_json_shows_each_expressions_type():
    import json

    from compiler_helpers import run_cli

    code, out, _ = run_cli("graph", str(SCHEMES / "dynamic_ntk.pe"), "--format", "json")
    assert code == 0
    node = next(n for n in json.loads(out)["nodes"] if n["id"] == "phase[all]")
    assert node["ty"] == {"kind": "num", "axes": ["pos", "pair"], "reads": ["position", "length"], "dep": "length"}
