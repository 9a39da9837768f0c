"""The report of the extension study over seeds (:mod:`pedsl.study.extension.seeds`): every ratio and
accuracy as mean [min, max] over the seeds, ``(n.s.)`` where within the spread of plain RoPE at the
same length, and the curves with their min-max bands."""

from __future__ import annotations

from pathlib import Path

from pedsl.study import seeds as sd
from pedsl.study.page import Bullets, Page, Table, images
from pedsl.study.plots import MARKERS, band_plot, length_axis, mark_train, plt, save_figure

PARTS = (("zero_shot", "zero-shot (weights as trained, scheme swapped)"),
         ("fine_tuned", "after the fine-tune at the target length"))


def _cells(agg: dict, part: str, method: str, T: str | int) -> dict | None:
    """The cells (``{str(L): spread}``) of ``method`` at target ``T``; zero-shot RoPE is one model
    whatever the target (kept once by :func:`aggregate`)."""
    per = agg[part].get(method) or {}
    if part == "zero_shot" and method == "rope":
        return next(iter(per.values()), None)
    return per.get(str(T))


def _reference(agg: dict, part: str, T: str) -> dict | None:
    """Plain RoPE's cells for a comparison: zero-shot RoPE (one model), or fine-tuned RoPE at ``T``."""
    return _cells(agg, part, "rope", T)


def tables(aggregated: dict, meta: dict) -> list[Table]:
    out = []
    for task, agg in aggregated.items():
        L0, lens = agg["context"], agg["lengths"]
        spec = ".3f" if task == "text" else ".2f"
        for part, label in PARTS:
            rows = []
            for method, per in agg[part].items():
                for T, cells in per.items():
                    ref = _reference(agg, part, T) if method != "rope" else None
                    target = "-" if (part == "zero_shot" and method == "rope") else f"{T}x"
                    rows.append([method, target] + [sd.fmt(cells.get(str(L)), spec)
                                                    + sd.flag(cells.get(str(L)), (ref or {}).get(str(L)))
                                                    for L in lens])
            what = "perplexity ratio to each seed's base model at " + str(L0) if task == "text" else \
                "exact-offset accuracy at the block ends (chance 0.04)"
            note = (f"mean [min, max] over {agg['seeds']} seeds; (n.s.): within the spread of "
                    f"{'zero-shot' if part == 'zero_shot' else 'fine-tuned'} RoPE at the same length.")
            out.append(Table(f"{'Text' if task == 'text' else 'Block task'}: {what}, {label}",
                        ["method", "factor"] + [f"{L / L0:g}x" for L in lens], rows, note))
    return out


def summary(aggregated: dict) -> tuple[list[str], list[list[str]]]:
    """One row per method and target: text ratio at 1x and at the target, zero-shot and fine-tuned."""
    text = aggregated.get("text")
    header = ["method", "target", "zero-shot 1x", "zero-shot @ target", "fine-tuned 1x", "fine-tuned @ target"]
    rows: list[list[str]] = []
    if not text:
        return header, rows
    L0 = text["context"]
    for method, per in text["fine_tuned"].items():
        for T, ft in per.items():
            zs = _cells(text, "zero_shot", method, T) or {}
            at = str(L0 * int(T))
            rz, rf = _reference(text, "zero_shot", T) or {}, _reference(text, "fine_tuned", T) or {}
            mark = method != "rope"
            rows.append([method, f"{T}x", sd.fmt(zs.get(str(L0))),
                         sd.fmt(zs.get(at)) + (sd.flag(zs.get(at), rz.get(at)) if mark else ""),
                         sd.fmt(ft.get(str(L0))),
                         sd.fmt(ft.get(at)) + (sd.flag(ft.get(at), rf.get(at)) if mark else "")])
    return header, rows


def findings(aggregated: dict) -> list[str]:
    """At each target: the best fine-tuned and zero-shot method on text and whether its lead over
    the runner-up is larger than their spreads."""
    text = aggregated.get("text")
    if not text:
        return []
    L0, out = text["context"], []
    targets = sorted({int(T) for per in text["fine_tuned"].values() for T in per})
    for T in targets:
        at = str(L0 * T)
        for part, word in (("zero_shot", "zero-shot"), ("fine_tuned", "fine-tuned")):
            cells = {}
            for method in text[part]:
                c = (_cells(text, part, method, T) or {}).get(at)
                if c:
                    cells[method] = c
            if len(cells) < 2:
                continue
            order = sorted(cells, key=lambda m: cells[m]["mean"])
            a, b = order[0], order[1]
            sig = sd.significant(cells[a], cells[b])
            verdict = {True: "beyond the spread", False: "within the spread (not significant)",
                       None: "no spread to judge with"}[sig]
            out.append(f"{T}x {word} at {at}: best {a} {sd.fmt(cells[a])}, then {b} {sd.fmt(cells[b])}: "
                       f"the lead is {verdict}.")
    return out


def plots(aggregated: dict, out_dir: Path) -> list[str]:
    files: list[str] = []
    for task, agg in aggregated.items():
        L0, lens = agg["context"], agg["lengths"]
        targets = sorted({int(T) for per in agg["fine_tuned"].values() for T in per})
        fig, axes = plt.subplots(len(targets), 2, figsize=(12, 4.6 * len(targets)), squeeze=False,
                                 constrained_layout=True)
        for i, T in enumerate(targets):
            for j, (part, _) in enumerate(PARTS):
                ax = axes[i][j]
                for n, method in enumerate(agg[part]):
                    cells = _cells(agg, part, method, T)
                    pts = [(L, cells[str(L)]) for L in lens if cells and cells.get(str(L))]
                    if pts:
                        band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=method,
                                  marker=MARKERS[n % len(MARKERS)])
                length_axis(ax, lens)
                mark_train(ax, L0)
                ax.axvline(L0 * T, color="tab:red", linestyle=":", linewidth=1)
                if task == "text":
                    ax.set_yscale("log")
                    ax.set_ylabel(f"ppl(L) / ppl_base({L0})")
                else:
                    ax.set_ylim(0, 1.02)
                    ax.set_ylabel("block-end accuracy")
                ax.set_title(f"{'zero-shot' if part == 'zero_shot' else 'fine-tuned'}, factor for {T}x "
                             f"(target {L0 * T}, dotted); band: min-max over {agg['seeds']} seeds", fontsize=9)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8)
        fig.suptitle("Text perplexity ratio vs length" if task == "text" else "Exact-offset accuracy vs length")
        files += save_figure(fig, out_dir, f"extension_seeds_{task}")
    return files


def _intro(meta: dict) -> str:
    return (f"The extension study once per training seed ({', '.join(map(str, meta['seeds']))}); each seed's "
            f"own report is in extension/seed<k>/. Methods: {', '.join(meta['methods'])}. This invocation "
            f"took {meta.get('wall_time_s', 0):.0f} s wall, {meta.get('cpu_time_s', 0):.0f} s CPU.")


def page(aggregated: dict, meta: dict, files: list[str]) -> Page:
    header, rows = summary(aggregated)
    return Page(f"pedsl compare --study extension over seeds {', '.join(map(str, meta['seeds']))}", _intro(meta),
                [Table("Summary (text)", header, rows), Bullets("Findings", findings(aggregated), always=True),
                 *tables(aggregated, meta), images(files)], meta, html_title="pedsl extension study, seeds")
