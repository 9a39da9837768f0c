"""Typed edits between two resolved schemes: ``pedsl.diff(a, b) -> list[Edit]``.

The algorithm follows sqlglot's ``diff.py`` in spirit (match first, then derive
an edit script of Insert/Remove/Move/Update/Keep), specialised to the resolved
IR (:mod:`pedsl.lang.scheme`), whose shape is known:

1. Both sides are *resolved* schemes (after imports, ``extends`` and ``-P``), so
   layout, comments, ``let`` names and the extends chain never show up; source
   text, hashes, file names and spans are not compared.
2. Named things are matched by name first, then by similarity where names
   differ: a parameter renamed in B (same value, or the same uses in the
   expressions) is ONE :class:`Move`; a channel group with the same channels or
   spec is a Move; transports pair by (mapped) channel group, then by kind;
   biases by kind.
3. A's expressions are compared *modulo the renames* (A's names rewritten to
   B's), so an expression that only mentions a renamed parameter is unchanged.

Paths are readable: ``params.factor``, ``channels.rot.spec``,
``transport[rot].phase``, ``transport[all].kind``, ``bias[gate]``,
``temperature``, ``train.context``. Values are plain data (expressions as their
canonical source text), so tests compare exact edit lists::

    >>> pedsl.diff("schemes/rope.pe", "schemes/pi.pe")
    [Update('name', 'rope', 'pi'), Update('doc', ...), Insert('params.factor', 4.0),
     Update('transport[all].phase', 'geometric(base) * position', 'geometric(base) * position / factor')]
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from pedsl.lang import ast
from pedsl.lang.exprs import names_in, to_source, transform
from pedsl.lang.scheme import Scheme

# Edits on these paths change no meaning: two schemes differing only there are equivalent.
METADATA = ("name", "doc", "allow")


@dataclass(frozen=True)
class Insert:
    """Something in B that A does not have."""

    path: str
    value: Any

    def __repr__(self) -> str:
        return f"Insert({self.path!r}, {self.value!r})"


@dataclass(frozen=True)
class Remove:
    """Something in A that B does not have."""

    path: str
    value: Any

    def __repr__(self) -> str:
        return f"Remove({self.path!r}, {self.value!r})"


@dataclass(frozen=True)
class Move:
    """A renamed (or re-attached) element: ``path`` in A is ``new_path`` in B."""

    path: str
    new_path: str

    def __repr__(self) -> str:
        return f"Move({self.path!r}, {self.new_path!r})"


@dataclass(frozen=True)
class Update:
    """A matched element whose value changed (``path`` is B's path)."""

    path: str
    old: Any
    new: Any

    def __repr__(self) -> str:
        return f"Update({self.path!r}, {self.old!r}, {self.new!r})"


@dataclass(frozen=True)
class Keep:
    """A matched, unchanged element (only with ``diff(..., keep=True)``)."""

    path: str
    value: Any

    def __repr__(self) -> str:
        return f"Keep({self.path!r}, {self.value!r})"


Edit = Union[Insert, Remove, Move, Update, Keep]


def edit_kind(e: Edit) -> str:
    return type(e).__name__.lower()


def is_semantic(e: Edit) -> bool:
    """False for edits that change no meaning (name, doc, lint allowances) and for Keep."""
    if isinstance(e, Keep):
        return False
    root = re.split(r"[.\[]", e.path, maxsplit=1)[0]
    return root not in METADATA


def equivalent(edits: list[Edit]) -> bool:
    return not any(is_semantic(e) for e in edits)


# ---------------------------------------------------------------------- helpers


def as_scheme(x: Scheme | str | Path, params: dict | None = None, scheme: str | None = None) -> Scheme:
    if isinstance(x, Scheme) and not params:
        return x
    from pedsl.lang.api import load

    return load(x, params=params, scheme=scheme)


def ranges(chans) -> str:
    """Channel indices as compact ranges: (0, 1, 2, 3, 8, 9) -> '0-3, 8-9'."""
    chans = sorted(chans)
    out, i = [], 0
    while i < len(chans):
        j = i
        while j + 1 < len(chans) and chans[j + 1] == chans[j] + 1:
            j += 1
        out.append(str(chans[i]) if i == j else f"{chans[i]}-{chans[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def transport_fields(t) -> dict[str, ast.Expr]:
    if t.kind == "rotate":
        return {"phase": t.phase}
    if t.kind == "accumulate_rotation":
        return {"angle": t.angle}
    return {"w": t.w, "beta": t.beta}


def transport_source(t) -> str:
    """The transport as one would write it in a `.pe` file (without the targets)."""
    f = {k: to_source(v) for k, v in transport_fields(t).items()}
    if t.kind == "rotate":
        return f"rotate({f['phase']})"
    if t.kind == "accumulate_rotation":
        return f"accumulate(rotation({f['angle']}))"
    return f"accumulate(householder(w = {f['w']}, beta = {f['beta']}))"


def bias_source(b) -> str:
    return to_source(b.term) if b.kind == "distance" else f"accumulate({to_source(b.log_gate)})"


def _bias_expr(b) -> ast.Expr:
    return b.term if b.kind == "distance" else b.log_gate


def _rename(e: ast.Expr, mapping: dict[str, str]) -> ast.Expr:
    if not mapping:
        return e
    return transform(e, lambda n: ast.Name(id=mapping[n.id]) if n.kind == "name" and n.id in mapping else None)


def _rename_text(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: mapping.get(m.group(0), m.group(0)), text)


def _all_exprs(s: Scheme) -> list[ast.Expr]:
    out = [e for t in s.transports for e in transport_fields(t).values()]
    out += [_bias_expr(b) for b in s.biases]
    if s.temperature is not None:
        out.append(s.temperature)
    return out


def _uses(s: Scheme, name: str) -> set[str]:
    """Where ``name`` occurs: the texts of the expressions (and group specs) using it, with it blanked."""
    out = {to_source(_rename(e, {name: "\u00a7"})) for e in _all_exprs(s) if name in names_in(e)}
    out |= {_rename_text(g.spec, {name: "\u00a7"}) for g in s.groups if re.search(rf"\b{name}\b", g.spec)}
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
            same_spec = _rename_text(ga.spec, pmap) == gb.spec
            same_role = (ga.name in carries_a) == (gb.name in carries_b)  # both transported, or both plain
            if ga.channels == gb.channels or same_spec or (same_role and jac > 0.6):
                scored.append((2.0 * (ga.channels == gb.channels) + same_spec + jac, i, j, ga.name, gb.name))
    for _, _, _, x, y in sorted(scored, key=lambda r: (-r[0], r[1], r[2])):
        if x not in mapping and y not in mapping.values():
            mapping[x] = y
    return mapping


def _pair(items_a: list, items_b: list, keys) -> list[tuple[int, int]]:
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


# ---------------------------------------------------------------------- the edit script


def diff(a: Scheme | str | Path, b: Scheme | str | Path, *, keep: bool = False) -> list[Edit]:
    """The edits that turn scheme ``a`` into scheme ``b`` (Schemes, paths or `.pe` texts).

    Empty when the resolved schemes are the same; ``keep=True`` adds a
    :class:`Keep` for every matched, unchanged element.
    """
    a, b = as_scheme(a), as_scheme(b)
    out: list[Edit] = []

    def value(path: str, old: Any, new: Any) -> None:
        if old != new:
            out.append(Update(path, old, new))
        elif keep:
            out.append(Keep(path, new))

    for field in ("name", "doc", "heads", "head_dim", "layout"):
        value(field, getattr(a, field), getattr(b, field))

    pmap = match_params(a, b)
    renamed = {x: y for x, y in pmap.items() if x != y}
    for x, va in a.params.items():
        if x not in pmap:
            out.append(Remove(f"params.{x}", va))
            continue
        if x != pmap[x]:
            out.append(Move(f"params.{x}", f"params.{pmap[x]}"))
        value(f"params.{pmap[x]}", va, b.params[pmap[x]])
    out += [Insert(f"params.{y}", vb) for y, vb in b.params.items() if y not in pmap.values()]

    gmap = match_groups(a, b, renamed)
    gb_by_name = {g.name: g for g in b.groups}
    for ga in a.groups:
        if ga.name not in gmap:
            out.append(Remove(f"channels.{ga.name}", f"{ga.spec}: channels {ranges(ga.channels)}"))
            continue
        gb = gb_by_name[gmap[ga.name]]
        if ga.name != gb.name:
            out.append(Move(f"channels.{ga.name}", f"channels.{gb.name}"))
        value(f"channels.{gb.name}.spec", _rename_text(ga.spec, renamed), gb.spec)
        value(f"channels.{gb.name}.channels", ranges(ga.channels), ranges(gb.channels))
    out += [Insert(f"channels.{g.name}", f"{g.spec}: channels {ranges(g.channels)}")
            for g in b.groups if g.name not in gmap.values()]

    _transports(a, b, gmap, renamed, out, value)
    _biases(a, b, renamed, out, value)

    ta = None if a.temperature is None else to_source(_rename(a.temperature, renamed))
    tb = None if b.temperature is None else to_source(b.temperature)
    if ta is None and tb is not None:
        out.append(Insert("temperature", tb))
    elif ta is not None and tb is None:
        out.append(Remove("temperature", ta))
    elif ta is not None:
        value("temperature", ta, tb)

    for section in ("train", "eval"):
        da, db = getattr(a, section), getattr(b, section)
        for k, v in da.items():
            if k in db:
                value(f"{section}.{k}", v, db[k])
            else:
                out.append(Remove(f"{section}.{k}", v))
        out += [Insert(f"{section}.{k}", v) for k, v in db.items() if k not in da]

    out += [Remove("allow", n) for n in a.allow if n not in b.allow]
    out += [Insert("allow", n) for n in b.allow if n not in a.allow]
    if keep:
        out += [Keep("allow", n) for n in b.allow if n in a.allow]
    return out


def _transports(a: Scheme, b: Scheme, gmap: dict, renamed: dict, out: list, value) -> None:
    ta, tb = list(a.transports), list(b.transports)
    pairs = _pair(ta, tb, (
        lambda t, is_b=False: t.group if is_b else gmap.get(t.group, "\0"),
        lambda t, is_b=False: t.kind,
    ))
    paired_a = {i for i, _ in pairs}
    paired_b = {j for _, j in pairs}
    for i, t in enumerate(ta):
        if i not in paired_a:
            out.append(Remove(f"transport[{t.group}]", f"{t.targets}: {transport_source(t)}"))
    for i, j in sorted(pairs, key=lambda p: p[1]):
        x, y = ta[i], tb[j]
        path = f"transport[{y.group}]"
        if gmap.get(x.group) != y.group:
            out.append(Move(f"transport[{x.group}]", path))
        value(f"{path}.targets", x.targets, y.targets)
        value(f"{path}.kind", x.kind, y.kind)
        fx = {k: to_source(_rename(e, renamed)) for k, e in transport_fields(x).items()}
        fy = {k: to_source(e) for k, e in transport_fields(y).items()}
        out += [Remove(f"{path}.{k}", v) for k, v in fx.items() if k not in fy]
        for k, v in fy.items():
            if k in fx:
                value(f"{path}.{k}", fx[k], v)
            else:
                out.append(Insert(f"{path}.{k}", v))
    out += [Insert(f"transport[{t.group}]", f"{t.targets}: {transport_source(t)}")
            for j, t in enumerate(tb) if j not in paired_b]


def _bias_paths(biases) -> list[str]:
    kinds = [x.kind for x in biases]
    seen: dict[str, int] = {}
    out = []
    for k in kinds:
        seen[k] = seen.get(k, 0) + 1
        out.append(f"bias[{k}]" if kinds.count(k) == 1 else f"bias[{k}.{seen[k]}]")
    return out


def _biases(a: Scheme, b: Scheme, renamed: dict, out: list, value) -> None:
    ba, bb = list(a.biases), list(b.biases)
    pa, pb = _bias_paths(ba), _bias_paths(bb)
    src_a = [to_source(_rename(_bias_expr(x), renamed)) for x in ba]
    src_b = [to_source(_bias_expr(y)) for y in bb]
    pairs = _pair(list(range(len(ba))), list(range(len(bb))), (
        lambda i, is_b=False: ("", bb[i].kind, src_b[i]) if is_b else ("", ba[i].kind, src_a[i]),
        lambda i, is_b=False: bb[i].kind if is_b else ba[i].kind,
    ))
    paired_a = {i for i, _ in pairs}
    paired_b = {j for _, j in pairs}
    out += [Remove(pa[i], bias_source(x)) for i, x in enumerate(ba) if i not in paired_a]
    for i, j in sorted(pairs, key=lambda p: p[1]):
        field = "term" if bb[j].kind == "distance" else "log_gate"
        value(f"{pb[j]}.{field}", src_a[i], src_b[j])
    out += [Insert(pb[j], bias_source(y)) for j, y in enumerate(bb) if j not in paired_b]


# `import pedsl.diff` binds the module as the package attribute `pedsl.diff`, which would
# shadow the lazy function: make the module itself callable, so pedsl.diff(a, b) always works.
class _CallableModule(types.ModuleType):
    def __call__(self, a, b, **kw):
        return diff(a, b, **kw)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["Edit", "Insert", "Remove", "Move", "Update", "Keep", "diff", "equivalent", "is_semantic", "edit_kind"]
