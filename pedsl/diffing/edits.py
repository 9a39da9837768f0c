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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from pedsl.diffing.match import (bias_expr, bias_source, match_groups, match_params, pair_up, rename,
                                 rename_text, transport_fields, transport_source)
from pedsl.lang.channels import channel_ranges as ranges
from pedsl.lang.exprs import to_source, walk
from pedsl.errors import UsageError
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import compared
from pedsl.lang.api import load

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
    return load(x, params=params, scheme=scheme)


# ---------------------------------------------------------------------- the edit script


def _optional(name: str, old: Any, new: Any, out: list, value: Callable, show: Callable = lambda v: v) -> None:
    """An element a scheme may lack (a temperature, a window ...): inserted, removed, or compared."""
    if old is None and new is not None:
        out.append(Insert(name, show(new)))
    elif old is not None and new is None:
        out.append(Remove(name, show(old)))
    elif old is not None:
        value(name, old, new)


def diff(a: Scheme | str | Path, b: Scheme | str | Path, *, keep: bool = False) -> list[Edit]:
    """The edits that turn scheme ``a`` into scheme ``b`` (Schemes, paths or `.pe` texts).

    Empty when the resolved schemes are the same; ``keep=True`` adds a
    :class:`Keep` for every matched, unchanged element.
    """
    a, b = as_scheme(a), as_scheme(b)
    for s in (a, b):
        if s.layers is not None:  # its attention is its parts': a diff of the shell would read as NoPE
            raise UsageError(f"scheme '{s.name}' gives its layers different schemes ({', '.join(s.layers.parts)}); "
                             "pedsl diff compares two attentions", hint=f"diff its parts (FILE:{next(iter(s.layers.parts))})")
    out: list[Edit] = []

    def value(path: str, old: Any, new: Any) -> None:
        if old != new:
            out.append(Update(path, old, new))
        elif keep:
            out.append(Keep(path, new))

    for field in ("name", "doc", "heads", "head_dim"):
        value(field, getattr(a, field), getattr(b, field))
    _statements("header", a, b, renamed={}, out=out, value=value)

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
        value(f"channels.{gb.name}.spec", rename_text(ga.spec, renamed), gb.spec)
        value(f"channels.{gb.name}.channels", ranges(ga.channels), ranges(gb.channels))
    out += [Insert(f"channels.{g.name}", f"{g.spec}: channels {ranges(g.channels)}")
            for g in b.groups if g.name not in gmap.values()]

    _transports(a, b, gmap, renamed, out, value)
    _biases(a, b, renamed, out, value)

    _statements("body", a, b, renamed, out, value)
    value("learned.shared", _shared_learned(a, renamed), _shared_learned(b, {}))

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


def _statements(place: str, a: Scheme, b: Scheme, renamed: dict, out: list, value) -> None:
    """The edits of the statements compared at ``place`` (their records' Diff, pedsl.lang.statements)."""
    for d in compared(place):
        va, vb = d.value(a), d.value(b)
        if d.expr:
            va = None if va is None else to_source(rename(va, renamed))
            vb = None if vb is None else to_source(vb)
        if d.optional:
            _optional(d.path, va, vb, out, value, show=d.show)
        else:
            value(d.path, va, vb)


def _shared_learned(s: Scheme, renamed: dict) -> list[str]:
    """The learned values read more than once (a let's, docs/language.md): ``"CALL read N times"``. The
    inlined text of ``c * sigmoid(c)`` and of the same call written twice is one, so this is where
    one set of parameters and two differ; let names do not show."""
    exprs = [e for t in s.transports for e in transport_fields(t).values()] + [bias_expr(b) for b in s.biases]
    uses: dict[tuple, tuple[str, int]] = {}
    for e in exprs + ([s.temperature] if s.temperature is not None else []):
        for node in walk(e):
            if node.kind == "call" and node.bound is not None:
                text, n = uses.get(node.bound, (to_source(rename(node, renamed)), 0))
                uses[node.bound] = (text, n + 1)
    return sorted(f"{text} read {n} times" for text, n in uses.values() if n > 1)


def _transports(a: Scheme, b: Scheme, gmap: dict, renamed: dict, out: list, value) -> None:
    ta, tb = list(a.transports), list(b.transports)
    pairs = pair_up(ta, tb, (
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
        fx = {k: to_source(rename(e, renamed)) for k, e in transport_fields(x).items()}
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
    src_a = [to_source(rename(bias_expr(x), renamed)) for x in ba]
    src_b = [to_source(bias_expr(y)) for y in bb]
    pairs = pair_up(list(range(len(ba))), list(range(len(bb))), (
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


__all__ = ["Edit", "Insert", "Remove", "Move", "Update", "Keep", "diff", "equivalent", "is_semantic", "edit_kind"]

