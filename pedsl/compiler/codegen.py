"""Codegen: a scheme's lowering plan as a standalone, readable PyTorch module (imports torch only).

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
A generated ``_values`` method gives the per-token quantities (phases, step angles,
w and beta, gates, temperature) and the general forward of :mod:`pedsl.compiler.general`,
copied verbatim into the module with the banded window kernels of
:mod:`pedsl.ops.window_kernels`, does the rest - positions, documents, masks, GQA and
the decoding cache, exactly as SchemeAttention's general path - with plain-torch
rotations. Where the plan allows a C++ kernel (a sliding window, biases in the causal kernel's rows, FIRE's
MLP-bias kernel, PaTH's rows: ``embedded.NATIVE_KERNELS``) the module also carries the C++ files and pedsl's
loader (:mod:`pedsl.ops.cpu_kernels`, built on first use into the folder pedsl in process uses, one build for
both; without pedsl installed too), with the torch paths and a log line where they cannot be built. A PaTH scheme's module also carries PaTH's blockwise kernels (:mod:`pedsl.ops.path_kernels`
and the modules it calls), and a scheme with distance tables the Toeplitz kernel
(:mod:`pedsl.ops.distance_bias`), copied the same way, so its fresh sequences run in the package's time
and memory rather than by the token-by-token decode rule or blocks of queries.
"""

from __future__ import annotations

import ast as pyast
import json
import re
from pathlib import Path

from pedsl import __version__
from pedsl.compiler import plan as P
from pedsl.compiler.codegen_mlp import query_mlp_lines
from pedsl.compiler.codegen_params import parameter_lines, relative_constant
from pedsl.compiler.embedded import Carried, embedded_section, kernel_sources
from pedsl.compiler.pysafe import Names, comment, literal, module_file_stem, module_names, text_block
from pedsl.errors import CompileError
from pedsl.formulas import channel_pairs
from pedsl.lang import ast
from pedsl.lang.statements import CARRIED, RECORDS
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.fold import DYNAMIC, EvalIssue, StaticEnv, Vec, bind_args, derived_static, fold_expr
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import Scheme
from pedsl.runtime.walk import learned_calls, run_time_arg
from pedsl.lang.typed import node_types, type_of


#: The bracket depth above which a sub-expression's code becomes a local of its own (a few levels of
#: the kernels' wrapping come on top; Python's parser stops at 200).
MAX_CODE_NESTING = 24


def code_nesting(code: str) -> int:
    """The deepest bracket nesting of generated code, brackets inside its string literals and comments not counted."""
    depth = deepest = 0
    quote, escaped, in_comment = None, False, False
    for ch in code:
        if in_comment:
            in_comment = ch != "\n"
        elif quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            in_comment = True
        elif ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


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
        self.conv_history = 0  # earlier tokens a decoding step re-reads (widest short convolution - 1)
        self.shared: dict[str, str] = {}  # a let's learned call, by key: declared once, its code reused
        self._temps = 0  # locals bound to deep sub-expressions so far

    def const(self, values: tuple[float, ...], axis: str, note: str) -> str:
        name = self.names.new(f"C{len(self.consts)}")
        self.consts.append(f"{name} = {literal(tuple(float(v) for v in values))}  {comment(note)}")
        return f"_axis({name}, {literal(axis)}, dev)"

    def expr(self, e: ast.Expr, site: str, pairs: int | None, chans: int | None, into: list[str],
             indent: str = "", whole: ast.Expr | None = None) -> str:
        """The code of ``e`` (a part of the site's expression ``whole``, which names its learned calls); the
        statements binding its deep sub-expressions are appended to ``into`` (at ``indent``) first, so that no
        line nests brackets more than about MAX_CODE_NESTING deep."""
        self._pairs, self._chans = pairs, chans
        self._keys = {id(call): key for call, key in learned_calls(whole or e, site)}  # the walk's names
        self._types = node_types(e, self.values)
        self._setup: list[str] = []
        code = self._e(e)
        into += [indent + line for line in self._setup]
        return code

    def _flat(self, code: str) -> str:
        """``code``, or a local bound to it when it nests deeply: Python's parser refuses 200 nested
        brackets, and a scheme nests as deep as its checker allows (chains of lets, long operator chains)."""
        if code_nesting(code) <= MAX_CODE_NESTING:
            return code
        self._temps += 1
        name = self.names.new(f"e{self._temps}")
        self._setup.append(f"{name} = {code}")
        return name

    def _type(self, e: ast.Expr):
        """The checker's type of a node of the expression (or of one made here, e.g. a record's input)."""
        return self._types.get(id(e)) or type_of(e, self.values)

    def _static(self, e):
        try:
            return fold_expr(e, StaticEnv(values=self.values, pairs=self._pairs))
        except EvalIssue as issue:
            raise CompileError(str(issue)) from None

    def _e(self, e: ast.Expr) -> str:
        v = DYNAMIC if self._type(e).runtime else self._static(e)  # reads n: generated per length
        if v is not DYNAMIC:
            if isinstance(v, Vec):
                return self.const(v.values, v.axis, to_source(e)[:60])
            if not isinstance(v, (int, float)):  # a string, a list, a group spec or None
                raise CompileError(f"cannot generate code for {to_source(e)}")
            return literal(float(v))
        if e.kind == "name":
            if e.id.startswith("distance."):  # distance.AXIS: its slice of a block's per-axis distances
                return f"dist5[{self.scheme.axes.index(e.id.partition('.')[2])}]"
            if "." in e.id:  # position.AXIS: its row of the per-axis positions (every axis = pos5 without them)
                return f"(pos5 if apos5 is None else apos5[{self.scheme.axes.index(e.id.partition('.')[2])}])"
            if e.id in ("position", "query_position"):
                return "pos5"
            if e.id == "distance":
                return "_distances(L, dev)"
            if e.id == "n":
                return "float(n_run)"
            raise CompileError(f"'{e.id}' has no run-time value")
        if e.kind == "unary":
            return self._flat(f"(-{self._e(e.operand)})")
        if e.kind == "binary":
            if e.op not in ("+", "-", "*", "/", "**"):
                raise CompileError(f"cannot generate code for the operator {e.op!r}")
            a, b = self._e(e.left), self._e(e.right)
            return self._flat(f"torch.pow(_t({a}, dev), {b})" if e.op == "**" else f"({a} {e.op} {b})")
        if e.kind == "call":
            return self._flat(self._call(e))
        raise CompileError(f"cannot generate code for {to_source(e)}")

    def _at_length(self, e: ast.Call, n: float | None) -> str:
        """The constant a call that reads the length folds to at length n (None: no length)."""
        v = fold_expr(e, StaticEnv(values=self.values, pairs=self._pairs, n=n))
        return self.const(v.values, v.axis, f"{to_source(e)[:50]} at n = {n}")

    def _select_axes(self, e: ast.Call, spec, args) -> str:
        """An axis selection: sum over axes a of a per-pair 0/1 constant times position.a (as the walk)."""
        try:
            axis_of = spec.axis_select(self._static(args["sizes"]), self._pairs)
        except EvalIssue as issue:
            raise CompileError(str(issue)) from None
        terms = []
        for a, name in enumerate(self.scheme.axes):
            onehot = self.const(tuple(1.0 if x == a else 0.0 for x in axis_of), "pair", f"pairs reading axis {name}")
            terms.append(f"{onehot} * {self._e(ast.Name(id='position.' + name))}")
        return "(" + " + ".join(terms) + ")"

    def _call(self, e: ast.Call) -> str:
        spec = FUNCTIONS[e.func]
        args = bind_args(e, spec.params)
        if spec.axis_select is not None:
            return self._select_axes(e, spec, args)
        if spec.emit is None:
            raise CompileError(f"{e.func}() cannot be generated")
        number = lambda a: self._static(a) if isinstance(a, ast.Node) else a  # noqa: E731
        static = {p: kind(number(args[p])) for p, kind in spec.static}
        try:
            static = {p: literal(v) for p, v in derived_static(e, static, number).items()}
        except EvalIssue as issue:
            raise CompileError(str(issue)) from None
        if spec.reads_length:  # its value folded at a given length, chosen by the run-time length
            return spec.emit(lambda n: self._at_length(e, n), self._pairs, **static)
        key = self._keys[id(e)] if spec.learned else None
        if key is not None and key in self.shared:  # a let's learned value: every use reads the one sub-module
            return self.shared[key]
        names = {p: given.id if isinstance(given := args[p], ast.Name) else given for p in spec.names}
        codes = [self._e(run_time_arg(args[p])) for p, _ in spec.params if p not in static and p not in names]
        if spec.site is not None:  # a source with state: its sub-modules and buffers are declared through g
            code = spec.emit(SiteCode(self, key, self._type(e).axes), *codes, **names, **static)
            if e.bound is not None and key is not None:  # bound: a learned call written in a let
                self.shared[key] = code
            return code
        return spec.emit(*(self._e(ast.Name(id=i)) for i in spec.inputs), *codes, **static)


class SiteCode:
    """What a source record's ``emit`` may declare in the generated module (its ``g``): learned
    sub-modules named like the in-process module's sites, frozen buffers, the decoding history."""

    def __init__(self, gen: _Gen, key: str | None, axes: frozenset[str] = frozenset()):
        self.gen, self.key = gen, key  # key: the learned call's name (None for a frozen table)
        self.heads, self.pairs, self.chans = gen.scheme.heads, gen._pairs, gen._chans
        self.axes = axes  # the axes of the call's value (its checked type)

    def width(self, to: str) -> int:
        """The per-head width of an output ``to = pair | channel | head``."""
        if to == "pair":
            if self.pairs is None:  # as the walk's At.width
                raise CompileError("a per-pair value is only defined inside a rotation")
            return self.pairs
        if to != "channel":
            return 1
        assert self.chans is not None  # the checker types a per-channel value as a transport's, in a group
        return self.chans

    def init(self, line: str) -> None:
        self.gen.init.append(line)

    def learned(self, constructor: str) -> str:
        """A learned sub-module at the next site of this builtin; the code that reads it."""
        m = f"self.learned.sites[{literal(self.key)}]"
        self.init(f"{m} = {constructor}")
        return m

    def buffer(self, key: tuple, constructor: str) -> str:
        """A frozen buffer, one per key; its attribute name."""
        if key not in self.gen.buffers:
            name = self.gen.names.new(f"table_{len(self.gen.buffers)}")
            self.gen.buffers[key] = name
            self.init(f"self.register_buffer({literal(name)}, {constructor}, persistent=False)")
        return self.gen.buffers[key]

    def need_d_model(self) -> None:
        if self.gen.d_model is None:
            raise CompileError("this scheme reads the hidden state x: give d_model", code="E405",
                               hint="pedsl compile ... --d-model N")

    def history(self, tokens: int) -> None:
        """Earlier tokens a decoding step re-reads."""
        self.gen.conv_history = max(self.gen.conv_history, tokens)


#: Names every generated module binds or uses itself (imports, constants, locals of ``_values``); with the
#: embedded sections' names, Python's keywords and builtins, no generated identifier may take one of these.
_FIXED_NAMES = (
    "annotations", "math", "NamedTuple", "torch", "F", "nn", "Tensor", "HEADS", "HEAD_DIM", "D_MODEL", "VOCAB_SIZE",
    "SCHEME_NAME", "SCHEME_SOURCE", "Module", "self", "q", "k", "v", "x", "tokens", "B", "H", "L", "D", "dev", "phase",
    "cos", "sin", "steps", "w_g", "w", "beta", "q_scale", "slope", "tab", "i", "lg", "G", "bias", "scores", "key_term",
    "o", "learned", "sites", "out", "pos5", "seg", "n_run", "dt", "positions", "document_ids", "cache", "attn_mask",
    "batch_size", "TRANSFORMS", "BIASES", "CONV_HISTORY", "win", "p", "size", "device", "AXES", "apos", "apos5", "qpos",
    "sink_logit", "sink_key", "sink_value", "COPE_MAX_POS", "cope_max_pos", "contextual_embedding", "FAST_PATHS",
    "fast_paths", "differential_lambda", "span_ids", "dense", "remap_bounds", "remap_rotate", "query_mlp",
    "RELATIVE_TERMS", "relative", "relative_keys", "relative_queries", "relative_u", "relative_v",
    "Callable", "Optional", "once_differentiable", "u", "net", "KERNEL_SOURCES", "Kernels", "SchemeSide", "WindowSide",
    "MaskSide",
    # the statements' carried values: a constant NAME and the class attribute name each
    *(n for c in CARRIED for n in (c.name.upper(), c.name)),
)


def module_file_name(scheme: Scheme) -> str:
    """The file `pedsl compile` writes the module to: ``<scheme>.py``, renamed if that would shadow a module."""
    return module_file_stem(scheme.name) + ".py"


def _transport_code(gen: _Gen, plan: P.Plan, scheme: Scheme) -> tuple[list[str], list[str]]:
    """The TRANSFORMS records and the ``_values`` lines of every transport (and of the temperature)."""
    records, body = [], []
    for i, t in enumerate(plan.transports):
        t = t.as_steps()  # the general forward's form: RoPE folded from constant steps sums them over tokens
        ch = t.channels
        npairs = len(ch) // 2
        pairs = channel_pairs(ch, scheme.layout)
        first, second = tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
        records.append(f"Transform({literal(t.kind)}, {literal(t.targets == 'qkv')}, {literal(tuple(ch))}, "
                       f"{literal(first)}, {literal(second)}, {literal(float(t.scale))}, "
                       f"{literal(float(t.xpos_gamma))}, {literal(tuple(t.xpos_zeta))}),  "
                       + comment(f"group {t.group!r}: {t.kind} of {t.targets}, kernel {t.kernel}"))
        if t.kind == P.DENSE:  # its rotations come from self.dense and the positions (general.dense)
            assert t.dense is not None  # a dense transport's step carries its generators' shape
            body.append(comment(f"{t.kind} on {t.group}: {t.dense.source()}  ({t.why})"))
            body.append(f"out['t{i}'] = None")
        elif t.kind in (P.ROPE, P.SO2):
            what = "phase" if t.kind == P.ROPE else "step angle"
            body.append(comment(f"{t.kind} on {t.group}: {what} = {to_source(t.expr)}  ({t.why})"))
            code = gen.expr(t.expr, t.site, npairs, len(ch), body)
            body.append(f"out['t{i}'] = (({code}) * torch.ones(1, 1, L, 1, {npairs}, dtype=F64, device=dev))"
                        "[:, :, :, 0, :]")
        else:
            (w, beta) = t.sites
            body.append(comment(f"{t.kind} on {t.group}: w = {to_source(w.expr)}, beta = {to_source(beta.expr)}"))
            wcode = gen.expr(w.expr, w.name, npairs, len(ch), body)
            bcode = gen.expr(beta.expr, beta.name, npairs, len(ch), body)
            body.append(f"w_g = (({wcode}) * torch.ones(B, HEADS, L, 1, {len(ch)}, device=dev, dtype=dt))[:, :, :, 0, :]")
            body.append(f"beta = (({bcode}) * torch.ones(B, HEADS, L, 1, 1, device=dev, dtype=dt))[:, :, :, 0, 0]")
            body.append(f"out['t{i}'] = (w_g, beta)")
    if plan.temperature is not None:
        tau = plan.temperature.site
        body.append(comment(f"temperature tau = {to_source(tau.expr)} (a scale of q)"))
        code = gen.expr(tau.expr, tau.name, None, None, body)
        body.append(f"out['tau'] = (({code}) * torch.ones(1, 1, L, 1, 1, dtype=F64, device=dev))[:, :, :, 0, 0]")
    return records, body


def _bias_code(gen: _Gen, plan: P.Plan) -> tuple[list[str], list[str], list[str], list[str]]:
    """The BIASES kinds, the ``_values`` lines of the coordinate biases, the ``distance_table`` lines and the
    ``axis_table`` lines."""
    kinds, body, tables, axial = [], [], [], []
    for i, b in enumerate(plan.biases):
        src = f"bias = {to_source(b.site.expr)}"
        kind = b.kind
        if b.log_gate is not None:  # a gate, or a constant one read as ALiBi: the coordinate sums it over tokens
            kind = P.GATE_BIAS
            body.append(comment(f"{src}: coordinate G_t = sum of the log gates {to_source(b.log_gate)} (float64), "
                                "b(i, j) = G_i - G_j"))
            code = gen.expr(b.log_gate, b.site.name, None, None, body)
            body.append(f"out['b{i}'] = (({code}) * torch.ones(1, HEADS, L, 1, 1, dtype=F64, device=dev))[:, :, :, 0, 0]")
        elif b.kind == P.LINEAR_BIAS:
            body.append(comment(f"{src}: slope * (p_i - p_j): coordinate c_t = slope * p_t"))
            assert b.slope is not None  # the plan gives a linear-distance bias its slope
            code = gen.expr(b.slope, b.site.name, None, None, body)
            body.append(f"out['b{i}'] = (({code}) * torch.ones(1, HEADS, 1, 1, 1, dtype=F64, device=dev))[0, :, 0, 0, 0]")
        elif b.kind == P.AXIS_BIAS:  # over per-axis distances: evaluated at a block's (query, key) pairs
            axial.append(f"if i == {i}:  " + comment(f"{src}: at the per-axis distances dist5 of a block of pairs"))
            code = gen.expr(b.site.expr, b.site.name, None, None, axial, "    ")
            axial.append(f"    t = (({code}) * torch.ones(1, HEADS, 1, 1, 1, dtype=F64, device=dev))[..., 0]")
            axial.append("    return t.expand(t.shape[0], HEADS, rows, keys)")
        elif b.query:  # reads query_position: evaluated at the block's query positions qpos (B, rows)
            kind = "query-table"
            tables.append(f"if i == {i}:  " + comment(f"{src}: a (head, query, distance) table, per block of queries"))
            tables.append("    L = size")
            tables.append("    pos5 = qpos.to(F64).view(qpos.shape[0], 1, -1, 1, 1)")
            code = gen.expr(b.site.expr, b.site.name, None, None, tables, "    ")
            tables.append(f"    return (({code}) * torch.ones(1, HEADS, 1, L, 1, dtype=F64, device=dev))[..., 0]")
        else:
            tables.append(f"if i == {i}:  " + comment(f"{src}: a (head, distance) table gathered at p_i - p_j"))
            tables.append("    L = size")
            code = gen.expr(b.site.expr, b.site.name, None, None, tables, "    ")
            tables.append(f"    return (({code}) * torch.ones(1, HEADS, 1, L, 1, dtype=F64, device=dev))[0, :, 0, :, 0]")
        kinds.append(f"{literal(kind)},  {comment(b.site.name)}")
    tables.append("raise IndexError(i)")
    axial.append("raise IndexError(i)")
    return kinds, body, tables, axial


def _docstring(scheme: Scheme, plan: P.Plan, cname: str) -> str:
    source_file = Path(scheme.file).name if scheme.file else "<text>"
    return "\n".join([
        f"{scheme.name}: {scheme.doc or 'a positional-encoding scheme'}",
        "",
        f"Generated by pedsl {__version__} from {source_file}; do not edit:",
        "change the scheme and run `pedsl compile` again.",
        "",
        f"    scheme        {scheme.name}  (extends: {', '.join(scheme.bases) or '-'})",
        f"    sha256        {scheme.source_hash}",
        f"    parameters    {json.dumps(scheme.params, sort_keys=True)}",
        f"    heads         {scheme.heads}, head_dim {scheme.head_dim}, layout {scheme.layout}"
        + (f", axes {', '.join(scheme.axes)}" if scheme.axes else ""),
        f"    compiled for  backend {plan.backend}: {plan.backend_why}",
        "",
        f"Usage: ``{cname}()(q, k, v, x=x, tokens=tokens)`` with q (B, H, Lq, D), k, v (B, Hkv, L, D);",
        "positions, document_ids, attn_mask, span_ids and cache=module.new_cache(B) as in pedsl's SchemeAttention.",
        "The scheme's source text is SCHEME_SOURCE.",
    ])


def _class_lines(scheme: Scheme, plan: P.Plan, gen: _Gen, cname: str, body: list[str], tables: list[str],
                 axial: list[str], kernels: str, query_mlp: list[str]) -> list[str]:
    """The module class: the scheme's side of the general forward (its values, tables and constants);
    ``kernels``: the class of primitives its forward runs on; ``query_mlp``: its lines of that member."""
    ind = "        "
    init_lines = ["super().__init__()", "self.learned = nn.Module()", "self.learned.sites = nn.ModuleDict()",
                  *parameter_lines(scheme, plan)]
    checks = []
    if scheme.needs_x:
        checks += ["if x is None:",
                   f"    raise ValueError({literal(scheme.name + ' reads the hidden state: pass x=(B, L, D_MODEL)')})"]
    if scheme.needs_tokens:
        checks += ["if tokens is None:",
                   f"    raise ValueError({literal(scheme.name + ' reads the tokens: pass tokens=(B, L)')})"]
    return [
        f"class {cname}(nn.Module):",
        "    " + literal(f"{scheme.doc or scheme.name} (generated by pedsl)."),
        "",
        "    heads, head_dim, conv_history, transforms = HEADS, HEAD_DIM, CONV_HISTORY, TRANSFORMS",
        "    axes = AXES",
        *_carried_attributes(),
        "    fast_paths = FAST_PATHS",
        "    cope_max_pos = COPE_MAX_POS",
        "    relative = RELATIVE_TERMS",
        "    remap_bounds, remap_chunk, remap_rotate = (), None, None  # pedsl compile refuses remapped positions",
        *query_mlp,
        "",
        "    def __init__(self) -> None:",
        *[ind + line for line in init_lines + gen.init],
        "",
        "    def forward(self, q, k, v, *, x=None, tokens=None, positions=None, document_ids=None, cache=None,",
        "                attn_mask=None, span_ids=None):",
        ind + literal("q (B, HEADS, Lq, HEAD_DIM), k, v (B, Hkv, L, HEAD_DIM) -> (B, HEADS, Lq, HEAD_DIM)."),
        *[ind + line for line in checks],
        ind + "check_call(self, q, k, v, cache)",
        ind + f"return general_forward(self, {kernels}, q, k, v, x=x, tokens=tokens, positions=positions,",
        ind + "                       document_ids=document_ids, cache=cache, attn_mask=attn_mask, span_ids=span_ids)",
        "",
        "    def new_cache(self, batch_size):",
        ind + literal("An empty decoding cache for batch_size sequences (pass it as cache= to every call)."),
        ind + "return AttentionCache(self, batch_size, SCHEME_NAME)",
        "",
        "    def token_values(self, win, dt):",
        ind + literal("The per-token values of the window's tokens, as the general forward reads them."),
        ind + "p = win.parts",
        ind + "B, L = p['positions'].shape",
        ind + "apos = p['axes_pos']  # (B, L, A) positions along each axis of a multi-axis scheme, or None",
        ind + "apos5 = None if apos is None else apos.to(F64).permute(2, 0, 1).reshape(len(AXES), B, 1, L, 1, 1)",
        ind + "out = self._values(B, L, p['x'], p['tokens'], p['positions'].to(F64).view(B, 1, L, 1, 1),",
        ind + "                   (p['docs'], p['valid']), win.n, win.device, dt, apos5)",
        ind + "return TokenValues([out[f't{i}'] for i in range(len(TRANSFORMS))],",
        ind + "                   [(kind, out.get(f'b{i}')) for i, kind in enumerate(BIASES)], out.get('tau'))",
        "",
        "    def _values(self, B, L, x, tokens, pos5, seg, n_run, dev, dt, apos5=None):",
        ind + literal("Per-token quantities over L tokens at positions pos5 (B, 1, L, 1, 1) (apos5: per axis, "
                      "(A, B, 1, L, 1, 1)), float64 where static."),
        *[ind + line for line in body],
        "",
        "    def distance_table(self, i, size, dev, qpos=None, n_run=None):",
        ind + literal("Bias table i over distances 0..size-1, (HEADS, size); one that reads query_position at the "
                      "queries' positions qpos (B, rows): (B|1, HEADS, rows, size); n reads n_run (the call's "
                      "run-time length; size where not given)."),
        ind + "n_run = size if n_run is None else n_run",
        *[ind + line for line in tables],
        "",
        "    def query_table(self, i, qpos, size, dev, n_run=None):",
        ind + "return self.distance_table(i, size, dev, qpos, n_run)",
        "",
        "    def axis_table(self, i, dist, qpos):",
        ind + literal("Bias i over per-axis distances at a block of (query, key) pairs: dist (B, rows, keys, A) their "
                      "signed distances i_a - j_a, qpos (B, rows) the queries' positions; (B|1, HEADS, rows, keys)."),
        ind + "B, rows, keys, _ = dist.shape",
        ind + "dev, L = dist.device, keys",
        ind + "pos5 = qpos.to(F64).view(qpos.shape[0], 1, rows, 1, 1)",
        ind + "dist5 = dist.to(F64).permute(3, 0, 1, 2).reshape(dist.shape[3], B, 1, rows, keys, 1)",
        *[ind + line for line in axial],
    ]


def _carried_attributes() -> list[str]:
    """The class attributes of the statements' carried values (one line per statement), from their constants."""
    return [f"    {', '.join(c.name for c in r.carried)} = {', '.join(c.name.upper() for c in r.carried)}"
            for r in RECORDS if r.carried]


def generate(scheme: Scheme, plan: P.Plan, *, d_model: int | None = None, vocab_size: int = 256) -> str:
    """The source text of a standalone module executing ``plan`` (the scheme's lowering plan): the same
    function as the compiled scheme, with the same learned-parameter names."""
    if plan.remap is not None:  # its positions are evaluated by pedsl's walk at run time, not generated
        raise CompileError(f"scheme '{scheme.name}' remaps its positions by distance regime, which pedsl compile "
                           "does not generate yet", code="E400",
                           hint="run it in process (pedsl.compiler.compile_scheme / pedsl train), which computes it")
    carried = Carried.of(plan)
    sections = [embedded_section(m) for m in carried.modules()]
    names = Names(set().union(*map(module_names, sections)) | set(_FIXED_NAMES))
    kernels_class = carried.kernels_class()
    cname = names.new(class_name(scheme.name), class_name(scheme.name) + "Scheme")
    gen = _Gen(scheme, d_model, vocab_size, names)
    records, body = _transport_code(gen, plan, scheme)
    kinds, bias_body, tables, axial = _bias_code(gen, plan)
    query_mlp = query_mlp_lines(gen, plan)
    body = ["out = {}", *body, *bias_body, "return out"]
    out = [
        text_block(_docstring(scheme, plan, cname)),
        "",
        "from __future__ import annotations",
        "",
        "import math",
        *carried.imports(),
        "from typing import Callable, NamedTuple, Optional" if carried.path else "from typing import NamedTuple",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "import torch.utils.checkpoint",
        "from torch import Tensor, nn",
        *(["from torch.autograd.function import once_differentiable"] if carried.path or carried.distance else []),
        "",
        f"HEADS = {int(scheme.heads)}",
        f"HEAD_DIM = {int(scheme.head_dim)}",
        f"D_MODEL = {literal(None if d_model is None else int(d_model))}",
        f"VOCAB_SIZE = {int(vocab_size)}",
        f"SCHEME_NAME = {literal(scheme.name)}",
        f"AXES = {literal(tuple(scheme.axes))}",
        "SCHEME_SOURCE = " + text_block(scheme.source.rstrip("\n") + "\n"),
        "",
        "",
        *[line for section in sections for line in (section.rstrip(), "", "")],
        *kernels_class,
        *gen.consts,
        "TRANSFORMS = (" + ("" if not records else "\n    " + "\n    ".join(records) + "\n") + ")",
        "BIASES = (" + ("" if not kinds else "\n    " + "\n    ".join(kinds) + "\n") + ")",
        f"CONV_HISTORY = {int(gen.conv_history)}",
        *(f"{name.upper()} = {literal(value)}" for name, value in P.carried_values(plan).items()),
        f"FAST_PATHS = {literal(tuple(plan.kernels))}",
        f"COPE_MAX_POS = {literal(None if plan.contextual is None else int(plan.contextual.max_pos))}",
        f"RELATIVE_TERMS = {literal(relative_constant(plan.relative))}",
        "",
        "",
        *_class_lines(scheme, plan, gen, cname, body, tables, axial, "Kernels" if kernels_class else "TorchKernels",
                      query_mlp),
        "",
        "",
        f"Module = {cname}",
        "",
        *(["", *kernel_sources(), ""] if carried.native else []),
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
