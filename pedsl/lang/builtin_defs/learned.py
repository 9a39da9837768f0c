"""Learned values: learned (one record).

``learned(init)`` is a trainable parameter that starts at the static value ``init`` and has its axes:
a scalar, one value per head (``learned(slopes(heads))``), per rotary pair (``learned(geometric(base))``),
or per head and pair (``learned(geometric(base), per = head)``: ``per`` adds an axis the start value does
not vary along, every copy starting equal). It stands wherever a number of those axes does - a bias's
slope, a rotation's frequencies, a temperature - and reads nothing at run time but its parameter.

Its call site (:class:`pedsl.runtime.walk.At`) asks the backend for the parameter by the walk's site
name: the torch module holds it as ``learned.sites[<key>].value`` (the module's parameter dtype, float32
unless the model is cast), the numpy sampler of ``pedsl diff --numeric`` starts from ``init`` itself.
The value enters the walk in float64, like a static table, so that products with positions are formed
in float64 and rounded once where they are used.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue, need_num
from pedsl.lang.types import Ty, num

_PER = {"head": "head", "pair": "pair"}


def _learned_rule(a: dict[str, Ty]) -> Ty:
    t = a["init"]
    need_num(t, "init", {"head", "pair"}, " (a start value: a number, or one per head and / or rotary pair)")
    if t.reads:
        raise TypeIssue(f"'init' must be known at compile time, but it reads {', '.join(sorted(d.value for d in t.reads))}",
                        "init", hint="start from a number, a parameter, slopes(heads) or a frequency grid")
    axes = set(t.axes)
    per = a.get("per")
    if per is not None and per.kind != "none":
        if per.kind != "axis" or per.detail not in _PER:
            raise TypeIssue("'per' must be head or pair (the axis the start value is copied along)", "per")
        if _PER[per.detail] in axes:
            raise TypeIssue(f"'init' already has one value per {per.detail}; drop 'per = {per.detail}'", "per")
        axes.add(_PER[per.detail])
    return num(*axes)


def _shape(at, axes: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(at.heads if a == "head" else at.width("pair")[1] for a in axes)


def _learned(at, init, *, per):
    """The parameter at this call site, over the start value's axes and ``per``'s (canonical order)."""
    axes = tuple(a for a in ("head", "pair") if a in init.axes or a == per)
    start, _ = at.aligned_with(init, axes)
    return at.wrap(at.parameter(start, _shape(at, axes)), axes)


def _emit_learned(g, init, *, per):
    heads = g.heads if "head" in g.axes else None
    pairs = g.pairs if "pair" in g.axes else None
    m = g.learned(f"_LearnedValue((lambda dev: {init})(None), {heads}, {pairs})")  # the init's code reads dev
    return f"{m}.at5()"


RECORDS = [
    Builtin("learned", (("init", REQUIRED), ("per", None)),
            "a trainable value starting at the static init, with its axes (a number, per head, per pair); "
            "per = head or per = pair copies it along one more axis", _learned_rule, "source", names=("per",),
            learned=True, site=_learned, emit=_emit_learned, checked_args=("init",)),
]
