"""What a builtin is: one record with its signature, typing rule, static fold, run-time
evaluation over an array namespace, and emitted code.

A record's parts, each optional where the builtin has no such stage:

- ``params``, ``doc``, ``rule``, ``category``: the signature the checker knows and its typing rule
  (``rule(arg types) -> type``, raising :class:`TypeIssue`);
- ``inputs``: run-time inputs the builtin reads without naming them (``position``);
- ``static``: ``(param, int | float)`` - arguments folded to a number before ``run`` / ``emit``, which
  get them as keywords; ``arg_rules``: their range checks, ``{param: (lo, hi, lo is exclusive,
  meaning)}``, applied wherever the call is folded;
- ``fold``: the compile-time value on plain Python floats, ``fold(*inputs, *arguments)`` (the folder
  maps it over per-axis vectors; a builtin with inputs folds only where they are known - the
  checker's probe at one query position);
- ``fold_env``: a compile-time value that needs more than numbers, ``fold_env(env, node, **arguments)``
  (the :class:`~pedsl.lang.values.StaticEnv` and the call, for its diagnostics), raising
  :class:`~pedsl.lang.values.EvalIssue`; a builtin with ``fold`` or ``fold_env`` and no ``run`` is
  static (the type rule requires static arguments), always folded before the run-time walk;
- ``run``: the run-time value, ``run(ops, *input arrays, *argument arrays, **static)``, written once
  over an array namespace ``ops`` (:class:`pedsl.lang.builtin_defs.arrays.Ops`: numpy for ``pedsl
  diff --numeric``, torch for the compiled module); the arrays are aligned to one shape;
- ``emit``: the code the generated module runs, as text, ``emit(*input code, *argument code,
  **static literals)``;
- ``channels``: a channel group's channels, ``channels(head_dim, *arguments)`` (its ``fold_env``
  gives the :class:`~pedsl.lang.values.GroupSpec` naming it), raising :class:`~pedsl.lang.values.EvalIssue`
  when they do not fit the head;
- ``site``: the run-time value of a source with state (a frozen table, learned parameters),
  ``site(at, *argument values, **names, **static)``: ``at`` is the call site the walk hands it
  (:class:`pedsl.runtime.walk.At`: the array namespace, sizes, run-time inputs, and the backend's
  frozen tables and learned layers by key and site name; see
  :mod:`pedsl.lang.builtin_defs.sources`); ``names``: arguments passed as the name they hold
  (``to = pair``, ``index = token``); ``learned``: the site owns trainable parameters. Its ``emit``
  is ``emit(g, *argument code, **names, **static literals)``, ``g`` declaring sub-modules and buffers;
- ``reads_length``: the static value reads the run-time length n without naming it (a value folded
  at one length must not be reused at another); the walk folds it at each length, and its ``emit``
  is ``emit(fold_at, pairs, **static literals)``, ``fold_at(n)`` the code of the value folded at n.

- ``check``: a check across the static arguments, ``check(**static values) -> message or None``, run
  with ``arg_rules``; ``index_rows``: an integer-valued builtin's number of values from its static
  arguments (``bucket``); ``derive``: ``{param: other}``, a static parameter that left at 0 takes the
  ``index_rows`` of the call in argument ``other`` (:func:`pedsl.lang.fold.derived_static`);
- ``checked_args``: arguments that must fold to a static value (``learned(init)``): the folder folds
  them wherever the call is checked, so a bad start value is a positioned diagnostic.

``inputs``, ``reads_length`` and ``learned`` are the one source of what a call reads beyond its
arguments (:func:`own_reads`); the checker adds what the arguments read and stores the result in the
call's type (docs/semantics.md §1a).

``axis_select``: an axis selection of a multi-axis scheme (``sections``, ``interleave``): its first
argument is the name ``position``, its second a static list of sizes; ``axis_select(sizes, pairs)``
gives the axis index of every rotary pair (raising :class:`~pedsl.lang.values.EvalIssue` when the
sizes do not fit), and its value is ``sum_a [axis of pair k = a] * position.a``, built by the walk and
by codegen from per-pair constants (no ``run`` or ``emit``).

A record with none of ``fold``, ``fold_env``, ``run``, ``site`` and ``axis_select`` is a transport (category
``transport``): it has no value, and :mod:`pedsl.lang.terms` reads the call as the transport it names
(docs/semantics.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pedsl.lang.types import Dep, Ty

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
    inputs: tuple[str, ...] = ()
    static: tuple[tuple[str, type], ...] = ()
    arg_rules: dict | None = None
    fold: Callable | None = None  # (*floats) -> float
    fold_env: Callable | None = None  # (env, node, **arguments) -> value
    run: Callable | None = None  # (ops, *arrays) -> array
    emit: Callable[..., str] | None = None  # (*argument code) -> code
    reads_length: bool = False
    channels: Callable[..., list[int]] | None = None  # (head_dim, *arguments) -> channel indices
    names: tuple[str, ...] = ()  # arguments passed as the name they hold (an axis, an input)
    site: Callable | None = None  # (at, *argument values, **names, **static) -> value
    learned: bool = False  # its site owns trainable parameters
    # an axis selection (sections, interleave): (sizes, pairs) -> the position axis of each rotary pair;
    # its value is sum over axes a of [pair k reads a] * position.a (the walk and codegen build it)
    axis_select: Callable[[list, int], tuple[int, ...]] | None = None
    # arguments that must fold to a static value (a learned value's start): folded wherever the call
    # is checked, so that their errors are positioned diagnostics, never a failure at compile time
    checked_args: tuple[str, ...] = ()
    # a check across the static arguments (folded, defaults filled in), run with ``arg_rules``: the
    # message of what is wrong, or None
    check: Callable[..., str | None] | None = None
    # an integer-valued builtin's number of values, from its static arguments (bucket: its bucket count)
    index_rows: Callable[..., int] | None = None
    # static parameters that, left at 0, take the ``index_rows`` of the call in another argument
    # ({"size": "index"}: a table as large as its bucket index)
    derive: dict[str, str] | None = None

    def signature(self) -> str:
        parts = []
        for p, d in self.params:
            shown = str(d).lower() if isinstance(d, bool) else repr(d).replace("'", "")
            parts.append(p if d is REQUIRED else f"{p} = {shown}")
        return f"{self.name}({', '.join(parts)})"


def own_reads(b: Builtin) -> frozenset[Dep]:
    """What a call of ``b`` reads beyond its arguments: its ``inputs`` (``position``), the run-time
    length (``reads_length``) and its trainable parameters (``learned``)."""
    out = {Dep(i) for i in b.inputs}
    if b.reads_length:
        out.add(Dep.LENGTH)
    if b.learned:
        out.add(Dep.LEARNED)
    return frozenset(out)


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


def scalar(args: dict[str, Ty], *names: str, integer: bool = False) -> None:
    """Each named argument is a number known at compile time (an integer if asked)."""
    for n in names:
        t = args[n]
        need_num(t, n, set())
        if t.data or t.learned:
            raise TypeIssue(f"'{n}' must be known at compile time, not depend on the data", n)
        if integer and not t.integer:
            raise TypeIssue(f"'{n}' must be an integer", n)


def _axes_words(allowed: set[str]) -> str:
    if not allowed:
        return "a scalar"
    return "per " + " / ".join(sorted(allowed)) + " at most"
