"""What a builtin is: one record with its signature, typing rule, static fold, run-time
evaluation over an array namespace, and emitted code.

A record's parts, each optional where the builtin has no such stage:

- ``params``, ``doc``, ``rule``, ``category``: the signature the checker knows and its typing rule
  (``rule(arg types) -> type``, raising :class:`TypeIssue`);
- ``fold``: the compile-time value on plain Python floats, one number per argument (the folder maps
  it over per-axis vectors);
- ``run``: the run-time value, ``run(ops, *arrays)``, written once over an array namespace ``ops``
  (:class:`pedsl.lang.builtin_defs.arrays.Ops`: numpy for ``pedsl diff --numeric``, torch for the
  compiled module); the arrays are the arguments, aligned to one shape;
- ``emit``: the code the generated module runs, ``emit(*argument code) -> code``, as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pedsl.lang.types import Ty

REQUIRED = object()


class TypeIssue(Exception):
    """Raised by a typing rule; ``arg`` names the offending argument (or None)."""

    def __init__(self, message: str, arg: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.arg = arg
        self.hint = hint


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[tuple[str, object], ...]  # (name, default or REQUIRED)
    doc: str
    rule: Callable[[dict[str, Ty]], Ty]
    category: str = "math"
    fold: Callable | None = None  # (*floats) -> float
    run: Callable | None = None  # (ops, *arrays) -> array
    emit: Callable[..., str] | None = None  # (*argument code) -> code

    def signature(self) -> str:
        parts = []
        for p, d in self.params:
            shown = str(d).lower() if isinstance(d, bool) else repr(d).replace("'", "")
            parts.append(p if d is REQUIRED else f"{p} = {shown}")
        return f"{self.name}({', '.join(parts)})"


# ------------------------------------------------------------------ typing helpers


def need_num(t: Ty, arg: str, allowed: set[str] | None = None, what: str = "") -> None:
    if t.kind != "num":
        raise TypeIssue(f"'{arg}' must be a number{what}, not {t.show()}", arg)
    if allowed is not None and not t.axes <= allowed:
        extra = sorted(t.axes - allowed)
        raise TypeIssue(
            f"'{arg}' varies along {', '.join(extra)}, but must be {_axes_words(allowed)}{what}",
            arg,
        )


def _axes_words(allowed: set[str]) -> str:
    if not allowed:
        return "a scalar"
    return "per " + " / ".join(sorted(allowed)) + " at most"
