"""The bias study's claims table: is each claimant's perplexity ratio flatter than each baseline's
past the training length, beyond the spread over seeds?

A cell compares the two schemes' ratio ppl(L) / ppl(L_train) at one length L > L_train by their
min-max ranges over the seeds (:mod:`pedsl.study.seeds`): **flatter** when the claimant's whole range
lies below the baseline's, **steeper** when above, **within spread** when the ranges overlap. With one
seed there is no range: the cell says lower or higher and makes no claim. The verdict of a pair counts
its cells: ``reproduces`` (flatter at every length), ``partly`` (at some), ``not beyond the spread``
(at none, steeper at none), ``no`` (steeper at some, flatter at none), ``mixed`` (both).
"""

from __future__ import annotations

from pedsl.study import seeds as sd
from pedsl.study.bias.recipe import BASELINES, CLAIMANTS
from pedsl.study.page import Table


def _ratio(result: dict, length: int) -> dict | None:
    return sd.spread_at((result.get("spread") or {}).get("eval"), "ppl", str(length), "ratio")


def judge(claimant: dict | None, baseline: dict | None) -> str:
    """``flatter`` / ``steeper`` / ``within spread`` for two ratio spreads (``lower`` / ``higher`` with one
    seed; ``-`` when either is missing)."""
    if not claimant or not baseline:
        return "-"
    apart = sd.significant(claimant, baseline)
    lower = claimant["mean"] < baseline["mean"]
    if apart is None:
        return "lower (1 seed)" if lower else "higher (1 seed)"
    if not apart:
        return "within spread"
    return "flatter" if lower else "steeper"


def _cell(word: str, claimant: dict | None, baseline: dict | None) -> str:
    if not claimant or not baseline:  # judge() said "-"
        return word
    return f"{word} ({claimant['mean']:.3f} vs {baseline['mean']:.3f})"


def verdict(words: list[str]) -> str:
    """The verdict of one claimant-baseline pair from the words of its cells (:func:`judge`; module docstring)."""
    judged = [w for w in words if w in ("flatter", "steeper", "within spread")]
    if not judged:
        return "no claim (one seed)" if any("1 seed" in w for w in words) else "-"
    n, flat, steep = len(judged), judged.count("flatter"), judged.count("steeper")
    if flat == n:
        return f"reproduces (flatter at {n}/{n})"
    if flat and steep:
        return f"mixed (flatter at {flat}/{n}, steeper at {steep}/{n})"
    if flat:
        return f"partly (flatter at {flat}/{n})"
    if steep:
        return f"no (steeper at {steep}/{n})"
    return f"not beyond the spread (0/{n})"


def claims_table(results: dict, meta: dict) -> Table | None:
    """One row per claimant-baseline pair present in ``results``, one column per length past the training
    length, and the verdict; None when no pair is present."""
    ctx = meta["context"]
    pairs = [(c, b) for c in CLAIMANTS for b in BASELINES if c in results and b in results]
    lens = sorted({int(L) for r in results.values()
                   for L in (((r.get("mean") or {}).get("eval") or {}).get("ppl") or {}) if int(L) > ctx})
    if not pairs or not lens:
        return None
    rows = []
    for c, b in pairs:
        spreads = [(_ratio(results[c], L), _ratio(results[b], L)) for L in lens]
        words = [judge(a, z) for a, z in spreads]
        rows.append([f"{c} vs {b}", *(_cell(w, a, z) for w, (a, z) in zip(words, spreads)), verdict(words)])
    header = ["claim: flatter than", *[f"{L} ({L / ctx:g}x)" for L in lens], "verdict"]
    return Table("Claims: FIRE and KERPLE extrapolate flatter than T5 and ALiBi", header, rows,
                 "Perplexity ratio ppl(L) / ppl(L_train) of the claimant against the baseline at each length past "
                 f"the training length {ctx}, over seeds {meta.get('seeds')}: flatter / steeper when the min-max "
                 "ranges are apart, within spread when they overlap; in brackets the mean ratios (claimant vs baseline).")
