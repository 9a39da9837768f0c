"""Types of `.pe` expressions: a kind, the named axes a value varies along, and what it reads.

A numeric value is a field over some of the axes

    pos   query/token position t (or i)       pair  rotary pair k of a channel group
    head  attention head h                    chan  channel of a head
    dist  distance i - j >= 0 (biases only)

so ``geometric(base)`` is ``num[pair]``, ``w * position`` is ``num[pos, pair]`` and
``-slopes(heads) * distance`` is ``num[head, dist]``. Arithmetic broadcasts by
axis name. ``reads`` is the set of run-time inputs the value depends on (its
:class:`Dep` members, docs/semantics.md §1a); its highest member is the value's
dependence class ``dep``. The checker computes both once and the resolved IR
(:mod:`pedsl.lang.scheme`) stores them; consumers read them instead of looking for names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from functools import total_ordering
from typing import Annotated

from pydantic import PlainSerializer

AXES = ("head", "pos", "dist", "pair", "chan")  # canonical order


class Kind(StrEnum):
    """What an expression is (a ``StrEnum``: ``Kind.NUM == "num"``)."""

    NUM = "num"
    BOOL = "bool"
    STR = "str"
    LIST = "list"
    HIDDEN = "hidden"  # the hidden state x
    TOKEN = "token"  # the token ids
    AXIS = "axis"  # head, pair, channel (the ``to =`` of a learned source)
    NONE = "none"
    GROUP = "group"  # a channel-group layout
    TRANSPORT = "transport"
    STEP = "step"  # rotation(...), householder(...): what accumulate() takes
    BIAS = "bias"  # accumulate(log-gate) and sums with it
    ANY = "any"


@total_ordering
class Dep(Enum):
    """Dependence classes, ordered by how often a value must be recomputed (docs/semantics.md §1a).

    As a member of ``Ty.reads`` each names one run-time input; a value's class is the highest one
    it reads (``STATIC`` when it reads none).
    """

    STATIC = "static"  # a compile-time constant: folded once
    POSITION = "position"  # the positions i, j (position, distance, log_length, frozen_random(position))
    LENGTH = "length"  # the run-time length n (n, dynamic_ntk, longrope): recomputed per length
    TOKEN = "token"  # the token ids (token, frozen_random(token), embedding)
    DATA = "data"  # the hidden state x (linear(x))
    LEARNED = "learned"  # trainable parameters (embedding, linear, shortconv)

    def __lt__(self, other: "Dep") -> bool:
        if not isinstance(other, Dep):
            return NotImplemented
        return _RANK[self] < _RANK[other]


_RANK = {d: i for i, d in enumerate(Dep)}


def _axes_in_order(axes: frozenset[str]) -> list[str]:
    return [a for a in AXES if a in axes] + sorted(a for a in axes if a not in AXES)


def _reads_in_order(reads: frozenset[Dep]) -> list[str]:
    return [d.value for d in sorted(reads)]


# JSON lists a set in a fixed order (a frozenset's own order changes with PYTHONHASHSEED)
_AxesSet = Annotated[frozenset[str], PlainSerializer(_axes_in_order, when_used="json")]
_ReadsSet = Annotated[frozenset["Dep"], PlainSerializer(_reads_in_order, when_used="json")]


@dataclass(frozen=True)
class Ty:
    kind: Kind
    axes: _AxesSet = field(default_factory=frozenset)
    integer: bool = False
    reads: _ReadsSet = field(default_factory=frozenset)  # the run-time inputs it depends on
    detail: str = ""  # transports/steps: rotate | rotation | householder ; axis: its name

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        object.__setattr__(self, "reads", frozenset(self.reads) - {Dep.STATIC})

    @property
    def dep(self) -> Dep:
        """The dependence class: the highest input read (docs/semantics.md §1a)."""
        return max(self.reads, default=Dep.STATIC)

    @property
    def runtime(self) -> bool:
        """Reads the run-time length n: a value folded once must not be reused at another length."""
        return Dep.LENGTH in self.reads

    @property
    def data(self) -> bool:
        """Reads the tokens or the hidden state."""
        return bool(self.reads & {Dep.TOKEN, Dep.DATA})

    @property
    def learned(self) -> bool:
        """Owns trainable parameters."""
        return Dep.LEARNED in self.reads

    def to_json(self) -> dict:
        """Plain data: kind, axes and reads in canonical order, and the dependence class."""
        return {"kind": self.kind.value, "axes": _axes_in_order(self.axes),
                "reads": _reads_in_order(self.reads), "dep": self.dep.value}

    def show(self) -> str:
        if self.kind == "num":
            if not self.axes:
                return "int" if self.integer else "number"
            return "num[" + ", ".join(a for a in AXES if a in self.axes) + "]"
        if self.kind in ("transport", "step") and self.detail:
            return f"{self.kind} ({self.detail})"
        return str(self.kind)

    def with_(self, **kw) -> "Ty":
        d = dict(self.__dict__)
        d.update(kw)
        return Ty(**d)


NUM = Ty(Kind.NUM)
INT = Ty(Kind.NUM, integer=True)
BOOL = Ty(Kind.BOOL)
STR = Ty(Kind.STR)
NONE = Ty(Kind.NONE)
GROUP = Ty(Kind.GROUP)
ANY = Ty(Kind.ANY)


def num(*axes: str, integer: bool = False, reads: frozenset[Dep] = frozenset()) -> Ty:
    return Ty(Kind.NUM, frozenset(axes), integer=integer, reads=reads)


def join(*tys: Ty) -> Ty:
    """The type of an arithmetic combination: union of axes and of what they read."""
    axes: frozenset[str] = frozenset()
    reads: frozenset[Dep] = frozenset()
    for t in tys:
        axes |= t.axes
        reads |= t.reads
    return Ty(Kind.NUM, axes, integer=all(t.integer for t in tys), reads=reads)
