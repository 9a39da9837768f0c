"""The counting study's report: exact accuracy per task and evaluation condition (mean [min, max]
over seeds, a table per task and band plots), the accuracy per k at the longest segments, and the
loss curves."""

from __future__ import annotations

from pathlib import Path

from pedsl.data.counting import CHANCE
from pedsl.study import seeds as sd
from pedsl.study.page import Block, Bullets, Note, Page, Table, figures
from pedsl.study.plots import MARKERS, band_plot, loss_curves, plt, save_figure

REFERENCE = "rope"  # the claim under test: CoPE counts segments where token-count positions (RoPE) fail
TASK_WORDS = {"select_last": "the value after the k-th last marker",
              "sentence_first": "the first letter of the k-th last sentence"}


def condition_words(label: str, context: int) -> str:
    """``"4x2"`` -> ``"L 512, segments x2"`` (rows R times the context, segments S times as long)."""
    rows, stretch = (int(p) for p in label.split("x"))
    return f"L {rows * context}, segments x{stretch}" + (" (train)" if (rows, stretch) == (1, 1) else "")


def _spread(r: dict, task: str, cond: str, *rest: str) -> dict | None:
    return sd.spread_at(r.get("spread"), task, cond, *rest)


def tables(results: dict, meta: dict) -> list[Table]:
    ref = REFERENCE if REFERENCE in results else next(iter(results), None)
    several = len(meta.get("seeds") or []) > 1
    note = (f" (n.s.) marks a difference from {ref} within the spread (min-max ranges overlap): not significant."
            if several else " One seed: no spread, no significance claimed.")
    out = []
    for task in meta["tasks"]:
        header = ["scheme"] + [condition_words(c, meta["context"]) for c in meta["evals"]]
        rows = []
        for name, r in results.items():
            rows.append([name] + [sd.fmt(_spread(r, task, c, "accuracy"), ".3f") + ("" if name == ref else sd.flag(
                _spread(r, task, c, "accuracy"), _spread(results[ref], task, c, "accuracy"))) for c in meta["evals"]])
        out.append(Table(f"{task}: accuracy ({TASK_WORDS.get(task, task)})", header, rows,
                         f"Exact accuracy over the answers, mean [min, max] over seeds {meta.get('seeds')}; "
                         f"{meta.get('windows')} fresh rows per condition, the same for every scheme; chance "
                         f"{CHANCE:.3f}; k in 1..{meta.get('back')}." + note))
    return out


def by_back(results: dict, meta: dict) -> Table:
    """Accuracy per k at the last condition (the longest segments): where counting shows."""
    cond = meta["evals"][-1]
    ks = sorted({k for r in results.values() for t in meta["tasks"]
                 for k in ((r.get("mean") or {}).get(t, {}).get(cond, {}).get("by_back") or {})}, key=int)
    header = ["scheme"] + [f"{t} k={k}" for t in meta["tasks"] for k in ks]
    rows = [[name] + [sd.fmt(_spread(r, t, cond, "by_back", k), ".2f") for t in meta["tasks"] for k in ks]
            for name, r in results.items()]
    return Table(f"Accuracy per k at {condition_words(cond, meta['context'])}", header, rows,
                 "k = 1 is the last occurrence; a recency bias alone finds it, k >= 2 needs a count.")


def page(results: dict, meta: dict, plots: dict[str, list[str]]) -> Page:
    intro = (f"Every scheme trained on `{meta['data']}` (preset {meta['preset']}, {meta['steps']} steps, context "
             f"{meta['context']}, seeds {meta['seeds']}), then evaluated on fresh rows with more segments (longer "
             "rows) and longer segments (the k-th last marker farther in tokens, the same count back). Schemes: "
             + "; ".join(f"`{n}` ({meta['titles'].get(n, n)})" for n in results) + ".")
    blocks: list[Block] = [*tables(results, meta), by_back(results, meta)]
    if meta.get("skipped"):
        blocks.append(Bullets("Schemes left out (not loadable in this pedsl)",
                              [f"`{n}`: {why}" for n, why in meta["skipped"].items()]))
    blocks.append(Note(f"Training CPU time: {meta.get('train_cpu_s', 0):.0f} s over all runs. An answer is right when "
                       "the greedy next byte is exactly it; every answer is one uppercase letter (chance 1/26)."))
    caps = {"accuracy": "Accuracy per evaluation condition (band: min-max over seeds)",
            "loss_curves": "Training curves"}
    blocks.append(figures(plots, caps))
    return Page("Counting segments (selective copy, k-th last sentence)", intro, blocks, meta)


def plots(results: dict, per_seed: dict, out: Path, meta: dict) -> dict[str, list[str]]:
    files = {"accuracy": _bands(results, out, meta),
             "loss_curves": loss_curves({n: {s: out / r["run_dir"] for s, r in runs.items()}
                                         for n, runs in per_seed.items()}, out)}
    return {k: v for k, v in files.items() if v}


def _bands(results: dict, out: Path, meta: dict) -> list[str]:
    tasks, conds = meta["tasks"], meta["evals"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False, sharey=True)
    for task, ax in zip(tasks, axes[0]):
        for n, (name, r) in enumerate(results.items()):
            pts = [(i, s) for i, c in enumerate(conds) if (s := _spread(r, task, c, "accuracy")) is not None]
            if pts:
                band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
        ax.axhline(CHANCE, color="grey", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(conds)))
        ax.set_xticklabels([condition_words(c, meta["context"]).replace(", ", "\n") for c in conds], fontsize=8)
        ax.set_title(f"{task}: {TASK_WORDS.get(task, task)}", fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("exact accuracy (dotted: chance)")
    axes[0][-1].legend(fontsize=8)
    return save_figure(fig, out, "accuracy")


__all__ = ["by_back", "page", "plots", "tables"]
