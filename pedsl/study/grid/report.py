"""The grid study's report: accuracy and perplexity vs grid side (mean [min, max] over seeds, tables
and band plots), one query's attention drawn over the grid per scheme, and the loss curves."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pedsl.study import seeds as sd
from pedsl.study.grid.measure import query_index
from pedsl.study.page import Block, Bullets, Note, Page, Table, figures
from pedsl.study.plots import MARKERS, band_plot, loss_curves, plt, save_figure

REFERENCE = "rope_2d"  # the claim under test: RoPE-Mixed extrapolates better than axial RoPE
METRICS = {"accuracy": ("accuracy on the determined cells", ".3f"), "ppl": ("perplexity over every cell", ".3f")}


def _sides(results: dict) -> list[int]:
    return sorted({int(S) for r in results.values() for S in (r.get("mean") or {})})


def _spread(r: dict, S: int, metric: str) -> dict | None:
    return sd.spread_at(r.get("spread"), str(S), metric)


def tables(results: dict, meta: dict) -> list[Table]:
    sides = _sides(results)
    ref = REFERENCE if REFERENCE in results else next(iter(results), None)
    several = len(meta.get("seeds") or []) > 1
    note = (f" (n.s.) marks a difference from {ref} within the spread (min-max ranges overlap): not significant."
            if several else " One seed: no spread, no significance claimed.")
    out = []
    for metric, (words, spec) in METRICS.items():
        header = ["scheme"] + [f"{S}x{S}" + (" (train)" if S == meta.get("train_side") else "") for S in sides]
        rows = []
        for name, r in results.items():
            cells = [sd.fmt(_spread(r, S, metric), spec) + ("" if name == ref else
                     sd.flag(_spread(r, S, metric), _spread(results[ref], S, metric))) for S in sides]
            rows.append([f"{name}"] + cells)
        out.append(Table(f"{words.capitalize()} vs grid side", header, rows,
                         f"Mean [min, max] over seeds {meta.get('seeds')}; {meta.get('windows')} fresh grids of the "
                         f"'{meta.get('task')}' task per side, the same for every scheme." + note))
    return out


def page(results: dict, meta: dict, plots: dict[str, list[str]]) -> Page:
    intro = (f"Every scheme trained on the `{meta['task']}` task at {meta['train_side']}x{meta['train_side']} "
             f"(preset {meta['preset']}, {meta['steps']} steps, seeds {meta['seeds']}), then evaluated on larger "
             f"grids: resolution extrapolation. Schemes: "
             + "; ".join(f"`{n}` ({meta['titles'].get(n, n)})" for n in results) + ".")
    blocks: list[Block] = [*tables(results, meta)]
    if meta.get("skipped"):
        blocks.append(Bullets("Schemes left out (not loadable in this pedsl)",
                              [f"`{n}`: {why}" for n, why in meta["skipped"].items()]))
    blocks.append(Note(f"Training CPU time: {meta.get('train_cpu_s', 0):.0f} s over all runs. Accuracy counts the "
                       "cells the task's rule determines from earlier cells (an oracle reading them scores 1.0); perplexity "
                       "covers every cell, the unpredictable ones included."))
    caps = {"accuracy": "Accuracy vs grid side (band: min-max over seeds)",
            "ppl": "Perplexity vs grid side (band: min-max over seeds)", "loss_curves": "Training curves"}
    for name in results:
        caps[f"attention_{name}"] = (f"{name}: the centre query's attention over the grid, per layer and head "
                                     f"(first seed; x marks the query, the rest of the grid is not yet seen)")
    blocks.append(figures(plots, caps))
    return Page("Resolution extrapolation on 2-D grids", intro, blocks, meta)


def plots(results: dict, per_seed: dict, out: Path, meta: dict) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for metric in METRICS:
        files[metric] = _band(results, metric, out, meta)
    for name, runs in per_seed.items():
        first = runs[min(runs)]["grid"]
        if first.get("maps"):
            files[f"attention_{name}"] = _maps(name, first, out)
    files["loss_curves"] = loss_curves({n: {s: out / r["run_dir"] for s, r in runs.items()}
                                        for n, runs in per_seed.items()}, out)
    return {k: v for k, v in files.items() if v}


def _band(results: dict, metric: str, out: Path, meta: dict) -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sides = _sides(results)
    for n, (name, r) in enumerate(results.items()):
        pts = [(S, s) for S in sides if (s := _spread(r, S, metric)) is not None]
        if pts:
            band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
    ax.set_xscale("log", base=2)
    ax.set_xticks(sides)
    ax.set_xticklabels([f"{S}x{S}" for S in sides])
    ax.axvline(meta["train_side"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("grid side (log scale; dashed: the training side)")
    ax.set_ylabel(METRICS[metric][0])
    if metric == "ppl":
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, metric)


def _maps(name: str, grid: dict, out: Path) -> list[str]:
    """Rows: (side, layer), columns: heads; each panel the S x S weights (log colour scale)."""
    rows = [(int(S), li, layer) for S, layers in sorted(grid["maps"].items(), key=lambda kv: int(kv[0]))
            for li, layer in enumerate(layers)]
    heads = max(len(layer) for _, _, layer in rows)
    fig, axes = plt.subplots(len(rows), heads, figsize=(2.1 * heads, 2.2 * len(rows)), squeeze=False,
                             layout="constrained")
    for (S, li, layer), line in zip(rows, axes):
        t = query_index(S) - 1                                                # the query's cell, raster
        for h, ax in enumerate(line):
            ax.set_xticks([])
            ax.set_yticks([])
            if h >= len(layer):
                ax.axis("off")
                continue
            a = np.array([math.nan if v is None else v for v in layer[h]], dtype=float).reshape(S, S)
            im = ax.imshow(np.log10(np.clip(a, 1e-4, 1.0)), cmap="viridis", vmin=-4, vmax=0, interpolation="nearest")
            ax.plot([t % S], [t // S], "rx", markersize=5)
            start = grid["start"][str(S)][li][h]
            ax.set_title(f"{S}x{S} L{li} H{h} start {start:.2f}", fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.6, label="log10 attention weight")
    fig.suptitle(f"{name}: log10 attention of the centre query", fontsize=9)
    return save_figure(fig, out, f"attention_{name}")


__all__ = ["page", "plots", "tables"]
