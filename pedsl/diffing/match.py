"""Matching for :mod:`pedsl.diffing`: how elements of scheme A pair with elements of scheme B.

Names first, then similarity (sqlglot's diff matches leaves by similarity the same way):

- parameters: a name only in A pairs with a name only in B when they are used the same
  way (the expressions that mention them are equal with the name blanked) or, unused or
  used identically, hold the same value; best score first;
- channel groups: equal channels, equal spec (modulo parameter renames), or mostly shared
  channels (Jaccard > 0.6) between groups of the same role (both transported or both plain);
- transports: by the (mapped) channel group, then by kind; biases: by kind.

Also the canonical texts of transports and biases used in edit values and reports.
"""

from __future__ import annotations

import re
from typing import Any

from pedsl.lang import ast
from pedsl.lang.exprs import names_in, to_source, transform
from pedsl.lang.scheme import Scheme


def transport_fields(t) -> dict[str, ast.Expr]:
    if t.kind == "rotate" and t.xpos_gamma is not None:  # xpos(...): its static gamma and zeta as numbers
        return {"phase": t.phase, "gamma": ast.Num(value=t.xpos_gamma), "zeta": ast.Num(value=t.xpos_zeta)}
    if t.kind == "rotate":
        return {"phase": t.phase, **({"scale": t.scale_expr} if t.scale_expr is not None else {})}
    if t.kind == "accumulate_rotation":
        return {"angle": t.angle}
    if t.kind == "dense_rotation":  # static arguments only: each as the number or truth value it folded to
        return {"block": ast.Num(value=t.block), "shared": ast.Bool(value=t.mode == "shared"),
                "split": ast.Bool(value=t.mode == "split"), "basis": ast.Bool(value=t.basis),
                "per_head": ast.Bool(value=t.per_head), "init": ast.Num(value=t.init)}
    return {"w": t.w, "beta": t.beta}


def transport_source(t) -> str:
    """The transport as one would write it in a `.pe` file (without the targets)."""
    f = {k: to_source(v) for k, v in transport_fields(t).items()}
    if t.kind == "rotate" and "gamma" in f:
        return f"xpos({f['phase']}, gamma = {f['gamma']}, zeta = {f['zeta']})"
    if t.kind == "rotate":
        return f"rotate({f['phase']}" + (f", scale = {f['scale']})" if "scale" in f else ")")
    if t.kind == "accumulate_rotation":
        return f"accumulate(rotation({f['angle']}))"
    if t.kind == "dense_rotation":
        return t.source()
    return f"accumulate(householder(w = {f['w']}, beta = {f['beta']}))"


def bias_source(b) -> str:
    return to_source(b.term) if b.kind == "distance" else f"accumulate({to_source(b.log_gate)})"


def bias_expr(b) -> ast.Expr:
    return b.term if b.kind == "distance" else b.log_gate


def rename(e: ast.Expr, mapping: dict[str, str]) -> ast.Expr:
    if not mapping:
        return e
    return transform(e, lambda n: ast.Name(id=mapping[n.id]) if n.kind == "name" and n.id in mapping else None)


def rename_text(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: mapping.get(m.group(0), m.group(0)), text)


def _all_exprs(s: Scheme) -> list[ast.Expr]:
    out = [e for t in s.transports for e in transport_fields(t).values()]
    out += [bias_expr(b) for b in s.biases]
    if s.temperature is not None:
        out.append(s.temperature)
    return out


def _uses(s: Scheme, name: str) -> set[str]:
    """Where ``name`` occurs: the texts of the expressions (and group specs) using it, with it blanked."""
    out = {to_source(rename(e, {name: "\u00a7"})) for e in _all_exprs(s) if name in names_in(e)}
    out |= {rename_text(g.spec, {name: "\u00a7"}) for g in s.groups if re.search(rf"\b{name}\b", g.spec)}
    return out


def _same_kind(a: Any, b: Any) -> bool:
    num = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return (isinstance(a, num) and isinstance(b, num)) or type(a) is type(b)


# ---------------------------------------------------------------------- matching


def match_params(a: Scheme, b: Scheme) -> dict[str, str]:
    """A's parameter names -> B's: same names, then renames (same uses in expressions, or same value and uses)."""
    mapping = {n: n for n in a.params if n in b.params}
    only_a = [n for n in a.params if n not in b.params]
    only_b = [n for n in b.params if n not in a.params]
    scored = []
    for x in only_a:
        ua = _uses(a, x)
        for y in only_b:
            va, vb = a.params[x], b.params[y]
            if not _same_kind(va, vb):
                continue
            ub = _uses(b, y)
            overlap = len(ua & ub) / len(ua | ub) if (ua | ub) else 0.0
            if overlap > 0 or (va == vb and ua == ub):
                scored.append((overlap + (0.5 if va == vb else 0.0), only_a.index(x), only_b.index(y), x, y))
    for _, _, _, x, y in sorted(scored, key=lambda r: (-r[0], r[1], r[2])):
        if x not in mapping and y not in mapping.values():
            mapping[x] = y
    return mapping


def match_groups(a: Scheme, b: Scheme, pmap: dict[str, str]) -> dict[str, str]:
    """A's channel groups -> B's: same names, then same channels, same spec, or mostly shared channels."""
    bnames = {g.name for g in b.groups}
    mapping = {g.name: g.name for g in a.groups if g.name in bnames}
    only_a = [g for g in a.groups if g.name not in mapping]
    only_b = [g for g in b.groups if g.name not in mapping.values()]
    carries_a = {t.group for t in a.transports}
    carries_b = {t.group for t in b.transports}
    scored = []
    for i, ga in enumerate(only_a):
        for j, gb in enumerate(only_b):
            sa, sb = set(ga.channels), set(gb.channels)
            jac = len(sa & sb) / len(sa | sb) if sa | sb else 1.0
            same_spec = rename_text(ga.spec, pmap) == gb.spec
            same_role = (ga.name in carries_a) == (gb.name in carries_b)  # both transported, or both plain
            if ga.channels == gb.channels or same_spec or (same_role and jac > 0.6):
                scored.append((2.0 * (ga.channels == gb.channels) + same_spec + jac, i, j, ga.name, gb.name))
    for _, _, _, x, y in sorted(scored, key=lambda r: (-r[0], r[1], r[2])):
        if x not in mapping and y not in mapping.values():
            mapping[x] = y
    return mapping


def pair_up(items_a: list, items_b: list, keys) -> list[tuple[int, int]]:
    """Greedy pairing of two lists: for each key function in turn, pair unpaired items with equal keys."""
    pairs: list[tuple[int, int]] = []
    used_a: set[int] = set()
    used_b: set[int] = set()
    for key in keys:
        for i, x in enumerate(items_a):
            if i in used_a:
                continue
            for j, y in enumerate(items_b):
                if j not in used_b and key(x) == key(y, True):
                    pairs.append((i, j))
                    used_a.add(i)
                    used_b.add(j)
                    break
    return pairs
