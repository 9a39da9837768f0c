"""The seeded studies' plots (PNG + SVG, every axis labelled, legends only where there are lines).

- ``acc_vs_length``: whole-answer accuracy vs evaluation length, one panel per task and one for
  the mean over tasks; a line per scheme with its min-max band over seeds; chance marked.
- ``acc_vs_depth``: accuracy vs needle depth at the training length, same layout.
- ``niah_<task>`` and ``niah_all``: the needle-in-a-haystack heatmap, one panel per scheme,
  length (x) by depth (y), colour = accuracy (mean over seeds).
- ``ppl_ratio``: perplexity ratio vs length on the text corpus, with bands.
- ``far_mass``: far attention mass vs length, with bands.
- ``sink_mass``: attention on the first token and, when a scheme has one, on its learned sink vs
  length, with bands (one panel each).
- ``loss_curves``: training (and validation) loss vs step, one panel per scheme, a line per seed.
"""

from __future__ import annotations

import math
from pathlib import Path

from pedsl.data.tasks import TASKS
from pedsl.study.plots import (MARKERS, band_plot, far_mass_figure, length_axis, loss_curves, mark_train, plt,
                               place_legend, ratio_axis, save_figure)
from pedsl.study.seeded.series import TASK_TITLES, acc_points, depth_points, ppl_source


def plots(results: dict, per_seed: dict, out_dir: Path, meta: dict) -> dict[str, list[str]]:
    out_dir = Path(out_dir)
    ctx = meta["context"]
    files: dict[str, list[str]] = {}
    panels = list(TASKS) + ["all"]
    # accuracy vs length
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True)
    any_ = False
    for ax, task in zip(axes, panels):
        lengths: set[int] = set()
        for n, (name, r) in enumerate(results.items()):
            x, s = acc_points(r, task)
            if x:
                band_plot(ax, x, s, label=name, marker=MARKERS[n % len(MARKERS)])
                lengths |= set(x)
                any_ = True
        if lengths:
            length_axis(ax, sorted(lengths))
            mark_train(ax, ctx)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(TASK_TITLES[task], fontsize=9)
    axes[0].set_ylabel("accuracy (whole answer right)")
    _legend(axes[-1])
    files["acc_vs_length"] = save_figure(fig, out_dir, "acc_vs_length") if any_ else _close(fig)
    # accuracy vs depth at the training length
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True)
    any_ = False
    for ax, task in zip(axes, panels):
        for n, (name, r) in enumerate(results.items()):
            at_depths, s = depth_points(r, task, ctx)
            if at_depths:
                band_plot(ax, at_depths, s, label=name, marker=MARKERS[n % len(MARKERS)])
                any_ = True
        ax.set_xlabel("needle depth (0 = start of the haystack, 1 = just before the question)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{TASK_TITLES[task]} @ {ctx}", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("accuracy (whole answer right)")
    _legend(axes[-1])
    files["acc_vs_depth"] = save_figure(fig, out_dir, "acc_vs_depth") if any_ else _close(fig)
    for task in panels:
        files[f"niah_{task}"] = heatmap(results, out_dir, task, ctx)
    files["ppl_ratio"] = ppl_ratio(results, out_dir, ctx, ppl_source(meta))
    files["far_mass"] = far_mass(results, out_dir, ctx)
    files["sink_mass"] = sink_mass(results, out_dir, ctx)
    files["loss_curves"] = loss_curves({name: {s: Path(out_dir) / r["run_dir"] for s, r in runs.items()}
                                        for name, runs in per_seed.items()}, out_dir)
    return {k: v for k, v in files.items() if v}


def _legend(ax) -> None:
    place_legend(ax, 7)


def _close(fig) -> list[str]:
    plt.close(fig)
    return []


def heatmap(results: dict, out_dir: Path, task: str, ctx: int) -> list[str]:
    """One panel per scheme: accuracy (mean over seeds) by length (x) and depth (y)."""
    grids = {}
    for name, r in results.items():
        m = (r.get("mean") or {}).get("retrieval") or {}
        tasks = list(TASKS) if task == "all" else [task]
        cells: dict[tuple[int, float], list[float]] = {}
        for t in tasks:
            for L, rec in ((m.get("tasks") or {}).get(t) or {}).items():
                for d, v in (rec.get("depths") or {}).items():
                    if v.get("accuracy") is not None:
                        cells.setdefault((int(L), float(d)), []).append(v["accuracy"])
        if cells:
            grids[name] = {k: sum(v) / len(v) for k, v in cells.items()}
    if not grids:
        return []
    lengths = sorted({L for g in grids.values() for L, _ in g})
    depths = sorted({d for g in grids.values() for _, d in g})
    n = len(grids)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    fig.subplots_adjust(wspace=0.45, hspace=0.55)
    im = None
    for ax, (name, g) in zip(axes.flat, grids.items()):
        z = [[g.get((L, d), float("nan")) for L in lengths] for d in depths]
        im = ax.imshow(z, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="RdYlGn")
        ax.set_xticks(range(len(lengths)))
        ax.set_xticklabels([f"{L / ctx:g}x" for L in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)))
        ax.set_yticklabels([f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel(f"length (x training length {ctx})", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(name, fontsize=9)
        for i, d in enumerate(depths):
            for j, L in enumerate(lengths):
                v = g.get((L, d))
                if v is not None:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"Needle in a haystack: {TASK_TITLES[task]} (accuracy, mean over seeds)", fontsize=10)
    assert im is not None  # grids is not empty (returned above), so one image was drawn
    fig.colorbar(im, ax=list(axes.flat), shrink=0.8, label="accuracy")
    return save_figure(fig, out_dir, f"niah_{task}")

def ppl_ratio(results: dict, out_dir: Path, ctx: int, on: str = "the text corpus") -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths: set[int] = set()
    for n, (name, r) in enumerate(results.items()):
        sp = ((r.get("spread") or {}).get("eval") or {}).get("ppl") or {}
        pts = sorted((int(L), v["ratio"]) for L, v in sp.items() if isinstance(v, dict) and v.get("ratio"))
        if pts:
            band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
            lengths |= {p[0] for p in pts}
    if not lengths:
        return _close(fig)
    ratio_axis(ax)
    length_axis(ax, sorted(lengths))
    mark_train(ax, ctx)
    ax.set_title(f"Perplexity on {on} (band: min-max over seeds)")
    _legend(ax)
    return save_figure(fig, out_dir, "ppl_ratio")


def far_mass(results: dict, out_dir: Path, ctx: int) -> list[str]:
    series, W = {}, None
    for name, r in results.items():
        an = (r.get("spread") or {}).get("analysis") or {}
        fm = (an.get("summary") or {}).get("far_mass") or {}
        pts = sorted((int(L), v) for L, v in fm.items() if isinstance(v, dict))
        if pts:
            series[name] = pts
            W = ((r.get("mean") or {}).get("analysis") or {}).get("far_window", W)
    return far_mass_figure(series, W, ctx, out_dir, "Far attention mass vs length (band: min-max over seeds)",
                           legend_size=7)


def sink_mass(results: dict, out_dir: Path, ctx: int) -> list[str]:
    """First-token mass and learned-sink share vs length (mean over layers and heads), with bands."""
    keys = [("sink_mass", "attention on the first token")]
    if any(v for r in results.values() for v in ((((r.get("mean") or {}).get("analysis") or {})
                                                  .get("summary") or {}).get("learned_sink_mass") or {}).values()):
        keys.append(("learned_sink_mass", "share of the learned sink"))
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.2), squeeze=False)
    lengths: set[int] = set()
    for ax, (key, title) in zip(axes[0], keys):
        for n, (name, r) in enumerate(results.items()):
            sm = ((((r.get("spread") or {}).get("analysis") or {}).get("summary") or {}).get(key) or {})
            pts = sorted((int(L), v) for L, v in sm.items() if isinstance(v, dict))
            if pts:
                band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
                lengths |= {p[0] for p in pts}
        ax.set_title(f"{title} (band: min-max over seeds)", fontsize=9)
        ax.set_ylabel("mass (mean over layers, heads, queries)")
    if not lengths:
        return _close(fig)
    for ax in axes[0]:
        length_axis(ax, sorted(lengths))
        mark_train(ax, ctx)
    _legend(axes[0][-1])
    return save_figure(fig, out_dir, "sink_mass")
