"""Scheme parameters: ``-P`` values, their coercion to the declared type, defaults and constraints."""

from __future__ import annotations

import math
import sys
from typing import Any

from pedsl.errors import ParamError, did_you_mean, quoted
from pedsl.lang import ast
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS, STRUCTURAL_DEFAULTS
from pedsl.lang.statements import KEYWORDS
from pedsl.lang.fold import fold_expr
from pedsl.lang.imports import Source
from pedsl.lang.diagnostics import node_pos, sink_for
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv


def parse_override(text: str) -> Any:
    """A -P value: int, float, bool or string (quotes optional)."""
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    try:
        return int(t)
    except ValueError:
        if t.lstrip("+-").isdigit():  # more digits than int() reads: kept as text, never read as inf
            return t
    try:
        return float(t)
    except ValueError:
        pass
    if len(t) >= 2 and t[0] == t[-1] == '"':
        return t[1:-1]
    return t


def _coerce(value: Any, typ: str) -> Any:
    """``value`` as a ``typ``; TypeError if it is not one (a number beyond the float range is none: it
    overflows wherever it meets a float, as an integer literal that large is refused by the parser)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        raise TypeError
    if typ == "int":
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, float):
            if not value.is_integer():
                raise TypeError
            return int(value)
        if isinstance(value, int):
            return value
        raise TypeError
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        if not math.isfinite(float(value)):
            raise TypeError
        return float(value)
    if typ == "bool":
        if not isinstance(value, bool):
            raise TypeError
        return value
    if typ == "str":
        if not isinstance(value, str):
            raise TypeError
        return value
    raise TypeError  # pragma: no cover


_CMP = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "!=": lambda a, b: a != b,
}


def _override_error(name: str, typ: str, raw: Any, scheme: str | None = None) -> tuple[str, str]:
    """The message and hint of an override that is not a ``typ`` (a long value is cut)."""
    shown = quoted(raw, 60)
    hint = f"give -P {name}=<{typ}>"
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        hint += ", a finite number below about 1.8e308 in magnitude"
    what = f"parameter '{name}' of scheme '{scheme}'" if scheme else f"'{name}'"
    return f"{what} is {typ}, got {shown} (-P {name}=...)", hint


def _type_name(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(type(v), type(v).__name__)


class ParamBinding(ResolverStage):
    """The Resolver's parameter stage: binds ``values`` from structure, overrides and defaults."""

    def _param_error(self, code: str, message: str, node: Any, src: Source, *, hint: str | None) -> None:
        """A bad -P override stops resolution; the diagnostic points at the declaration it concerns."""
        sink = sink_for(src)
        sink.add(code, message, hint=hint, **node_pos(node))
        raise ParamError(message, diagnostics=sink.items)

    def bind_params(self) -> None:
        decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
        for name, struct in self.structural.items():
            if name not in self.m.params:
                self.values[name] = struct
                if name in self.overrides:  # -P heads=8 sets the model's structure too
                    try:
                        value = _coerce(self.overrides[name], "int")
                    except TypeError:
                        msg, hint = _override_error(name, "int", self.overrides[name])
                        self._param_error("E302", msg, decl, self.src, hint=hint)
                    if value < 1:
                        self._param_error("E303", f"'{name}' must be >= 1, got {value} (-P {name}=...)", decl,
                                          self.src, hint=f"choose {name} >= 1")
                    self.values[name] = value
        for name in self.overrides:
            if name not in self.m.params and name not in self.structural:
                near = did_you_mean(name, list(self.m.params) + list(self.structural))
                known = ", ".join(sorted(self.m.params)) or "none"
                decl = next((d for d in self.src.module.schemes if d.name == self.m.name), None)
                self._param_error("E301", f"unknown parameter '{name}' (-P {name}=...) for scheme '{self.m.name}'",
                                  decl, self.src, hint=near or f"its parameters are: {known}")
        for name, loc in self.m.params.items():
            p: ast.Param = loc.stmt
            self._current = loc.src
            if name in CONSTANTS or name in FUNCTIONS or name in KEYWORDS:
                if name not in STRUCTURAL_DEFAULTS:
                    self.report("E205", f"parameter '{name}' shadows a builtin name", p)
                    continue
            env = StaticEnv(values=dict(self.values))
            if name in self.overrides:
                raw = self.overrides[name]
                try:
                    value = _coerce(raw, p.type)
                except TypeError:
                    msg, hint = _override_error(name, p.type, raw, scheme=self.m.name)
                    self._param_error("E302", msg, p, loc.src, hint=hint)
                origin = "override"
            else:
                try:
                    value = fold_expr(p.default, env)
                except EvalIssue as issue:
                    self.report("E217", f"default of '{name}': {issue}", issue.node or p.default, hint=issue.hint)
                    continue
                if value is DYNAMIC:
                    self.report("E204", f"the default of '{name}' must be known at compile time", p.default)
                    continue
                try:
                    value = _coerce(value, p.type)
                except TypeError:
                    self.report("E204", f"'{name}' is declared {p.type} but its default is {_type_name(value)}",
                                p.default, hint=f"write {'an' if p.type == 'int' else 'a'} {p.type} literal")
                    continue
                origin = "default"
            ok = True
            for c in p.constraints:
                bound = self.fold_or_report(c.value, env)
                if bound is FAILED:
                    ok = False
                    continue
                if isinstance(bound, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    if not _CMP[c.op](value, bound):
                        msg = f"parameter '{name}' = {quoted(value)} violates its constraint ({c.op} {bound!r})"
                        if origin == "override":
                            self._param_error("E303", msg + f" (-P {name}=...)", c, loc.src,
                                              hint=f"choose {name} {c.op} {bound!r}")
                        self.report("E212", msg, p, hint=f"choose a default {c.op} {bound!r}")
                        ok = False
                else:
                    self.report("E204", "a constraint compares numbers", c)
                    ok = False
            if ok:
                self.values[name] = value
