"""Codegen: a scheme's graph as a standalone, readable PyTorch module (imports torch only).

The emitted file inlines every constant (frequency tables in float64 repr, slopes,
channel pairs), names its learned sub-modules exactly like the in-process module
(``learned.sites[...]``) so ``state_dict``s are interchangeable, and carries the
scheme's sha256 in its docstring and its source in ``SCHEME_SOURCE``. Output is
deterministic: the same scheme and parameters give byte-identical files.

Nothing from the scheme becomes code: text reaches the file only as ``repr`` literals
or escaped one-line comments, identifiers come from one :class:`~pedsl.compiler.pysafe.Names`
per module, and the result is parsed before it is returned (see :mod:`pedsl.compiler.pysafe`).

Expressions become code over 5-d tensors laid out ``(batch, head, position,
distance, pair|chan)``; see the kernels in :mod:`pedsl.compiler.kernels_template`.
The generated attention favours clarity: rotations and key-channel biases use
fused SDPA like the in-process module, while Householder (PaTH) steps use a
simple O(L^2 D) scan rather than the blockwise kernel.
"""

from __future__ import annotations

import ast as pyast
import json
import re
from pathlib import Path

import networkx as nx

from pedsl import __version__
from pedsl.compiler.graph import bias_nodes, transform_nodes
from pedsl.compiler.pysafe import Names, comment, literal, module_file_stem, module_names, text_block
from pedsl.errors import CompileError
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.evaluate import DYNAMIC, EvalIssue, GroupSpec, StaticEnv, Vec, bind_args, evaluate
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import Scheme

_ELEMENTWISE = {
    "log": "torch.log", "exp": "torch.exp", "sqrt": "torch.sqrt", "sin": "torch.sin", "cos": "torch.cos",
    "tanh": "torch.tanh", "abs": "torch.abs", "sigmoid": "torch.sigmoid", "log_sigmoid": "F.logsigmoid",
}


def class_name(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[_\W]+", name) if p) or "Scheme"


class _Gen:
    """Expression -> Python source over 5-d tensors, collecting constants and learned sites."""

    def __init__(self, scheme: Scheme, d_model: int | None, vocab_size: int, names: Names):
        self.scheme = scheme
        self.names = names
        self.values = {**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.consts: list[str] = []  # module-level constant lines
        self.init: list[str] = []  # __init__ lines
        self.buffers: dict[tuple, str] = {}

    def const(self, values: tuple[float, ...], axis: str, note: str) -> str:
        name = self.names.new(f"C{len(self.consts)}")
        self.consts.append(f"{name} = {literal(tuple(float(v) for v in values))}  {comment(note)}")
        return f"_axis({name}, {literal(axis)}, dev)"

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

        runtime = "n" in names_in(e) or "dynamic_ntk" in calls_in(e)
        v = DYNAMIC if runtime else self._static(e)
        if v is not DYNAMIC:
            if isinstance(v, Vec):
                return self.const(v.values, v.axis, to_source(e)[:60])
            if isinstance(v, (GroupSpec, list, str)) or v is None:
                raise CompileError(f"cannot generate code for {to_source(e)}")
            return literal(float(v))
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
            if e.op not in ("+", "-", "*", "/", "**"):
                raise CompileError(f"cannot generate code for the operator {e.op!r}")
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
            return f"_dynamic_ntk({literal(base)}, {literal(factor)}, {literal(orig)}, {self._pairs}, L, dev)"
        if f == "log_length":
            return f"_log_length(L, {literal(self._float(args['length']))}, dev)"
        if f == "frozen_random":
            seed = self._int(args["seed"])
            P = self._pairs
            if isinstance(args["index"], ast.Name) and args["index"].id == "token":
                key = ("token", seed, P)
                if key not in self.buffers:
                    name = self.names.new(f"table_{len(self.buffers)}")
                    self.buffers[key] = name
                    self.init.append(f"self.register_buffer({literal(name)}, _frozen_token_table({seed}, VOCAB_SIZE, "
                                     f"{P}), persistent=False)")
                return f"self.{self.buffers[key]}.to(dev)[tokens.long()].view(B, 1, L, 1, {P})"
            return f"_frozen_position_table({seed}, {P}, L).to(dev).view(1, 1, L, 1, {P})"
        if f in ("embedding", "linear"):
            axis, width = self._width(args["to"])
            key = self._site_key(f)
            if f == "embedding":
                init = self._float(args["init"])
                self.init.append(f"self.learned.sites[{literal(key)}] = nn.Embedding(VOCAB_SIZE, HEADS * {width})")
                self.init.append(f"nn.init.normal_(self.learned.sites[{literal(key)}].weight, std={literal(init)})")
                inp = "tokens.long()"
            else:
                if self.d_model is None:
                    raise CompileError("this scheme reads the hidden state x: give d_model", code="E405",
                                       hint="pedsl compile ... --d-model N")
                rank = self._int(args["rank"])
                b0 = self._float(args["init_bias"])
                if rank > 0:
                    self.init.append(f"self.learned.sites[{literal(key)}] = nn.Sequential(nn.Linear(D_MODEL, "
                                     f"{rank}, bias=False), nn.Linear({rank}, HEADS * {width}))")
                    self.init.append(f"nn.init.constant_(self.learned.sites[{literal(key)}][1].bias, {literal(b0)})")
                else:
                    self.init.append(f"self.learned.sites[{literal(key)}] = nn.Linear(D_MODEL, HEADS * {width})")
                    self.init.append(f"nn.init.constant_(self.learned.sites[{literal(key)}].bias, {literal(b0)})")
                inp = "x"
            return f"_per_head_site(self.learned.sites[{literal(key)}], {inp}, B, L, HEADS, {width})"
        if f == "shortconv":
            inner = self._e(args["v"])
            key = self._site_key("shortconv")
            width = self._int(args["width"])
            feats = self.scheme.heads * (self._chans or 1)
            self.init.append(f"self.learned.sites[{literal(key)}] = nn.Conv1d({feats}, {feats}, {width}, "
                             f"groups={feats}, padding={width - 1}, bias=False)")
            return f"_shortconv(self.learned.sites[{literal(key)}], {inner})"
        if f == "normalize":
            return f"F.normalize({self._e(args['v'])}, dim=-1, eps=1e-6)"
        raise CompileError(f"{f}() cannot be generated")


def _pairs_of(channels: tuple[int, ...], layout: str) -> tuple[list[int], list[int]]:
    m = len(channels)
    if layout == "halves":
        return list(channels[: m // 2]), list(channels[m // 2 :])
    return list(channels[0::2]), list(channels[1::2])


#: Names every generated module binds or uses itself (imports, constants, locals of ``forward``); with the
#: kernels' names, Python's keywords and builtins, no generated identifier may take one of these.
_FIXED_NAMES = (
    "annotations", "math", "torch", "F", "nn", "HEADS", "HEAD_DIM", "D_MODEL", "VOCAB_SIZE", "SCHEME_SOURCE", "Module",
    "self", "q", "k", "v", "x", "tokens", "B", "H", "L", "D", "dev", "phase", "cos", "sin", "steps", "w_g", "w", "beta",
    "q_scale", "slope", "tab", "i", "lg", "G", "bias", "scores", "key_term", "o", "learned", "sites",
)


def _kernels() -> str:
    text = (Path(__file__).parent / "kernels_template.py").read_text(encoding="utf-8")
    return text[text.index("\n# ----") + 1 :]


def module_file_name(scheme: Scheme) -> str:
    """The file `pedsl compile` writes the module to: ``<scheme>.py``, renamed if that would shadow a module."""
    return module_file_stem(scheme.name) + ".py"


def generate(scheme: Scheme, graph: nx.DiGraph, *, d_model: int | None = None, vocab_size: int = 256) -> str:
    """The source text of a standalone module computing the same function as the compiled scheme."""
    kernels = _kernels()
    names = Names(module_names(kernels) | set(_FIXED_NAMES))
    cname = names.new(class_name(scheme.name), class_name(scheme.name) + "Scheme")
    gen = _Gen(scheme, d_model, vocab_size, names)
    body: list[str] = []
    backend = graph.graph["backend"]
    fwd = body.append
    undo: list[str] = []
    for n in transform_nodes(graph):
        t = graph.nodes[n]
        ch = tuple(int(c) for c in t["channels"])
        P = len(ch) // 2
        first, second = _pairs_of(ch, scheme.layout)
        tag = t["group"].upper()
        first_name, second_name = names.new(f"{tag}_FIRST"), names.new(f"{tag}_SECOND")
        gen.consts.append(f"{first_name} = {literal(first)}  "
                          + comment(f"group {t['group']!r}: pair k rotates channels FIRST[k], SECOND[k]"))
        gen.consts.append(f"{second_name} = {literal(second)}")
        pairs = f"{first_name}, {second_name}"
        if t["op"] == "rotate":
            expr = graph.nodes[t["phase"]]["expr"]
            code = gen.expr(expr, t["phase"], P, len(ch))
            fwd(comment(f"{t['label']}: phase = {to_source(expr)}  ({t.get('note', '')})"))
            fwd(f"phase = torch.remainder(({code}) * torch.ones(1, 1, L, 1, {P}, dtype=F64, device=dev), TWO_PI)")
            fwd("phase = phase[0, 0, :, 0, :]  # (L, P)")
        elif t["op"] == "accumulate_so2":
            expr = graph.nodes[t["steps"]]["expr"]
            code = gen.expr(expr, t["steps"], P, len(ch))
            fwd(comment(f"{t['label']}: step angle = {to_source(expr)}  ({t.get('note', '')})"))
            fwd(f"steps = ({code}) * torch.ones(1, 1, L, 1, {P}, dtype=F64, device=dev)")
            fwd("phase = _cumulative_angles(steps[:, :, :, 0, :])  # (B|1, H|1, L, P)")
        else:
            wexpr, bexpr = graph.nodes[t["w"]]["expr"], graph.nodes[t["beta"]]["expr"]
            wcode = gen.expr(wexpr, t["w"], P, len(ch))
            bcode = gen.expr(bexpr, t["beta"], P, len(ch))
            fwd(comment(f"{t['label']}: w = {to_source(wexpr)}, beta = {to_source(bexpr)}"))
            fwd(f"w_g = (({wcode}) * torch.ones(B, HEADS, L, 1, {len(ch)}, device=dev, dtype=q.dtype))[:, :, :, 0, :]")
            fwd(f"w = torch.zeros(B, HEADS, L, D, dtype=q.dtype, device=dev); w[..., {literal(list(ch))}] = "
                "w_g.to(q.dtype)")
            fwd(f"beta = (({bcode}) * torch.ones(B, HEADS, L, 1, 1, device=dev, dtype=q.dtype))[:, :, :, 0, 0]")
            fwd("beta = beta.to(q.dtype)")
            continue
        fwd("cos, sin = torch.cos(phase).to(q.dtype), torch.sin(phase).to(q.dtype)")
        fwd(f"q = _rotate(q, cos, sin, {pairs})")
        fwd(f"k = _rotate(k, cos, sin, {pairs})")
        if t["targets"] == "qkv":
            saved = names.new(f"undo_{t['group'].lower()}")
            fwd(f"v = _rotate(v, cos, sin, {pairs})  # value transport U = T")
            fwd(f"{saved} = (cos, sin)")
            undo.append(f"o = _rotate(o, {saved}[0], -{saved}[1], {pairs})  # R(A_i)^T")
    # temperature
    if "temperature" in graph:
        expr = graph.nodes["temperature"]["expr"]
        code = gen.expr(expr, "temperature", None, None)
        fwd(comment(f"temperature tau = {to_source(expr)} (a scale of q)"))
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
                fwd(comment(f"{b['label']}: slope * (i - j) -> key term g(j) = -slope * j"))
                fwd(f"slope = (({code}) * torch.ones(1, HEADS, 1, 1, 1, dtype=F64, device=dev))[0, :, 0, 0, 0]")
                g = names.new(f"g_{len(key_terms)}")
                fwd(f"{g} = -slope[None, :, None] * torch.arange(L, dtype=F64, device=dev)[None, None]")
                key_terms.append(g)
            else:
                code = gen.expr(b["expr"], n, None, None)
                fwd(comment(f"{b['label']}: a (head, distance) table gathered at i - j"))
                fwd(f"tab = (({code}) * torch.ones(1, HEADS, 1, L, 1, dtype=F64, device=dev))[0, :, 0, :, 0]")
                fwd("i = torch.arange(L, device=dev)")
                t_name = names.new(f"bias_{len(tables)}")
                fwd(f"{t_name} = tab[:, (i[:, None] - i[None, :]).clamp(min=0)][None]")
                tables.append(t_name)
        else:
            code = gen.expr(b["expr"], n, None, None)
            fwd(comment(f"{b['label']}: G = cumsum(log gate) in float64, b(i, j) = G_i - G_j -> g(j) = -G_j"))
            fwd(f"lg = (({code}) * torch.ones(1, HEADS, L, 1, 1, dtype=F64, device=dev))[:, :, :, 0, 0]")
            g = names.new(f"g_{len(key_terms)}")
            fwd(f"{g} = -torch.cumsum(lg.to(F64), dim=-1)")
            if backend == "masked":
                t_name = names.new(f"bias_{len(tables)}")
                fwd(f"{t_name} = (-{g})[..., :, None] + {g}[..., None, :]")
                tables.append(t_name)
            key_terms.append(g)
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

    source_file = Path(scheme.file).name if scheme.file else "<text>"
    doc = "\n".join([
        f"{scheme.name}: {scheme.doc or 'a positional-encoding scheme'}",
        "",
        f"Generated by pedsl {__version__} from {source_file}; do not edit:",
        "change the scheme and run `pedsl compile` again.",
        "",
        f"    scheme        {scheme.name}  (extends: {', '.join(scheme.bases) or '-'})",
        f"    sha256        {scheme.source_hash}",
        f"    parameters    {json.dumps(scheme.params, sort_keys=True)}",
        f"    heads         {scheme.heads}, head_dim {scheme.head_dim}, layout {scheme.layout}",
        f"    compiled for  backend {backend}: {graph.graph.get('backend_note', '')}",
        "",
        f"Usage: ``{cname}()(q, k, v, x=x, tokens=tokens)`` with q, k, v of shape (B, H, L, D).",
        "The scheme's source text is SCHEME_SOURCE.",
    ])
    init_lines = ["super().__init__()", "self.learned = nn.Module()", "self.learned.sites = nn.ModuleDict()"]
    init_lines += gen.init
    checks = [
        "B, H, L, D = q.shape",
        "if (H, D) != (HEADS, HEAD_DIM) or k.shape != q.shape or v.shape != q.shape:",
        "    raise ValueError(f'expected q, k, v of shape (B, {HEADS}, L, {HEAD_DIM}), got {tuple(q.shape)}')",
    ]
    if scheme.needs_x:
        checks += ["if x is None:",
                   f"    raise ValueError({literal(scheme.name + ' reads the hidden state: pass x=(B, L, D_MODEL)')})"]
    if scheme.needs_tokens:
        checks += ["if tokens is None:",
                   f"    raise ValueError({literal(scheme.name + ' reads the tokens: pass tokens=(B, L)')})"]
    checks.append("dev = q.device")
    ind = "        "
    out = [
        text_block(doc),
        "",
        "from __future__ import annotations",
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "",
        f"HEADS = {int(scheme.heads)}",
        f"HEAD_DIM = {int(scheme.head_dim)}",
        f"D_MODEL = {literal(None if d_model is None else int(d_model))}",
        f"VOCAB_SIZE = {int(vocab_size)}",
        "SCHEME_SOURCE = " + text_block(scheme.source.rstrip("\n") + "\n"),
        "",
        *gen.consts,
        "",
        "",
        kernels.rstrip(),
        "",
        "",
        f"class {cname}(nn.Module):",
        "    " + literal(f"{scheme.doc or scheme.name} (generated by pedsl)."),
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
    text = "\n".join(out)
    _validate(text, cname)
    return text


def _validate(text: str, cname: str) -> None:
    """The generated text must parse, bind each top-level name once and carry no code outside pedsl's own."""
    try:
        tree = pyast.parse(text)
    except SyntaxError as exc:  # a bug in the generator, never the user's input
        raise RuntimeError(f"codegen produced a module that does not parse (line {exc.lineno}: {exc.msg})") from None
    bound: list[str] = []
    for node in tree.body:
        if isinstance(node, (pyast.FunctionDef, pyast.ClassDef)):
            bound.append(node.name)
        elif isinstance(node, pyast.Assign):
            bound += [t.id for t in node.targets if isinstance(t, pyast.Name)]
    dupes = sorted({n for n in bound if bound.count(n) > 1})
    if dupes or pyast.get_docstring(tree) is None or cname not in bound:
        raise RuntimeError(f"codegen produced an inconsistent module (names bound twice: {dupes})")
