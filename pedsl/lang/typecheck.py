"""Type inference for expressions: names, builtin signatures, axes and what each value reads
(its dependence class, docs/semantics.md §1a; see :mod:`pedsl.lang.types`)."""

from __future__ import annotations

from typing import Callable

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.builtin_defs.record import own_reads
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS, REQUIRED, TypeIssue
from pedsl.lang.types import BOOL, NUM, STR, Kind, Ty, join

AXIS_READERS = ("position", "distance")  # the names read along one axis in a multi-axis scheme
Report = Callable[..., None]  # report(code, message, node, hint=None)


class Checker:
    """Infers the type of expressions in one scheme; reports problems through ``report``.

    ``names`` maps parameter and let names to a thunk giving their type, so lets can be
    typed lazily (and cycles found). ``seen``, when given, receives the type of every node
    inferred, by ``id`` (:func:`pedsl.lang.typed.node_types`). ``axes`` are the scheme's declared
    position axes (``()``: one unnamed axis); None types ``position.AXIS`` without checking the axis
    (resolved expressions, checked once already).
    """

    def __init__(self, names: dict[str, Callable[[], Ty]], report: Report, seen: dict[int, Ty] | None = None,
                 axes: tuple[str, ...] | None = None):
        self.names = names
        self.report = report
        self.seen = seen
        self.axes = axes

    def infer(self, e: ast.Expr) -> Ty | None:
        """The type of e, or None when an error was reported inside it."""
        t = self._infer(e)
        if self.seen is not None and t is not None:
            self.seen[id(e)] = t
        return t

    def _infer(self, e: ast.Expr) -> Ty | None:
        if e.kind == "num":
            return NUM.with_(integer=isinstance(e.value, int))
        if e.kind == "str":
            return STR
        if e.kind == "bool":
            return BOOL
        if e.kind == "list":
            items = [self.infer(i) for i in e.items]
            known = [ty for ty in items if ty is not None]
            if len(known) != len(items):
                return None
            for item, ty in zip(e.items, known):
                if ty.kind != "num" or ty.axes:
                    self.report("E204", f"a list holds plain numbers, not {ty.show()}", item)
                    return None
            return Ty(Kind.LIST)
        if e.kind == "name":
            return self._name(e)
        if e.kind == "unary":
            t = self.infer(e.operand)
            if t is None:
                return None
            if t.kind == "bias":
                return t
            if t.kind not in ("num", "list"):
                self.report("E204", f"cannot negate {t.show()}", e)
                return None
            return t
        if e.kind == "binary":
            return self._binary(e)
        if e.kind == "call":
            return self._call(e)
        raise AssertionError(e.kind)  # pragma: no cover

    def _name(self, e: ast.Name) -> Ty | None:
        if e.id in self.names:
            return self.names[e.id]()
        if "." in e.id:
            return self._axis_name(e)
        if e.id in AXIS_READERS and self.axes:
            first = self.axes[0]
            self.report("E231", f"'{e.id}' in a scheme with axes {', '.join(self.axes)}: say which axis it reads",
                        e, hint=f"write {e.id}.{first} (one axis)" + (
                            ", or sections(position, [...]) / interleave(position, [...]) to give each rotary "
                            "pair an axis" if e.id == "position" else ""))
            return None
        if e.id in CONSTANTS:
            return CONSTANTS[e.id]
        if e.id in FUNCTIONS:
            self.report("E204", f"'{e.id}' is a function: call it as {FUNCTIONS[e.id].signature()}", e)
            return None
        hint = did_you_mean(e.id, list(self.names) + list(CONSTANTS))
        self.report("E201", f"unknown name '{e.id}'", e, hint=hint or "declare it with 'param' or 'let'")
        return None

    def _axis_name(self, e: ast.Name) -> Ty | None:
        """``position.AXIS`` / ``distance.AXIS``: the position (distance) along one declared axis."""
        base, _, axis = e.id.partition(".")
        if base not in AXIS_READERS:
            self.report("E201", f"unknown name '{e.id}'", e,
                        hint="only position and distance are read along an axis: position.AXIS, distance.AXIS")
            return None
        if self.axes is not None and axis not in self.axes:
            if not self.axes:
                self.report("E230", f"'{e.id}' reads axis '{axis}', but the scheme declares no axes", e,
                            hint=f"declare the position axes first, e.g. 'axes {axis}, ...'")
            else:
                near = did_you_mean(axis, list(self.axes))
                self.report("E230", f"'{e.id}' reads axis '{axis}', which the scheme does not declare "
                            f"(its axes: {', '.join(self.axes)})", e, hint=near or f"add it: axes {', '.join(self.axes)}, {axis}")
            return None
        return CONSTANTS[base]

    def _axis_selection(self, e: ast.Call, spec, arg) -> Ty | None:
        """The first argument of sections()/interleave(): the bare name ``position`` of a multi-axis scheme."""
        if not (isinstance(arg, ast.Name) and arg.id == "position"):
            self.report("E204", f"{e.func}() gives each rotary pair one axis of the positions: its first argument "
                        f"is the name position", arg if isinstance(arg, ast.Node) else e,
                        hint=f"write {e.func}(position, [...])")
            return None
        if self.axes is not None and not self.axes:
            self.report("E230", f"{e.func}() selects among position axes, but the scheme declares none", e,
                        hint="declare them, e.g. 'axes t, h, w'")
            return None
        t = CONSTANTS["position"]
        if self.seen is not None:
            self.seen[id(arg)] = t
        return t

    def _binary(self, e: ast.Binary) -> Ty | None:
        a, b = self.infer(e.left), self.infer(e.right)
        if a is None or b is None:
            return None
        if e.op in ("+", "-") and "bias" in (a.kind, b.kind):
            for side, t in ((e.left, a), (e.right, b)):
                if t.kind not in ("bias", "num"):
                    self.report("E204", f"cannot add {t.show()} to a bias", side)
                    return None
            return Ty(Kind.BIAS, reads=a.reads | b.reads)
        if a.kind == "list" or b.kind == "list":
            other = b if a.kind == "list" else a
            if other.kind == "list" or (other.kind == "num" and not other.axes):
                return Ty(Kind.LIST)
            if other.kind == "num" and other.axes == frozenset({"pair"}):
                return other  # a list literal read as one value per pair
            self.report("E204", f"cannot combine a list with {other.show()}", e)
            return None
        for side, t in ((e.left, a), (e.right, b)):
            if t.kind != "num":
                self.report("E204", f"arithmetic '{e.op}' needs numbers, not {t.show()}", side)
                return None
        return join(a, b).with_(integer=a.integer and b.integer and e.op in "+-*")

    def _call(self, e: ast.Call) -> Ty | None:
        spec = FUNCTIONS.get(e.func)
        if spec is None:
            if e.func in self.names or e.func in CONSTANTS:
                self.report("E202", f"'{e.func}' is not a function", e)
                return None
            hint = did_you_mean(e.func, FUNCTIONS)
            self.report("E202", f"unknown function '{e.func}'", e, hint=hint or "the builtins are listed in docs/language.md")
            return None
        pnames = [p for p, _ in spec.params]
        if len(e.args) > len(pnames):
            self.report(
                "E203", f"{e.func}() takes at most {len(pnames)} argument{'s' if len(pnames) != 1 else ''}, "
                f"got {len(e.args)}", e,
                hint=f"the signature is {spec.signature()}",
            )
            return None
        bound: dict[str, ast.Expr] = dict(zip(pnames, e.args))
        for kw in e.kwargs:
            if kw.name not in pnames:
                hint = did_you_mean(kw.name, pnames) or f"the signature is {spec.signature()}"
                self.report("E203", f"{e.func}() has no parameter '{kw.name}'", kw, hint=hint)
                return None
            if kw.name in bound:
                self.report("E203", f"{e.func}() got '{kw.name}' twice", kw)
                return None
            bound[kw.name] = kw.value
        types: dict[str, Ty] = {}
        for p, default in spec.params:
            if spec.axis_select is not None and p == pnames[0]:
                t = self._axis_selection(e, spec, bound.get(p))
                if t is None:
                    return None
                types[p] = t
            elif p in bound:
                t = self.infer(bound[p])
                if t is None:
                    return None
                types[p] = t
            elif default is REQUIRED:
                self.report(
                    "E203", f"{e.func}() is missing its argument '{p}'", e, hint=f"the signature is {spec.signature()}"
                )
                return None
            elif default is None:
                continue
            elif isinstance(default, bool):
                types[p] = BOOL
            elif isinstance(default, str):
                types[p] = CONSTANTS[default] if default in CONSTANTS else STR
            else:
                types[p] = NUM.with_(integer=isinstance(default, int))
        try:
            ty = spec.rule(types)
        except TypeIssue as issue:
            node = bound.get(issue.arg, e) if issue.arg else e
            self.report("E204", f"{e.func}(): {issue}", node, hint=issue.hint)
            return None
        # a call reads what its arguments read and what the builtin itself reads (its record)
        return ty.with_(reads=own_reads(spec).union(*(t.reads for t in types.values())))
