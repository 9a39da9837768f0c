"""Several seeds: the mean and spread of every number, and whether a difference is significant.

A study run with ``--seeds 0,1,2`` trains every scheme once per seed. Every number of the
report (a perplexity ratio, an accuracy, a far mass) is then summarised over the seeds by
:func:`spread`: the mean and the **min-max range** (with three seeds a range is more honest
than a standard error). Two schemes differ **significantly** (:func:`significant`) only when
their ranges do not overlap: a difference smaller than the spread of the two is flagged as not
significant. With a single seed there is no spread, and no claim of significance is made.

:func:`aggregate` turns per-seed result trees (nested dicts with numbers at the leaves, the
format of eval.json / analysis.json / retrieval.json) into one tree of the same shape whose
leaves are the means, plus a parallel tree of spreads.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v))]


def spread(values: Iterable[Any]) -> dict[str, float | int] | None:
    """``{"mean", "min", "max", "n"}`` of the finite values, or None when there are none."""
    xs = _finite(values)
    if not xs:
        return None
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def significant(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """True when the spreads ``a`` and ``b`` are apart (their min-max ranges do not overlap),
    False when the difference of the means is within the spread, None without two seeds each."""
    if not a or not b or a.get("n", 0) < 2 or b.get("n", 0) < 2:
        return None
    return a["min"] > b["max"] or b["min"] > a["max"]


def fmt(s: Mapping[str, Any] | None, spec: str = ".3f") -> str:
    """``"1.234 [1.100, 1.400]"`` (mean [min, max]); the mean alone for one seed; ``"-"`` for none."""
    if not s:
        return "-"
    if s.get("n", 1) < 2:
        return format(s["mean"], spec)
    return f"{format(s['mean'], spec)} [{format(s['min'], spec)}, {format(s['max'], spec)}]"


def aggregate(trees: list[Any]) -> tuple[Any, Any]:
    """(means, spreads) of per-seed trees of the same shape; keys missing in some trees are
    aggregated over the trees that have them; non-numeric leaves are taken from the first."""
    present = [t for t in trees if t is not None]
    if not present:
        return None, None
    first = present[0]
    if isinstance(first, Mapping):
        keys: list[str] = []
        for t in present:
            if isinstance(t, Mapping):
                keys += [k for k in t if k not in keys]
        means, spreads = {}, {}
        for k in keys:
            m, s = aggregate([t.get(k) for t in present if isinstance(t, Mapping)])
            means[k], spreads[k] = m, s
        return means, spreads
    if isinstance(first, list) and all(isinstance(t, list) and len(t) == len(first) for t in present):
        pairs = [aggregate([t[i] for t in present]) for i in range(len(first))]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    s = spread(present)
    if s is not None and len(_finite(present)) == len(present):
        return s["mean"], s
    return first, None


def spread_at(spreads: Any, *path: str) -> dict | None:
    """The spread at ``path`` of a spreads tree (None when absent)."""
    node = spreads
    for p in path:
        if not isinstance(node, Mapping) or p not in node:
            return None
        node = node[p]
    return dict(node) if isinstance(node, Mapping) and "mean" in node and "n" in node else None


def flag(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    """A mark for a report cell compared with a reference: ``" (n.s.)"`` when the difference is
    within the spread (not significant), ``""`` when it is significant or cannot be judged."""
    return " (n.s.)" if significant(a, b) is False else ""
