"""Syntax IR -> resolved, checked :class:`~pedsl.lang.scheme.Scheme`.

Stages, each reporting every problem it finds before giving up:

1. load the file and its imports (cycles, missing files, where imports may come from);
2. merge a scheme with its ``extends`` chain (cycles, unknown bases);
3. bind parameters: defaults, overrides (``-P name=value``), types, constraints;
4. type-check every expression (unknown names with did-you-mean, axes);
5. lay out channel groups against ``head_dim``; classify transports and biases;
6. lint: legal but suspicious schemes (warnings, silenced by ``allow NAME``).

The stages live in their own modules: ``imports`` (1), ``inherit`` (2, with the merging rule),
``params`` (3), ``terms`` (5) and ``sections`` (train/eval blocks, ``allow``); ``lint`` (6).
This module holds the :class:`Resolver` that runs them, the type stage (4) and the entry points.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, cast

from pedsl.errors import CheckError, Diagnostic, ParseError, report_order
from pedsl.lang import ast, bounds
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS, STRUCTURAL_DEFAULTS
from pedsl.lang.statements import KEYWORDS, RECORDS
from pedsl.lang.values import StaticEnv
from pedsl.lang.exprs import bind_calls, inline_lets, walk
from pedsl.lang.imports import Source
from pedsl.lang.inherit import Merged, chain, merge, select_scheme
from pedsl.lang.layers import is_layered, layer_count_override, resolve_layered
from pedsl.lang.lint import constant_bias_terms, lint
from pedsl.lang.params import ParamBinding, parse_override
from pedsl.lang.diagnostics import has_errors, node_pos, sink_for
from pedsl.lang.scheme import Layout, Normalizer, Scheme, SinkKind
from pedsl.lang.sections import SectionResolution
from pedsl.lang.terms import TermResolution
from pedsl.lang.typecheck import Checker
from pedsl.lang.types import Kind, Ty
from pedsl.lang.masks import MaskResolution
from pedsl.lang.windows import WindowResolution
from pedsl.lang.contextual import ContextualResolution
from pedsl.lang.normalizers import NormalizerResolution
from pedsl.lang.remap import RemapResolution

MAX_INLINED = 5_000  # expression nodes of one let after inlining the lets it uses

# ------------------------------------------------------------------ the resolver


class Resolver(ParamBinding, TermResolution, SectionResolution, WindowResolution, MaskResolution, ContextualResolution,
               NormalizerResolution, RemapResolution):
    def __init__(self, merged: Merged, overrides: dict[str, Any], structural: dict[str, int], file_src: Source):
        self.m = merged
        self.overrides = overrides
        self.structural = structural
        self.src = file_src
        self.diags: list[Diagnostic] = []
        self.values: dict[str, Any] = {}
        self.types: dict[str, Ty | None] = {}
        self._typing: set[str] = set()
        self._failed_groups: set[str] = set()
        self._bound_lets: dict[str, Any] = {}  # each let with its learned calls marked (set by resolve)

    # reporting ---------------------------------------------------------
    def report(self, code: str, message: str, node: Any = None, *, hint: str | None = None, src: Source | None = None,
               severity: str = "error") -> None:
        src = src or self._let_source(node) or self._current
        sink = sink_for(src)
        sink.add(code, message, hint=hint, severity=severity, **node_pos(node))
        self.diags.extend(sink.items)

    _current: Source

    def _let_source(self, node: Any) -> Source | None:
        """The file of the let that wrote ``node``, where that is not the statement being checked: a let
        inlined into a base scheme's statement keeps its own file (a child's override is reported in the
        child). Nodes are matched by value, span included; a node rebuilt around other lets matches none."""
        if node is None or getattr(node, "span", None) is None:
            return None
        bound = self._bound_lets
        for name, loc in self.m.lets.items():
            if loc.src is self._current:
                continue
            forms = (loc.stmt.value, bound[name]) if name in bound else (loc.stmt.value,)
            if any(n == node for form in forms for n in walk(form)):
                return loc.src
        return None

    # types --------------------------------------------------------------
    def checker(self) -> Checker:
        names = getattr(self, "_names", None)
        if names is None:  # built once: rebuilding it per let made checking quadratic in the lets
            names = {}
            for name, loc in self.m.params.items():
                typ = loc.stmt.type
                t = {"int": Ty(Kind.NUM, integer=True), "float": Ty(Kind.NUM), "bool": Ty(Kind.BOOL), "str": Ty(Kind.STR)}[typ]
                names[name] = (lambda t=t: t)
            for name, loc in self.m.lets.items():
                names[name] = (lambda name=name: self.let_type(name))
            self._names = names
        return Checker(names, lambda code, msg, node, hint=None: self.report(code, msg, node, hint=hint),
                       axes=self.axes)

    @property
    def axes(self) -> tuple[str, ...]:
        """The declared position axes (``axes t, h, w``; () when absent: one unnamed axis)."""
        return self.m.axes.stmt.names if self.m.axes is not None else ()

    def check_axes(self) -> None:
        """An axis declared twice, or named like a builtin input."""
        if self.m.axes is None:
            return
        seen: set[str] = set()
        for name in self.m.axes.stmt.names:
            if name in seen:
                self.report("E230", f"axis '{name}' is declared twice", self.m.axes.stmt, src=self.m.axes.src)
            seen.add(name)

    def let_type(self, name: str) -> Ty | None:
        if name in self.types:
            return self.types[name]
        loc = self.m.lets[name]
        if name in self._typing:
            self.report("E205", f"'{name}' is defined in terms of itself", loc.stmt, src=loc.src)
            self.types[name] = None
            return None
        self._typing.add(name)
        saved = self._current
        self._current = loc.src
        t = self.checker().infer(loc.stmt.value)
        self._current = saved
        self._typing.discard(name)
        self.types[name] = t
        return t

    def check_let_sizes(self, lets: dict[str, ast.Expr]) -> bool:
        """Report lets whose inlined expression would be huge (``let b = a + a`` chains double it)."""
        sizes: dict[str, int] = {}

        def size(name: str, stack: frozenset) -> int:
            if name not in sizes:
                if name in stack:
                    return 1  # a cycle: reported by the type checker
                total = 0
                for node in walk(lets[name]):
                    total += size(node.id, stack | {name}) if node.kind == "name" and node.id in lets else 1
                sizes[name] = total
            return sizes[name]

        too_big = False
        for name, loc in self.m.lets.items():
            n = size(name, frozenset())
            if n > MAX_INLINED:
                self.report("E217", f"'{name}' expands to {n:,} nodes once the lets it uses are inlined "
                            f"(the limit is {MAX_INLINED:,})", loc.stmt, src=loc.src,
                            hint="write it with fewer repeated uses of other lets, or as a param")
                too_big = True
                break  # the lets built on it are too big as well: one report is enough
        return too_big

    # main ---------------------------------------------------------------
    def resolve(self) -> tuple[Scheme | None, list[Diagnostic]]:
        m = self.m
        self._current = self.src
        self.bind_params()
        self.check_axes()
        # a let is one value: its learned calls are marked as its own, so every use reads one site
        lets = {n: bind_calls(loc.stmt.value, n, lambda f: f in FUNCTIONS and FUNCTIONS[f].learned)
                for n, loc in m.lets.items()}
        self._bound_lets = lets
        for n, loc in m.lets.items():
            if n in CONSTANTS or n in FUNCTIONS or n in KEYWORDS:
                self.report("E205", f"'{n}' shadows a builtin name or keyword", loc.stmt, src=loc.src)
        for n in m.lets:
            self.let_type(n)
        if self.check_let_sizes(lets) or self.check_structure():
            return None, self.diags
        heads = int(self.values.get("heads", self.structural["heads"]))
        head_dim = int(self.values.get("head_dim", self.structural["head_dim"]))
        env = StaticEnv(values=dict(self.values), lets=lets)

        layout = m.layout.stmt.value if m.layout else "halves"
        groups = self.resolve_groups(env, head_dim)
        transports = self.resolve_transports(env, lets, groups)
        self.check_shared_widths(transports, groups)
        biases = self.resolve_bias(lets)
        if m.bias is not None:
            allowed = {n for loc in m.allow for n in loc.stmt.names}
            self.diags.extend(constant_bias_terms(self.constant_terms, m.bias.src, allowed))
        temperature = self.resolve_temperature(lets)
        normalize = self.resolve_normalize(transports, env, heads) or ("softmax", True, 0.0, 0.8)
        window, chunk, sink = self.resolve_shape(env, lets)
        own = self.record_values(env, lets, transports, {"window": window, "chunk": chunk, "sink": sink})
        self.check_sink_transports(sink, transports)
        self.check_sink_normalizer(sink, normalize[0])
        contextual = self.resolve_contextual(env, lets, transports, sink)
        self.check_mask_meaning(own.get("mask"), transports, biases, normalize[0], contextual)
        self.check_values(env, lets, temperature)
        train = self.resolve_section(m.train, env, "train")
        evals = self.resolve_section(m.eval, env, "eval")
        self.check_block("train", m.train, train, train)
        self.check_block("eval", m.eval, evals, train)
        self.check_xpos_lengths(transports, train)
        allow = self.resolve_allow()
        if any(d.severity == "error" for d in self.diags):
            return None, self.diags
        # the casts: the grammar and the stages above admit only these names, and Scheme (pydantic)
        # validates them against their Literal types again
        scheme = Scheme(
            name=m.name,
            doc=m.doc,
            file=self.src.file,
            bases=m.bases,
            params={k: v for k, v in self.values.items() if k in m.params},
            heads=heads,
            head_dim=head_dim,
            layout=cast(Layout, layout),
            axes=self.axes,
            groups=tuple(groups.values()),
            transports=tuple(transports),
            biases=tuple(biases),
            temperature=temperature,
            temperature_ty=self.type_of(temperature) if temperature is not None else None,
            normalize=cast(Normalizer, normalize[0]),
            attend_current=normalize[1],
            sigmoid_bias=normalize[2],
            lambda_init=normalize[3],
            contextual=contextual,
            window=window,
            chunk=chunk,
            sink=cast(SinkKind | None, sink),
            **own,  # the statements resolved by their records (softcap ...): fields of the scheme, and its settings
            train=train,
            eval=evals,
            allow=tuple(allow),
            source=self.src.text,
            source_hash=hashlib.sha256(self.src.text.encode()).hexdigest(),
        )
        self.diags.extend(lint(scheme, self.src))
        return scheme, self.diags

    def record_values(self, env: StaticEnv, lets: dict, transports: list, shape: dict) -> dict[str, Any]:
        """The values of the statements resolved by their records - by their own ``resolve`` method, or as the
        numbers their ``known`` declares (which may need ``shape``'s window or chunk) - as the Scheme's keyword
        arguments: a field of the scheme by its name, the others in ``settings``."""
        own = {r.fields[0]: getattr(self, r.resolve)(env, lets, transports) for r in RECORDS if r.resolve}
        resolved = {**shape, **own}
        own |= {r.fields[0]: self.resolve_known(r, env, lets, resolved) for r in RECORDS if r.known is not None}
        return {**{k: v for k, v in own.items() if k in Scheme.model_fields},
                "settings": {k: v for k, v in own.items() if k not in Scheme.model_fields}}

    # limits (pedsl/limits.py) and values that would fail later -------------
    def check_structure(self) -> bool:
        """heads / head_dim within their caps, before anything is sized by them."""
        bad = False
        for name in ("heads", "head_dim"):
            msg = bounds.structural_issue(name, self.values.get(name, self.structural[name]))
            if msg is None:
                continue
            bad = True
            if name in self.m.params:
                loc = self.m.params[name]
                self.report("E212", msg, loc.stmt, src=loc.src, hint=f"choose a smaller {name}")
            else:
                decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
                how = "-P" if name in self.overrides else "the model's shape (--heads / --head-dim)"
                self.report("E303", msg + f" (from {how})", decl, src=self.src, hint=f"choose a smaller {name}")
        return bad

    def check_values(self, env: StaticEnv, lets, temperature) -> None:
        """Static builtin arguments, biases and the temperature, probed where they are used."""
        seen: set = set()
        for loc in self.m.transports:
            self._current = loc.src
            # (a learned start value is folded with the group's pairs by the transport's own check)
            bounds.check_calls(inline_lets(loc.stmt.value, lets), env, self.report, seen, checked_args=False)
        if self.m.bias is not None:
            self._current = self.m.bias.src
            value = inline_lets(self.m.bias.stmt.value, lets)
            bounds.check_calls(value, env, self.report, seen)
            if not has_errors(self.diags):
                bounds.probe(value, env, self.report, "the bias")
        if temperature is not None and self.m.temperature is not None:  # a temperature comes from its statement
            self._current = self.m.temperature.src
            bounds.check_calls(temperature, env, self.report, seen)
            if not has_errors(self.diags):
                bounds.probe(temperature, env, self.report, "the temperature", bound=bounds.MAX_TEMPERATURE)

# ------------------------------------------------------------------ entry points


def resolve(
    src: Source, scheme: str | None = None, params: dict[str, Any] | None = None,
    structural: Mapping[str, int | None] | None = None,
) -> tuple[Scheme, list[Diagnostic]]:
    """Resolve one scheme of a loaded file; raise CheckError with every error found."""
    decl = select_scheme(src, scheme)
    diags: list[Diagnostic] = []
    struct = dict(STRUCTURAL_DEFAULTS)
    struct.update({k: int(v) for k, v in (structural or {}).items() if v is not None})
    overrides = {k: (parse_override(v) if isinstance(v, str) else v) for k, v in (params or {}).items()}
    count = struct.pop("layers", None)  # the model's layer count: only a `layers` block reads it
    links = chain(decl, src, diags)
    if any(is_layered(d) for d, _ in links):
        return _resolve_layered(links, diags, src, overrides, struct, count)
    merged = merge(links, diags)
    try:
        result, more = Resolver(merged, overrides, struct, src).resolve() if not has_errors(diags) else (None, [])
    except RecursionError:  # a safety net: every input must end in a diagnostic
        decl_pos = node_pos(decl)
        sink = sink_for(src)
        sink.add("E103", f"definitions in scheme '{decl.name}' are nested too deeply to check", **decl_pos,
                 hint="shorten chains of lets that refer to each other")
        result, more = None, sink.items
    diags.extend(more)
    if result is None or has_errors(diags):
        errs = sorted(diags, key=report_order)
        raise CheckError(errs[0].message, diagnostics=errs)
    return result, diags


def _resolve_layered(links: list[tuple[ast.SchemeDecl, Source]], found: list[Diagnostic], src: Source,
                     overrides: dict[str, Any], struct: dict[str, int], count: int | None
                     ) -> tuple[Scheme, list[Diagnostic]]:
    """A scheme with a ``layers`` block (its own or its base's; ``links``: its extends chain, root first,
    ``found``: what the chain reported): its parts resolved by :func:`resolve`, the chain's own
    statements by the Resolver (``-P layers=N`` gives the layer count when the model does not)."""
    decl = links[-1][0]
    if has_errors(found):
        errs = sorted(found, key=report_order)
        raise CheckError(errs[0].message, diagnostics=errs)
    if "layers" in overrides:
        count = layer_count_override(overrides.pop("layers"), count, decl, src)

    def shell(own: dict[str, Any], shape: dict[str, int]) -> tuple[Scheme | None, list[Diagnostic]]:
        notes: list[Diagnostic] = []
        merged = merge(links, notes)
        result, more = Resolver(merged, own, shape, src).resolve()
        return result, notes + more

    result, diags = resolve_layered(links, overrides, struct, count, resolve, shell)
    diags = found + diags
    if result is None or has_errors(diags):
        errs = sorted(diags, key=report_order)
        raise CheckError(errs[0].message, diagnostics=errs)
    return result, diags


def check_all(src: Source, params: dict[str, Any] | None = None) -> list[Diagnostic]:
    """Every diagnostic (errors and warnings) for every scheme of a file."""
    out: list[Diagnostic] = []
    seen: set[tuple] = set()
    names: dict[str, ast.SchemeDecl] = {}
    if not src.module.schemes:
        sink = sink_for(src)
        sink.add("E215", f"{src.file or 'the input'} declares no scheme", line=1, col=1,
                 hint='write one: scheme name "description" { ... }')
        return sink.items
    for decl in src.module.schemes:
        if decl.name in names:
            sink = sink_for(src)
            first = names[decl.name].span
            sink.add("E205", f"scheme '{decl.name}' is declared twice", **node_pos(decl),
                     hint=f"the first is on line {first.line}" if first else None)
            out.extend(sink.items)
            continue
        names[decl.name] = decl
        own = {k: v for k, v in (params or {}).items()}
        if not any(is_layered(d) for d, _ in chain(decl, src, [])) and any(is_layered(d) for d in src.module.schemes):
            own.pop("layers", None)  # -P layers=N is the layer count of the file's layers schemes
        try:
            _, diags = resolve(src, decl.name, own)
        except CheckError as err:
            diags = err.diagnostics
        except ParseError as err:  # pragma: no cover - parsing happened already
            diags = err.diagnostics
        for d in diags:
            key = (d.file, d.line, d.col, d.code, d.message)
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out
