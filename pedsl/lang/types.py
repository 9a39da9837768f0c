"""Types of `.pe` expressions: a kind plus the named axes a value varies along.

A numeric value is a field over some of the axes

    pos   query/token position t (or i)       pair  rotary pair k of a channel group
    head  attention head h                    chan  channel of a head
    dist  distance i - j >= 0 (biases only)

so ``geometric(base)`` is ``num[pair]``, ``w * position`` is ``num[pos, pair]`` and
``-slopes(heads) * distance`` is ``num[head, dist]``. Arithmetic broadcasts by
axis name. Flags record what the compiler must know: ``runtime`` (depends on the
run-time length ``n``), ``data`` (depends on the tokens or hidden state),
``learned`` (owns trainable parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

AXES = ("head", "pos", "dist", "pair", "chan")  # canonical order


@dataclass(frozen=True)
class Ty:
    kind: str  # num | bool | str | list | hidden | token | axis | none | group | transport | step | bias
    axes: frozenset[str] = field(default_factory=frozenset)
    integer: bool = False
    runtime: bool = False
    data: bool = False
    learned: bool = False
    detail: str = ""  # transports/steps: rotate | rotation | householder ; axis: its name

    def show(self) -> str:
        if self.kind == "num":
            if not self.axes:
                return "int" if self.integer else "number"
            return "num[" + ", ".join(a for a in AXES if a in self.axes) + "]"
        if self.kind in ("transport", "step") and self.detail:
            return f"{self.kind} ({self.detail})"
        return self.kind

    def with_(self, **kw) -> "Ty":
        d = dict(self.__dict__)
        d.update(kw)
        return Ty(**d)


NUM = Ty("num")
INT = Ty("num", integer=True)
BOOL = Ty("bool")
STR = Ty("str")
NONE = Ty("none")
GROUP = Ty("group")
ANY = Ty("any")


def num(*axes: str, **flags) -> Ty:
    return Ty("num", frozenset(axes), **flags)


def join(*tys: Ty) -> Ty:
    """The type of an arithmetic combination: union of axes, or of flags."""
    axes: frozenset[str] = frozenset()
    for t in tys:
        axes |= t.axes
    return Ty(
        "num",
        axes,
        integer=all(t.integer for t in tys),
        runtime=any(t.runtime for t in tys),
        data=any(t.data for t in tys),
        learned=any(t.learned for t in tys),
    )


def describe_axes(axes) -> str:
    if not axes:
        return "a scalar"
    return "a field over " + ", ".join(a for a in AXES if a in axes)
