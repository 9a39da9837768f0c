"""The gallery's figure of one scheme, drawn from pedsl's own analysis: the rotary periods per pair
(``pedsl.diffing.facts``, as ``pedsl explain`` lists them) and the curves of ``pedsl diff --numeric``
(``pedsl.diffing.numeric.curves``: exact float64 tables for static schemes, one seeded draw at
initialisation for data-dependent ones)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pedsl.diffing.facts import scheme_facts
from pedsl.diffing.numeric import curves
from pedsl.fsio import ensure_dir, write_figure
from pedsl.lang.scheme import Scheme

CAPTION = ("*Left*: the period (tokens per cycle) of every rotary pair with a fixed frequency, against the "
           "training length. *Middle*: the mean correlation `<u, T(j -> i) u>` of a unit vector with itself "
           "transported over the distance `i - j` (1: the score does not depend on the distance; it falls "
           "as pairs rotate away). *Right*: the logit bias per head against the distance. Data-dependent and "
           "learned schemes are drawn as they start, at initialisation (one seeded draw); the curves are "
           "those of `pedsl diff --numeric`.")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def _periods(ax, s: Scheme) -> None:
    facts = scheme_facts(s, graph=False)
    ax.set_title("rotary periods")
    groups = [g for g in facts.groups if g.freqs]
    if not groups:
        _empty(ax, "no rotary pairs with a fixed frequency")
        return
    for g in groups:
        periods = [2 * math.pi / w if w > 0 else math.inf for w in g.freqs]
        ax.semilogy(range(len(periods)), periods, "o-", ms=3, label=f"group {g.name}")
    if facts.train_length:
        ax.axhline(facts.train_length, color="grey", ls="--", lw=1, label=f"training length {facts.train_length}")
    ax.set_xlabel("rotary pair")
    ax.set_ylabel("period (tokens)")
    ax.legend(fontsize="x-small")


def _curves(axes, s: Scheme) -> None:
    c = curves(s)  # every library scheme has its curves: a failure here is a bug of diff --numeric
    d = np.arange(len(c.transport))
    axes[0].plot(d, c.transport)
    axes[0].set_ylim(min(-0.05, float(np.nanmin(c.transport)) - 0.05), max(1.05, float(np.nanmax(c.transport)) + 0.05))
    axes[0].set_xlabel("distance i - j (tokens)")
    axes[0].set_ylabel("mean <u, T(j->i) u>")
    axes[0].set_title("transport correlation")
    axes[1].set_title("bias per head")
    if not np.any(c.bias != 0):
        _empty(axes[1], "no bias")
        return
    for h in range(c.bias.shape[0]):
        axes[1].plot(d[: c.bias.shape[1]], c.bias[h], label=f"head {h}")
    axes[1].legend(fontsize="x-small")
    axes[1].set_xlabel("distance i - j (tokens)")
    axes[1].set_ylabel("logit bias b(i, j)")


def draw(s: Scheme, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    _periods(axes[0], s)
    _curves(axes[1:], s)
    fig.suptitle(f"{s.name}: {s.doc}" if s.doc else s.name, fontsize=10)
    fig.tight_layout()
    ensure_dir(path.parent)
    try:
        write_figure(fig, path, dpi=90, metadata={"Software": None})
    finally:
        plt.close(fig)
