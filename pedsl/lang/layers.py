"""Per-layer schemes: a scheme whose body is a ``layers { ... }`` block, resolved into a :class:`LayerMap`.

A ``layers`` block names other schemes (its parts, declared in the file or an imported one; each is
resolved as an ordinary scheme, ``extends`` included) and says which layer takes which. A scheme that
extends a ``layers`` scheme inherits its map and may add training / evaluation settings or a
``layers`` block of its own, which replaces the base's. Its rules and
their precedence (docs/semantics.md "Per-layer schemes"): ``at([i, ...])`` over ``first(n)`` /
``last(n)`` over ``every(k)`` over ``pattern = [...]`` / ``default``. Checked here: the rule names and
arguments (E250), the parts (unknown E251; nested or disagreeing parts E252), rules of one tier that
name the same layer (E253) and, when the model's layer count is known, the fit (E254).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pedsl import limits
from pedsl.errors import CheckError, Diagnostic, ParamError, did_you_mean, quoted
from pedsl.lang import ast
from pedsl.lang.diagnostics import has_errors, node_pos, sink_for
from pedsl.lang.imports import Source
from pedsl.lang.inherit import chain, visible_schemes
from pedsl.lang.scheme import LAYER_RULES, LAYER_TIERS, LayerMap, LayerRule, Scheme

# what a `layers` scheme may hold beside its block: its own training / evaluation settings and `allow`
SHELL_STATEMENTS = ("layers", "section", "allow")
STRUCTURAL = ("heads", "head_dim")

PartResolver = Callable[[Source, str, dict[str, Any], dict[str, int]], tuple[Scheme, list[Diagnostic]]]


def is_layered(decl: ast.SchemeDecl) -> bool:
    return any(st.kind == "layers" for st in decl.body)


class _Reporter:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.diags: list[Diagnostic] = []

    def __call__(self, code: str, message: str, node: Any, hint: str | None = None) -> None:
        sink = sink_for(self.src)
        sink.add(code, message, hint=hint, **node_pos(node))
        self.diags.extend(sink.items)


def _int_literal(expr: ast.Expr, least: int) -> int | None:
    if expr.kind == "num" and isinstance(expr.value, int) and least <= expr.value <= limits.MAX_LAYERS:
        return expr.value
    return None


def _pattern_parts(value: ast.Expr, report: _Reporter) -> tuple[str, ...] | None:
    if value.kind != "list" or not value.items:
        report("E250", "a pattern is a list of scheme names, each optionally repeated", value,
               hint="write pattern = [local * 5, global]")
        return None
    out: list[str] = []
    for item in value.items:
        if item.kind == "name":
            out.append(item.id)
            continue
        if item.kind != "binary" or item.op != "*" or (count := _int_literal(item.right, 1)) is None \
                or item.left.kind != "name":
            report("E250", "a pattern item is a scheme name or 'name * count' (a whole number >= 1)", item,
                   hint="write local * 5")
            return None
        out.extend([item.left.id] * count)
    if len(out) > limits.MAX_LAYERS:
        report("E250", f"the pattern is {len(out)} layers long; the limit is {limits.MAX_LAYERS}", value)
        return None
    return tuple(out)


def _rule(r: ast.LayerRule, report: _Reporter) -> LayerRule | None:
    """The checked rule, or None after reporting what is wrong with it."""
    if r.rule not in LAYER_RULES:
        report("E250", f"unknown layer rule '{r.rule}'", r,
               hint=did_you_mean(r.rule, LAYER_RULES) or "the rules are: " + ", ".join(LAYER_RULES))
        return None
    pos = {"line": r.span.line, "col": r.span.col} if r.span else {}
    wants_args = r.rule in ("every", "first", "last", "at")
    args = r.args if r.args is not None else ()
    if wants_args != (len(args) == 1):
        form = {"every": "every(4)", "first": "first(2)", "last": "last(2)", "at": "at([0, 5])"}.get(r.rule)
        report("E250", f"'{r.rule}' takes " + ("one argument" if wants_args else "no arguments"), r,
               hint=f"write {form} = scheme" if form else f"write {r.rule} = ...")
        return None
    if r.rule == "pattern":
        parts = _pattern_parts(r.value, report)
        return None if parts is None else LayerRule(rule="pattern", parts=parts, **pos)
    if r.value.kind != "name":
        report("E250", f"'{r.rule}' takes one scheme by name", r.value, hint=f"write {r.rule} = my_scheme"
               + (" (a list is for pattern = [...])" if r.value.kind == "list" else ""))
        return None
    part = (r.value.id,)
    if r.rule == "default":
        return LayerRule(rule="default", parts=part, **pos)
    if r.rule == "at":
        arg = args[0]
        items = arg.items if arg.kind == "list" else ()
        layers = [_int_literal(x, 0) for x in items]
        if not items or None in layers:
            report("E250", "at([...]) takes a list of layer indices (whole numbers from 0)", arg,
                   hint="write at([0, 5, 9]) = scheme")
            return None
        if len(set(layers)) != len(layers):
            report("E253", "at([...]) names a layer twice", arg)
            return None
        return LayerRule(rule="at", parts=part, layers=tuple(layers), **pos)
    n = _int_literal(args[0], 1)
    if n is None:
        report("E250", f"{r.rule}(n) takes a whole number >= 1", args[0], hint=f"write {r.rule}(2) = scheme")
        return None
    return LayerRule(rule=r.rule, parts=part, n=n, **pos)


def _static_overlaps(rules: list[tuple[LayerRule, ast.LayerRule]], report: _Reporter) -> None:
    """Rules of one tier that name a layer in common whatever the layer count."""
    seen: dict[tuple, ast.LayerRule] = {}
    at_layers: dict[int, ast.LayerRule] = {}
    for rule, node in rules:
        tier_keys: dict[str, list[tuple]] = {
            "pattern": [("cycle",)], "default": [("cycle",)], "first": [("first",)], "last": [("last",)],
            "every": [("every", rule.n)], "at": []}
        keys = tier_keys[rule.rule]
        for layer in rule.layers:
            if layer in at_layers:
                report("E253", f"layer {layer} is named by two at([...]) rules", node, hint=_first_on(at_layers[layer]))
            at_layers.setdefault(layer, node)
        for key in keys:
            if key in seen:
                what = "a pattern and a default" if key == ("cycle",) else f"two {rule.rule} rules"
                what = "two patterns" if key == ("cycle",) and seen[key].rule == rule.rule == "pattern" else what
                what = "two defaults" if key == ("cycle",) and seen[key].rule == rule.rule == "default" else what
                report("E253", f"{what}: both would give every layer they name a part", node,
                       hint=_first_on(seen[key]))
            seen.setdefault(key, node)
    everies = [(r, n) for r, n in rules if r.rule == "every"]
    for i, (a, _) in enumerate(everies):
        for b, node in everies[i + 1:]:
            both = math.lcm(a.n, b.n)
            if a.n != b.n and both <= limits.MAX_LAYERS:
                report("E253", f"every({a.n}) and every({b.n}) both name layer {both - 1} (and every {both}th layer)",
                       node, hint="rules of one rank may not share a layer: name such layers with at([...]), "
                       "which ranks above every(k)")


def _first_on(node: ast.Node) -> str | None:
    return f"the first is on line {node.span.line}" if node.span else None


def _parts(rules: list[tuple[LayerRule, ast.LayerRule]], decl: ast.SchemeDecl, src: Source,
           report: _Reporter) -> dict[str, tuple[ast.SchemeDecl, Source]]:
    """Every part the rules name: declared, and not a `layers` scheme itself."""
    scope = visible_schemes(src)
    plain = [n for n, (d, _) in scope.items() if not is_layered(d)]
    out: dict[str, tuple[ast.SchemeDecl, Source]] = {}
    for rule, node in rules:
        for name in dict.fromkeys(rule.parts):
            where = _name_node(node.value, name)
            found = scope.get(name)
            if found is None:
                report("E251", f"the layers of '{decl.name}' name unknown scheme '{name}'", where,
                       hint=did_you_mean(name, plain) or "declare it in this file or import the file that declares it")
                continue
            nested = [d.name for d, _ in chain(*found, []) if is_layered(d)]
            if nested:
                report("E252", f"'{name}' has a layers block of its own ({nested[-1]}): the parts of a layers "
                       "block are ordinary schemes", where, hint="name the schemes of its layers here directly")
                continue
            out[name] = found
    return out


def _name_node(value: ast.Expr, name: str) -> ast.Node:
    for item in (value.items if value.kind == "list" else (value,)):
        node = item.left if item.kind == "binary" else item
        if node.kind == "name" and node.id == name:
            return node
    return value


def layer_count_override(raw: Any, count: int | None, decl: ast.SchemeDecl, src: Source) -> int:
    """``-P layers=N``: a whole number in 1 .. MAX_LAYERS that agrees with the model's count when that is known."""
    value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    problem = None
    if value is None or not 1 <= value <= limits.MAX_LAYERS:
        problem = (f"-P layers= takes the model's layer count, a whole number in 1 .. {limits.MAX_LAYERS}, got "
                   f"{quoted(raw, 60)}", "give -P layers=26")
    elif count is not None and value != count:
        problem = (f"-P layers={value} but the model has {count} layers", "leave -P layers out: the model's count is used")
    if problem is not None:
        sink = sink_for(src)
        sink.add("E302" if value is None else "E303", problem[0], hint=problem[1], **node_pos(decl))
        raise ParamError(problem[0], diagnostics=sink.items)
    assert value is not None  # a value that is not a whole number is a problem, raised above
    return value


def check_fit(layer_map: LayerMap, count: int, report: Callable[[str, str, dict, str | None], None]) -> None:
    """Report (E254, E253) where the rules do not fit a model of ``count`` layers: a rule naming a
    layer the model does not have, a layer with no part, two rules of one tier on one layer."""
    pos = lambda r: {"line": r.line, "col": r.col} if r.line else {}  # noqa: E731
    for r in layer_map.rules:
        too_far = {"pattern": len(r.parts) > count, "every": r.n > count, "first": r.n > count,
                   "last": r.n > count, "at": any(i >= count for i in r.layers)}.get(r.rule, False)
        if too_far:
            what = {"pattern": f"the pattern is {len(r.parts)} layers long",
                    "at": "it names layer " + ", ".join(str(i) for i in r.layers if i >= count)}.get(
                        r.rule, f"{r.rule}({r.n}) asks for {r.n} layers")
            report("E254", f"'{r.text}' does not fit a model of {count} layers: {what} (layers are 0 .. {count - 1})",
                   pos(r), "give the model more layers (n_layers) or change the rule")
    missing = [i for i in range(count) if layer_map.rule_for(i, count) is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        report("E254", f"layers {shown} of the model's {count} have no part", pos(layer_map.rules[0]),
               "add default = scheme (or a pattern) for the layers no other rule names")
    for i in range(count):
        named = [r for r in layer_map.rules if r.names(i, count)]
        best = min((LAYER_TIERS[r.rule] for r in named), default=None)
        top = [r for r in named if LAYER_TIERS[r.rule] == best]
        if len(top) > 1 and {r.rule for r in top} != {"pattern", "default"}:  # those two are refused statically
            report("E253", f"layer {i} of {count} is named by both '{top[0].text}' and '{top[1].text}', which rank "
                   "the same", pos(top[1]), "precedence: at > first / last > every > pattern / default")
            return


def _check_chain(links: list[tuple[ast.SchemeDecl, Source]]) -> list[Diagnostic]:
    """A scheme that extends a ``layers`` scheme inherits its layer map (the nearest ``layers`` block of the
    chain is the one that counts) and may add only what a ``layers`` scheme holds; a ``layers`` scheme
    extends only another one."""
    diags: list[Diagnostic] = []
    for i, (d, s) in enumerate(links):
        report = _Reporter(s)
        base = links[i - 1][0] if i else None
        extends_layers = any(is_layered(b) for b, _ in links[:i])
        if base is not None and is_layered(d) and not extends_layers:
            report("E250", f"'{d.name}' has a layers block and extends '{base.name}', which has none: a layers "
                   "scheme extends only another layers scheme", d,
                   hint="extend the parts instead (scheme local extends base { ... })")
        blocks = [st for st in d.body if st.kind == "layers"]
        for twice in blocks[1:]:
            report("E205", f"'layers' is declared twice in scheme '{d.name}'", twice, hint=_first_on(blocks[0]))
        if not blocks and not extends_layers:
            continue  # a plain scheme a layers scheme extends: that one is refused (E250), not these statements
        for st in d.body:
            if st.kind not in SHELL_STATEMENTS:
                what = "a scheme with a layers block" if blocks \
                    else f"a scheme extending the layers scheme '{links[i - 1][0].name}'"
                report("E250", f"{what} holds only layers, train, eval and allow, not '{st.kind}'", st,
                       hint="put it in a part (each part is an ordinary scheme)")
        diags.extend(report.diags)
    return diags


def resolve_layered(links: list[tuple[ast.SchemeDecl, Source]], overrides: dict[str, Any], struct: dict[str, int],
                    count: int | None, resolve_part: PartResolver, resolve_shell: Callable[[dict, dict], tuple]
                    ) -> tuple[Scheme | None, list[Diagnostic]]:
    """The scheme (the last of its ``extends`` chain ``links``, root first) with its :class:`LayerMap`.
    ``resolve_part`` resolves one part (the ordinary resolver), ``resolve_shell(overrides, struct)`` the
    chain's train/eval/allow statements."""
    decl, src = next((d, s) for d, s in reversed(links) if is_layered(d))  # the block that counts
    report = _Reporter(src)
    report.diags.extend(_check_chain(links))
    blocks = [st for st in decl.body if st.kind == "layers"]
    rules = [(r, node) for node in blocks[0].rules if (r := _rule(node, report)) is not None]
    if not blocks[0].rules:
        report("E250", f"the layers block of '{decl.name}' is empty", blocks[0], hint="write default = scheme")
    _static_overlaps(rules, report)
    found = _parts(rules, decl, src, report)
    if has_errors(report.diags):
        return None, report.diags
    parts = _resolve_parts(found, decl, src, overrides, struct, resolve_part, report)
    if parts is None:
        return None, report.diags
    layer_map = LayerMap(rules=tuple(r for r, _ in rules), parts=parts, count=count)
    if count is not None:
        check_fit(layer_map, count, lambda code, msg, pos, hint: report(code, msg, _At(pos), hint))
        if has_errors(report.diags):
            return None, report.diags
    shell_over = {k: v for k, v in overrides.items() if k in STRUCTURAL}
    first = next(iter(parts.values()))
    shell, diags = resolve_shell(shell_over, {**struct, "heads": first.heads, "head_dim": first.head_dim})
    report.diags.extend(diags)
    if shell is None:
        return None, report.diags
    own = {k: v for k, v in overrides.items() if k not in STRUCTURAL}
    return shell.model_copy(update={"layers": layer_map, "params": own, "groups": ()}), report.diags


class _At:
    def __init__(self, pos: dict) -> None:
        self.span = ast.Span(line=pos["line"], col=pos["col"], end_line=pos["line"], end_col=pos["col"] + 1) \
            if pos else None


def _resolve_parts(found, decl, src, overrides, struct, resolve_part, report) -> dict[str, Scheme] | None:
    """Each part resolved with the ``-P`` values it declares (heads / head_dim go to all); they must agree
    on heads and head_dim."""
    declared = {name: _declared_params(d, s) for name, (d, s) in found.items()}
    for key in overrides:
        if key not in STRUCTURAL and not any(key in names for names in declared.values()):
            known = sorted(set().union(*declared.values()))
            message = f"unknown parameter '{key}' (-P {key}=...) for scheme '{decl.name}': no part declares it"
            sink = sink_for(src)
            sink.add("E301", message, **node_pos(decl), hint=did_you_mean(key, known + ["layers"])
                     or "its parts' parameters are: " + (", ".join(known) or "none") + "; -P layers=N sets the "
                     "layer count")
            raise ParamError(message, diagnostics=sink.items)
    parts: dict[str, Scheme] = {}
    for name, (d, s) in found.items():
        own = {k: v for k, v in overrides.items() if k in STRUCTURAL or k in declared[name]}
        try:
            part, diags = resolve_part(s, name, own, struct)
        except (CheckError, ParamError) as err:
            report.diags.extend(err.diagnostics)
            continue
        report.diags.extend(diags)
        parts[name] = part
    if has_errors(report.diags):
        return None
    shapes = {(p.heads, p.head_dim) for p in parts.values()}
    if len(shapes) > 1:
        shown = ", ".join(f"{n}: heads {p.heads}, head_dim {p.head_dim}" for n, p in parts.items())
        report("E252", f"the parts of '{decl.name}' disagree on the attention's shape ({shown})", blocks_of(decl),
               hint="pedsl builds every layer with one heads and head_dim (models whose layers differ, as Gemma 4's "
                    "full layers at head_dim 512 beside its sliding ones at 256, are not expressible yet): give "
                    "the parts the same ones")
        return None
    return parts


def blocks_of(decl: ast.SchemeDecl) -> ast.Node:
    return next(st for st in decl.body if st.kind == "layers")


def _declared_params(decl: ast.SchemeDecl, src: Source) -> set[str]:
    return {st.name for d, _ in chain(decl, src, []) for st in d.body if st.kind == "param"}


def layer_map_lines(layer_map: LayerMap, count: int | None = None) -> list[str]:
    """The rules (highest rank first) and, for a known layer count, the part of every layer: what
    ``show``, ``explain`` and ``graph`` print."""
    count = count or layer_map.count
    rules = sorted(layer_map.rules, key=lambda r: LAYER_TIERS[r.rule])
    out = ["  rules (a layer takes the first that names it): " + "; ".join(r.text for r in rules)]
    if count is None:
        out.append("  layer count not known here (-P layers=N shows the map)")
        return out
    parts = layer_map.assign(count)
    out.append(f"  {count} layers:")
    start = 0
    for i in range(1, count + 1):  # runs of one part on one line
        if i == count or parts[i] != parts[start]:
            where = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            out.append(f"    {where:>9}  {parts[start]}")
            start = i
    return out
