"""Channel groups: the channels a group takes (``all``, ``rest``, or a group builtin of
:mod:`pedsl.lang.builtin_defs.channels`) and how they are shown."""

from __future__ import annotations

from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.values import EvalIssue, GroupSpec


def group_channels(spec: GroupSpec, head_dim: int, taken: set[int]) -> list[int]:
    """Channel indices of a group spec; raises EvalIssue when it does not fit head_dim."""
    if spec.kind == "all":
        return list(range(head_dim))
    if spec.kind == "rest":
        return [c for c in range(head_dim) if c not in taken]
    builtin = RECORDS.get(spec.kind)
    if builtin is not None and builtin.channels is not None:
        return builtin.channels(head_dim, *spec.args)
    raise EvalIssue(f"unknown channel group '{spec.kind}'")  # pragma: no cover


def channel_ranges(chans) -> str:
    """Channel indices as compact ranges: (0, 1, 2, 3, 8, 9) -> '0-3, 8-9' ('none' when empty)."""
    chans = sorted(chans)
    out, i = [], 0
    while i < len(chans):
        j = i
        while j + 1 < len(chans) and chans[j + 1] == chans[j] + 1:
            j += 1
        out.append(str(chans[i]) if i == j else f"{chans[i]}-{chans[j]}")
        i = j + 1
    return ", ".join(out) or "none"
