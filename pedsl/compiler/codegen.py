"""Codegen: a scheme's graph as a standalone, readable PyTorch module (imports torch only).

The emitted file inlines every constant (frequency tables in float64 repr, slopes,
channel pairs), names its learned sub-modules exactly like the in-process module
(``learned.sites[...]``) so ``state_dict``s are interchangeable, and carries the
scheme source and its sha256 in the docstring. Output is deterministic: the same
scheme and parameters give byte-identical files.

Expressions become code over 5-d tensors laid out ``(batch, head, position,
distance, pair|chan)``; see the kernels in :mod:`pedsl.compiler.kernels_template`.
The generated attention favours clarity: rotations and key-channel biases use
fused SDPA like the in-process module, while Householder (PaTH) steps use a
simple O(L^2 D) scan rather than the blockwise kernel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx

from pedsl import __version__
from pedsl.compiler.graph import bias_nodes, transform_nodes
from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS, READS_LENGTH
from pedsl.lang.evaluate import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec, bind_args, evaluate
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import Scheme

_ELEMENTWISE = {
    "log": "torch.log", "exp": "torch.exp", "sqrt": "torch.sqrt", "sin": "torch.sin", "cos": "torch.cos",
    "tanh": "torch.tanh", "abs": "torch.abs", "sigmoid": "torch.sigmoid", "log_sigmoid": "F.logsigmoid",
    "floor": "torch.floor", "ceil": "torch.ceil",
}


def class_name(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[_\W]+", name) if p) or "Scheme"


class _Gen:
    """Expression -> Python source over 5-d tensors, collecting constants and learned sites."""

    def __init__(self, scheme: Scheme, d_model: int | None, vocab_size: int):
        self.scheme = scheme
        self.values = {**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.consts: list[str] = []  # module-level constant lines
        self.init: list[str] = []  # __init__ lines
        self.buffers: dict[tuple, str] = {}

    def const(self, values: tuple[float, ...], axis: str, comment: str) -> str:
        name = f"C{len(self.consts)}"
        body = ", ".join(repr(float(v)) for v in values)
        self.consts.append(f"{name} = ({body},)  # {comment}" if len(values) == 1 else f"{name} = ({body})  # {comment}")
        return f"_axis({name}, {axis!r}, dev)"

    def expr(self, e: ast.Expr, site: str, pairs: int | None, chans: int | None) -> str:
        self._site, self._count, self._pairs, self._chans = site, 0, pairs, chans
        return self._e(e)

    def _static(self, e):
        try:
            return evaluate(e, StaticEnv(values=self.values, pairs=self._pairs))
        except EvalIssue as issue:
            raise CompileError(str(issue)) from None

    def _e(self, e: ast.Expr) -> str:
        from pedsl.lang.exprs import calls_in, names_in

        runtime = "n" in names_in(e) or bool(calls_in(e) & READS_LENGTH)
        v = DYNAMIC if runtime else self._static(e)
        if v is not DYNAMIC:
            if isinstance(v, Vec):
                return self.const(v.values, v.axis, to_source(e)[:60])
            if isinstance(v, (GroupSpec, list, str)) or v is None:
                raise CompileError(f"cannot generate code for {to_source(e)}")
            return repr(float(v))
        k = e.kind
        if k == "name":
            if e.id == "position":
                return "_positions(L, dev)"
            if e.id == "distance":
                return "_distances(L, dev)"
            if e.id == "n":
                return "float(L)"
            raise CompileError(f"'{e.id}' has no run-time value")
        if k == "unary":
            return f"(-{self._e(e.operand)})"
        if k == "binary":
            a, b = self._e(e.left), self._e(e.right)
            return f"torch.pow(_t({a}, dev), {b})" if e.op == "**" else f"({a} {e.op} {b})"
        if k == "call":
            return self._call(e)
        raise CompileError(f"cannot generate code for {to_source(e)}")

    def _site_key(self, kind: str) -> str:
        key = f"{self._site}__{kind}{self._count}"
        self._count += 1
        return key

    def _width(self, to) -> tuple[str, int]:
        axis = to.id if isinstance(to, ast.Name) else str(to)
        axis = {"channel": "chan"}.get(axis, axis)
        return axis, (self._pairs if axis == "pair" else self._chans if axis == "chan" else 1)

    def _int(self, v) -> int:
        return int(self._static(v)) if isinstance(v, ast.Node) else int(v)

    def _float(self, v) -> float:
        return float(self._static(v)) if isinstance(v, ast.Node) else float(v)

    def _call(self, e: ast.Call) -> str:
        f = e.func
        args = bind_args(e, FUNCTIONS[f].params)
        if f in _ELEMENTWISE:
            return f"{_ELEMENTWISE[f]}(_t({self._e(args['x'])}, dev))"
        if f in ("min", "max"):
            fn = "torch.minimum" if f == "min" else "torch.maximum"
            return f"{fn}(_t({self._e(args['a'])}, dev), _t({self._e(args['b'])}, dev))"
        if f in ("clamp", "ramp"):
            x, lo, hi = (self._e(args[n]) for n in ("x", "lo", "hi"))
            if f == "clamp":
                return f"torch.minimum(torch.maximum(_t({x}, dev), _t({lo}, dev)), _t({hi}, dev))"
            return f"(((_t({x}, dev) - {lo}) / ({hi} - {lo})).clamp(0, 1))"
        if f == "dynamic_ntk":
            base, factor, orig = (self._float(args[n]) for n in ("base", "factor", "original"))
            return f"_dynamic_ntk({base!r}, {factor!r}, {orig!r}, {self._pairs}, L, dev)"
        if f == "longrope":  # the short factors up to the original length, the long ones past it
            orig = self._float(args["original"])
            short, long = (evaluate(e, StaticEnv(values=self.values, pairs=self._pairs, n=n)) for n in (None, orig + 1))
            return (f"({self.const(long.values, 'pair', 'longrope long')} if L > {orig!r} "
                    f"else {self.const(short.values, 'pair', 'longrope short')})")
        if f == "log_length":
            return f"_log_length(L, {self._float(args['length'])!r}, dev)"
        if f == "frozen_random":
            seed = self._int(args["seed"])
            P = self._pairs
            if isinstance(args["index"], ast.Name) and args["index"].id == "token":
                key = ("token", seed, P)
                if key not in self.buffers:
                    name = f"table_{len(self.buffers)}"
                    self.buffers[key] = name
                    self.init.append(f"self.register_buffer({name!r}, _frozen_token_table({seed}, VOCAB_SIZE, {P}), "
                                     "persistent=False)")
                return f"self.{self.buffers[key]}.to(dev)[tokens.long()].view(B, 1, L, 1, {P})"
            return f"_frozen_position_table({seed}, {P}, L).to(dev).view(1, 1, L, 1, {P})"
        if f in ("embedding", "linear"):
            axis, width = self._width(args["to"])
            key = self._site_key(f)
            if f == "embedding":
                init = self._float(args["init"])
                self.init.append(f"self.learned.sites[{key!r}] = nn.Embedding(VOCAB_SIZE, HEADS * {width})")
                self.init.append(f"nn.init.normal_(self.learned.sites[{key!r}].weight, std={init!r})")
                inp = "tokens.long()"
            else:
                if self.d_model is None:
                    raise CompileError("this scheme reads the hidden state x: give d_model", code="E405",
                                       hint="pedsl compile ... --d-model N")
                rank = self._int(args["rank"])
                b0 = self._float(args["init_bias"])
                if rank > 0:
                    self.init.append(f"self.learned.sites[{key!r}] = nn.Sequential(nn.Linear(D_MODEL, {rank}, "
                                     f"bias=False), nn.Linear({rank}, HEADS * {width}))")
                    self.init.append(f"nn.init.constant_(self.learned.sites[{key!r}][1].bias, {b0!r})")
                else:
                    self.init.append(f"self.learned.sites[{key!r}] = nn.Linear(D_MODEL, HEADS * {width})")
                    self.init.append(f"nn.init.constant_(self.learned.sites[{key!r}].bias, {b0!r})")
                inp = "x"
            return f"_per_head_site(self.learned.sites[{key!r}], {inp}, B, L, HEADS, {width})"
        if f == "shortconv":
            inner = self._e(args["v"])
            key = self._site_key("shortconv")
            width = self._int(args["width"])
            feats = self.scheme.heads * (self._chans or 1)
            self.init.append(f"self.learned.sites[{key!r}] = nn.Conv1d({feats}, {feats}, {width}, groups={feats}, "
                             f"padding={width - 1}, bias=False)")
            return f"_shortconv(self.learned.sites[{key!r}], {inner})"
        if f == "normalize":
            return f"F.normalize({self._e(args['v'])}, dim=-1, eps=1e-6)"
        raise CompileError(f"{f}() cannot be generated")


def _pairs_of(channels: tuple[int, ...], layout: str) -> tuple[list[int], list[int]]:
    m = len(channels)
    if layout == "halves":
        return list(channels[: m // 2]), list(channels[m // 2 :])
    return list(channels[0::2]), list(channels[1::2])


def generate(scheme: Scheme, graph: nx.DiGraph, *, d_model: int | None = None, vocab_size: int = 256) -> str:
    """The source text of a standalone module computing the same function as the compiled scheme."""
    gen = _Gen(scheme, d_model, vocab_size)
    body: list[str] = []
    backend = graph.graph["backend"]
    fwd = body.append
    undo: list[str] = []
    for n in transform_nodes(graph):
        t = graph.nodes[n]
        ch = tuple(t["channels"])
        P = len(ch) // 2
        first, second = _pairs_of(ch, scheme.layout)
        tag = re.sub(r"\W", "_", t["group"]).upper()
        gen.consts.append(f"{tag}_FIRST = {first}  # group '{t['group']}': pair k rotates channels FIRST[k], SECOND[k]")
        gen.consts.append(f"{tag}_SECOND = {second}")
        if t["op"] == "rotate":
            expr = graph.nodes[t["phase"]]["expr"]
            code = gen.expr(expr, t["phase"], P, len(ch))
            fwd(f"# {t['label']}: phase = {to_source(expr)}  ({t.get('note', '')})")
            fwd(f"phase = torch.remainder(({code}) * torch.ones(1, 1, L, 1, {P}, dtype=F64, device=dev), TWO_PI)")
            fwd("phase = phase[0, 0, :, 0, :]  # (L, P)")
        elif t["op"] == "accumulate_so2":
            expr = graph.nodes[t["steps"]]["expr"]
            code = gen.expr(expr, t["steps"], P, len(ch))
            fwd(f"# {t['label']}: step angle = {to_source(expr)}  ({t.get('note', '')})")
            fwd(f"steps = ({code}) * torch.ones(1, 1, L, 1, {P}, dtype=F64, device=dev)")
            fwd("phase = _cumulative_angles(steps[:, :, :, 0, :])  # (B|1, H|1, L, P)")
        else:
            wexpr, bexpr = graph.nodes[t["w"]]["expr"], graph.nodes[t["beta"]]["expr"]
            wcode = gen.expr(wexpr, t["w"], P, len(ch))
            bcode = gen.expr(bexpr, t["beta"], P, len(ch))
            fwd(f"# {t['label']}: w = {to_source(wexpr)}, beta = {to_source(bexpr)}")
            fwd(f"w_g = (({wcode}) * torch.ones(B, HEADS, L, 1, {len(ch)}, device=dev, dtype=q.dtype))[:, :, :, 0, :]")
            fwd(f"w = torch.zeros(B, HEADS, L, D, dtype=q.dtype, device=dev); w[..., {list(ch)}] = w_g.to(q.dtype)")
            fwd(f"beta = (({bcode}) * torch.ones(B, HEADS, L, 1, 1, device=dev, dtype=q.dtype))[:, :, :, 0, 0]")
            fwd("beta = beta.to(q.dtype)")
            continue
        if t.get("scale", 1.0) != 1:
            fwd(f"phase_scale = {t['scale']!r}  # q and k of the group scaled (HF's attention factor)")
            fwd("cos, sin = (phase_scale * torch.cos(phase)).to(q.dtype), (phase_scale * torch.sin(phase)).to(q.dtype)")
        else:
            fwd("cos, sin = torch.cos(phase).to(q.dtype), torch.sin(phase).to(q.dtype)")
        fwd(f"q = _rotate(q, cos, sin, {tag}_FIRST, {tag}_SECOND)")
        fwd(f"k = _rotate(k, cos, sin, {tag}_FIRST, {tag}_SECOND)")
        if t["targets"] == "qkv":
            fwd(f"v = _rotate(v, cos, sin, {tag}_FIRST, {tag}_SECOND)  # value transport U = T")
            fwd(f"undo_{tag.lower()} = (cos, sin)")
            undo.append(f"o = _rotate(o, undo_{tag.lower()}[0], -undo_{tag.lower()}[1], {tag}_FIRST, {tag}_SECOND)"
                        "  # R(A_i)^T")
    # temperature
    if "temperature" in graph:
        expr = graph.nodes["temperature"]["expr"]
        code = gen.expr(expr, "temperature", None, None)
        fwd(f"# temperature tau = {to_source(expr)} (a scale of q)")
        fwd(f"q_scale = (({code}) * torch.ones(1, 1, L, 1, 1, dtype=F64, device=dev))[:, :, :, 0, 0]")
    else:
        fwd("q_scale = None")
    # biases
    key_terms, tables = [], []
    for n in bias_nodes(graph):
        b = graph.nodes[n]
        if b["op"] == "distance_bias":
            if b.get("linear") and backend != "masked":
                code = gen.expr(b["slope"], n, None, None)
                fwd(f"# {b['label']}: slope * (i - j) -> key term g(j) = -slope * j")
                fwd(f"slope = (({code}) * torch.ones(1, HEADS, 1, 1, 1, dtype=F64, device=dev))[0, :, 0, 0, 0]")
                fwd(f"g_{len(key_terms)} = -slope[None, :, None] * torch.arange(L, dtype=F64, device=dev)[None, None]")
                key_terms.append(f"g_{len(key_terms)}")
            else:
                code = gen.expr(b["expr"], n, None, None)
                fwd(f"# {b['label']}: a (head, distance) table gathered at i - j")
                fwd(f"tab = (({code}) * torch.ones(1, HEADS, 1, L, 1, dtype=F64, device=dev))[0, :, 0, :, 0]")
                fwd("i = torch.arange(L, device=dev)")
                fwd(f"bias_{len(tables)} = tab[:, (i[:, None] - i[None, :]).clamp(min=0)][None]")
                tables.append(f"bias_{len(tables)}")
        else:
            code = gen.expr(b["expr"], n, None, None)
            fwd(f"# {b['label']}: G = cumsum(log gate) in float64, b(i, j) = G_i - G_j -> g(j) = -G_j")
            fwd(f"lg = (({code}) * torch.ones(1, HEADS, L, 1, 1, dtype=F64, device=dev))[:, :, :, 0, 0]")
            fwd(f"g_{len(key_terms)} = -torch.cumsum(lg.to(F64), dim=-1)")
            if backend == "masked":
                fwd(f"bias_{len(tables)} = (-g_{len(key_terms)})[..., :, None] + g_{len(key_terms)}[..., None, :]")
                tables.append(f"bias_{len(tables)}")
            key_terms.append(f"g_{len(key_terms)}")
    hh = any(graph.nodes[n]["op"] == "accumulate_householder" for n in transform_nodes(graph))
    if hh:
        fwd("scores = _householder_scores(q, k, w, beta)")
        if key_terms:
            fwd("G = " + " + ".join(f"(-{g})" for g in key_terms) + "  # G_t, so b(i, j) = G_i - G_j")
            fwd("bias = G[..., :, None] - G[..., None, :]")
        else:
            fwd("bias = None")
        fwd("o = _softmax_attention(scores, v, bias, q_scale)")
    elif tables:
        fwd("bias = " + " + ".join(tables))
        fwd("o = _softmax_attention(q @ k.transpose(-1, -2), v, bias, q_scale)")
    else:
        fwd("key_term = " + (" + ".join(key_terms) if key_terms else "None"))
        fwd("o = _attention(q, k, v, key_term, q_scale)")
    body.extend(undo)
    body.append("return o")

    kernels = (Path(__file__).parent / "kernels_template.py").read_text(encoding="utf-8")
    kernels = kernels[kernels.index("\n# ----") + 1 :]
    cname = class_name(scheme.name)
    src_lines = "\n".join("    " + line if line else "" for line in scheme.source.rstrip().splitlines())
    header = f'''"""{scheme.name}: {scheme.doc or "a positional-encoding scheme"}

Generated by pedsl {__version__} from {Path(scheme.file).name if scheme.file else "<text>"}; do not edit:
change the scheme and run `pedsl compile` again.

    scheme        {scheme.name}  (extends: {", ".join(scheme.bases) or "-"})
    sha256        {scheme.source_hash}
    parameters    {json.dumps(scheme.params, sort_keys=True)}
    heads         {scheme.heads}, head_dim {scheme.head_dim}, layout {scheme.layout}
    compiled for  backend {backend}: {graph.graph.get("backend_note", "")}

Usage: ``{cname}()(q, k, v, x=x, tokens=tokens)`` with q, k, v of shape (B, H, L, D).

Scheme source:

{src_lines}
"""
'''
    init_lines = ["super().__init__()", "self.learned = nn.Module()", "self.learned.sites = nn.ModuleDict()"]
    init_lines += gen.init
    needs_x = scheme.needs_x
    needs_tokens = scheme.needs_tokens
    checks = [
        "B, H, L, D = q.shape",
        "if (H, D) != (HEADS, HEAD_DIM) or k.shape != q.shape or v.shape != q.shape:",
        "    raise ValueError(f'expected q, k, v of shape (B, {HEADS}, L, {HEAD_DIM}), got {tuple(q.shape)}')",
    ]
    if needs_x:
        checks += ["if x is None:", f"    raise ValueError('{scheme.name} reads the hidden state: pass x=(B, L, D_MODEL)')"]
    if needs_tokens:
        checks += ["if tokens is None:", f"    raise ValueError('{scheme.name} reads the tokens: pass tokens=(B, L)')"]
    checks.append("dev = q.device")
    ind = "        "
    out = [
        header,
        "from __future__ import annotations",
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "",
        f"HEADS = {scheme.heads}",
        f"HEAD_DIM = {scheme.head_dim}",
        f"D_MODEL = {d_model!r}",
        f"VOCAB_SIZE = {vocab_size}",
        "",
        *gen.consts,
        "",
        "",
        kernels.rstrip(),
        "",
        "",
        f"class {cname}(nn.Module):",
        f'    """{scheme.doc or scheme.name} (generated by pedsl)."""',
        "",
        "    def __init__(self) -> None:",
        *[ind + line for line in init_lines],
        "",
        "    def forward(self, q, k, v, *, x=None, tokens=None):",
        *[ind + line for line in checks + body],
        "",
        "",
        f"Module = {cname}",
        "",
    ]
    return "\n".join(out)
