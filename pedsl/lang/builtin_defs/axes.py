"""Axis selections of a multi-axis scheme (``axes t, h, w``): which position axis each rotary pair reads.

``sections(position, [s_0, s_1, ...])`` gives the first ``s_0`` pairs of the group axis 0, the next
``s_1`` axis 1, and so on (Qwen2-VL's ``mrope_section``); ``interleave(position, [s_0, s_1, ...])``
spreads them round-robin as Hugging Face's Qwen3-VL does (``apply_interleaved_mrope``): pair ``k``
reads axis ``a = k mod A`` when ``a >= 1`` and ``k < A * s_a``, else axis 0. The sizes count rotary
PAIRS of the group and must add up to its pair count. The value of either is
``sum_a [pair k reads axis a] * position.a``: num[pos, pair] (docs/semantics.md §2a).
"""

from __future__ import annotations

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue
from pedsl.lang.types import Dep, Ty, num
from pedsl.lang.values import EvalIssue


def _rule(a: dict[str, Ty]) -> Ty:
    if a["sizes"].kind != "list":
        raise TypeIssue("'sizes' must be a list of pair counts, one per axis (e.g. [16, 24, 24])", "sizes")
    return num("pos", "pair", integer=True, reads=frozenset({Dep.POSITION}))


def checked_sizes(sizes, pairs: int, func: str) -> tuple[int, ...]:
    """The sizes as integers >= 0 that add up to the group's pairs (EvalIssue otherwise)."""
    out = []
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or s != int(s) or s < 0:
            raise EvalIssue(f"{func}(): each size is a whole number of rotary pairs >= 0, got {s!r}")
        out.append(int(s))
    if sum(out) != pairs:
        raise EvalIssue(f"{func}(): the sizes {out} add up to {sum(out)} pairs, but the group has {pairs} "
                        f"(half its channels)", hint=f"make them add up to {pairs}")
    return tuple(out)


def contiguous(sizes, pairs: int) -> tuple[int, ...]:
    sizes = checked_sizes(sizes, pairs, "sections")
    return tuple(a for a, s in enumerate(sizes) for _ in range(s))


def interleaved(sizes, pairs: int) -> tuple[int, ...]:
    sizes = checked_sizes(sizes, pairs, "interleave")
    A = len(sizes)
    out = tuple(k % A if k % A and k < A * sizes[k % A] else 0 for k in range(pairs))
    got = [out.count(a) for a in range(A)]
    if got != list(sizes):
        raise EvalIssue(f"interleave(): round-robin over {A} axes gives the axes {got} pairs, not {list(sizes)}",
                        hint="axis 0 takes every pair the others leave, so each later axis a needs "
                             "A * s_a <= pairs (Qwen3-VL: [24, 20, 20] at 64 pairs)")
    return out


RECORDS = [
    Builtin("sections", (("position", REQUIRED), ("sizes", REQUIRED)),
            "per rotary pair, the position along one axis: the first sizes[0] pairs read axis 0, the next "
            "sizes[1] axis 1, ... (Qwen2-VL M-RoPE's mrope_section; sizes in pairs, summing to the group's pairs)",
            _rule, "axes", axis_select=contiguous),
    Builtin("interleave", (("position", REQUIRED), ("sizes", REQUIRED)),
            "per rotary pair, the position along one axis, assigned round-robin: pair k reads axis k mod A "
            "while k < A * sizes[k mod A], else axis 0 (Qwen3-VL's interleaved M-RoPE)",
            _rule, "axes", axis_select=interleaved),
]
