"""Channel groups (inside ``channels { ... }``): fraction, quarters, range (one record each).

A group builtin folds to a :class:`~pedsl.lang.values.GroupSpec` naming it and its arguments; its
``channels(head_dim, *arguments)`` gives the channel indices it takes, raising
:class:`~pedsl.lang.values.EvalIssue` when they do not fit the head (:func:`pedsl.lang.channels.group_channels`).
"""

from __future__ import annotations

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, scalar
from pedsl.lang.types import GROUP, Ty
from pedsl.lang.values import EvalIssue, GroupSpec


def _group_spec(a: dict[str, Ty]) -> Ty:
    for k in a:
        scalar(a, k)
    return GROUP


def _quarters_rule(a: dict[str, Ty]) -> Ty:
    for k in a:
        scalar(a, k, integer=True)
    return GROUP


def _spec(env, node, **kw) -> GroupSpec:
    return GroupSpec(node.func, tuple(v for v in kw.values() if v is not None))


def _fraction(head_dim: int, f) -> list[int]:
    size = f * head_dim
    if not 0 < f <= 1:
        raise EvalIssue(f"fraction({f:g}) must be in (0, 1]")
    if abs(size - round(size)) > 1e-9 or round(size) % 2:
        raise EvalIssue(
            f"fraction({f:g}) of head_dim {head_dim} is {size:g} channels, not an even whole number",
            hint=f"rotary channels come in pairs: use a fraction f with f * {head_dim} even, "
            f"e.g. {_nice_fractions(head_dim)}",
        )
    return list(range(int(round(size))))


def _nice_fractions(head_dim: int) -> str:
    fr = [f for f in (0.25, 0.5, 0.75, 1.0) if (f * head_dim) % 2 == 0]
    return ", ".join(f"{f:g}" for f in fr) or "1"


def _quarters(head_dim: int, *listed) -> list[int]:
    if head_dim % 8:
        raise EvalIssue(
            f"quarters need head_dim divisible by 8 (each quarter an even number of channels); "
            f"head_dim is {head_dim}"
        )
    q = head_dim // 4
    out: list[int] = []
    for a in listed:
        a = int(a)
        if not 1 <= a <= 4:
            raise EvalIssue(f"quarter {a} does not exist: quarters are numbered 1 to 4")
        out.extend(range((a - 1) * q, a * q))
    if len(set(out)) != len(out):
        raise EvalIssue("a quarter is listed twice")
    return sorted(out)


def _range(head_dim: int, start, stop) -> list[int]:
    a, b = int(start), int(stop)
    if not 0 <= a < b <= head_dim:
        raise EvalIssue(f"range({a}, {b}) does not fit head_dim {head_dim} (channels 0 .. {head_dim - 1})")
    if (b - a) % 2:
        raise EvalIssue(f"range({a}, {b}) has {b - a} channels; rotary channels come in pairs")
    return list(range(a, b))


RECORDS = [
    Builtin("fraction", (("f", REQUIRED),), "the first f * head_dim channels", _group_spec, "channels",
            fold_env=_spec, channels=_fraction),
    Builtin("quarters", (("a", REQUIRED), ("b", None), ("c", None), ("d", None)),
            "the listed quarters (1-4) of the head's channels", _quarters_rule, "channels", fold_env=_spec,
            channels=_quarters),
    Builtin("range", (("start", REQUIRED), ("stop", REQUIRED)), "channels start .. stop - 1", _group_spec,
            "channels", fold_env=_spec, channels=_range),
]
