"""The extension study's report (:mod:`pedsl.study.extension.run`): tables, plots, findings.

Perplexity ratios are to the base RoPE model's perplexity at its training length ``L0`` (the
same scored bytes everywhere), so the 1x column is the in-distribution cost of a swap or a
fine-tune. Block-task cells are accuracies at the block ends (chance 1/26).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.ticker

from pedsl.study.page import Bullets, Note, Page, Table, fmt, images
from pedsl.study.plots import MARKERS, length_axis, mark_train, plt, save_figure


def _base_nll(rec: dict) -> float | None:
    """The base model's NLL at L0: the zero-shot RoPE evaluation at 1x."""
    L0 = rec["base"]["context"]
    rope = next(iter((rec["zero_shot"].get("rope") or {}).values()), None)
    return (((rope or {}).get("ppl") or {}).get(str(L0)) or {}).get("nll")


def ratio(rec: dict, ev: dict | None, L: int) -> float | None:
    base = _base_nll(rec)
    cell = ((ev or {}).get("ppl") or {}).get(str(L)) or {}
    if base is None or cell.get("nll") is None:
        return None
    return math.exp(min(cell["nll"] - base, 700.0))


def accuracy(ev: dict | None, L: int) -> float | None:
    return (((ev or {}).get("blocks") or {}).get(str(L)) or {}).get("accuracy")


def _rows(rec: dict, part: str, task: str) -> list[tuple[str, str, dict]]:
    """(method, target label, evaluation) in table order; zero-shot RoPE once (no factor)."""
    out: list[tuple[str, str, dict]] = []
    for method, per in rec[part].items():
        for T, ev in per.items():
            if part == "zero_shot" and method == "rope" and out and out[-1][0] == "rope":
                continue
            out.append((method, "-" if (part == "zero_shot" and method == "rope") else f"{T}x", ev))
    return out


def tables(results: dict, meta: dict) -> list[Table]:
    out = []
    for task, rec in results.items():
        L0, lens = rec["base"]["context"], rec["lengths"]
        cols = [f"{L / L0:g}x" for L in lens]
        for part, label in (("zero_shot", "zero-shot (weights as trained, scheme swapped)"),
                            ("fine_tuned", f"after {rec['ft_steps']} fine-tune steps at the target length")):
            rows = []
            for method, target, ev in _rows(rec, part, task):
                if task == "text":
                    rows.append([method, target] + [fmt(ratio(rec, ev, L)) for L in lens])
                else:
                    rows.append([method, target] + [fmt(accuracy(ev, L), ".2f") for L in lens])
            if task == "text":
                title = f"Text: perplexity ratio to the base model at {L0}, {label}"
                base_nll = _base_nll(rec)
                note = (f"ppl(L) / ppl_base({L0}); every cell scores the same last {L0} bytes of the same "
                        f"{rec['samples']} validation windows. The 1x column is the in-distribution cost. "
                        f"Base perplexity at {L0}: {fmt(math.exp(base_nll) if base_nll else None)}.")
            else:
                title = f"Exact offset (block task): accuracy at the block ends, {label}"
                note = (f"Fraction of block ends predicted right (chance 0.04) among the block ends in the last "
                        f"{L0} positions, {rec['samples']} sequences per length; the answer is the letter "
                        f"a fixed distance back.")
            out.append(Table(title, ["method", "factor"] + cols, rows, note))
    return out


def summary(results: dict) -> tuple[list[str], list[list[str]]]:
    """One row per method and target: the numbers the study is about."""
    text, blocks = results.get("text"), results.get("blocks")
    header = ["method", "target", "zero-shot 1x", "zero-shot @ target", "fine-tuned 1x", "fine-tuned @ target"]
    if blocks:
        header += ["blocks acc 1x zero-shot", "blocks acc 1x fine-tuned"]
    rows = []
    for method, per in (text or {}).get("zero_shot", {}).items():
        for T, zs in per.items():
            assert text is not None  # the loop runs over text's own entries
            L0 = text["base"]["context"]
            ft = text["fine_tuned"].get(method, {}).get(T)
            row = [method, f"{T}x", fmt(ratio(text, zs, L0)), fmt(ratio(text, zs, L0 * int(T))),
                   fmt(ratio(text, ft, L0)), fmt(ratio(text, ft, L0 * int(T)))]
            if blocks:
                B0 = blocks["base"]["context"]
                bz = blocks["zero_shot"].get(method, {}).get(T)
                bf = blocks["fine_tuned"].get(method, {}).get(T)
                row += [fmt(accuracy(bz, B0), ".2f"), fmt(accuracy(bf, B0), ".2f")]
            rows.append(row)
    return header, rows


def findings(results: dict) -> list[str]:
    """Where the measurement agrees or disagrees with the published picture, stated from the numbers."""
    text = results.get("text")
    if not text:
        return []
    L0 = text["base"]["context"]
    out = []
    for T in sorted({int(t) for per in text["zero_shot"].values() for t in per}):
        at = L0 * T

        def zs(m):
            return ratio(text, text["zero_shot"].get(m, {}).get(str(T)), at)

        def ft(m):
            return ratio(text, text["fine_tuned"].get(m, {}).get(str(T)), at)

        if zs("pi") is not None and ft("pi") is not None:
            out.append(f"{T}x: PI zero-shot {zs('pi'):.2f} -> fine-tuned {ft('pi'):.2f} at {at} (the fine-tune "
                       f"changes it by {100 * (ft('pi') / zs('pi') - 1):+.0f}%; published: PI needs fine-tuning).")
        ntk_like = {m: r for m in ("ntk", "dynamic_ntk", "yarn") if (r := zs(m)) is not None}
        if ntk_like and zs("pi") is not None:
            best = min(ntk_like, key=ntk_like.__getitem__)
            out.append(f"{T}x zero-shot at {at}: best NTK-style {best} {ntk_like[best]:.2f} vs PI {zs('pi'):.2f} "
                       f"vs RoPE {fmt(zs('rope'))} ({'agrees' if ntk_like[best] < zs('pi') else 'disagrees'} "
                       f"with 'NTK-style scaling works better zero-shot').")
        fts = {m: r for m in text["fine_tuned"] if (r := ft(m)) is not None}
        if "yarn" in fts:
            order = sorted(fts, key=fts.__getitem__)
            out.append(f"{T}x fine-tuned at {at}: ranking {', '.join(f'{m} {fts[m]:.2f}' for m in order)}; YaRN is "
                       f"{'first' if order[0] == 'yarn' else 'number ' + str(order.index('yarn') + 1)} "
                       f"(published: YaRN strongest after a short fine-tune).")
    blocks = results.get("blocks")
    if blocks:
        B0 = blocks["base"]["context"]
        base_acc = accuracy(next(iter(blocks["zero_shot"].get("rope", {}).values()), None), B0)
        if base_acc is not None and base_acc < 0.5:
            out.append(f"Self-similarity: the base model did not learn the exact-offset task (accuracy "
                       f"{base_acc:.2f} at {B0}, chance 0.04), so the swaps say nothing about it; train longer.")
        for T in sorted({int(t) for per in blocks["zero_shot"].values() for t in per}):
            accs = {m: accuracy(per.get(str(T)), B0) for m, per in blocks["zero_shot"].items()}
            pi_txt = ratio(text, text["zero_shot"].get("pi", {}).get(str(T)), L0 * T)
            rope_txt = ratio(text, text["zero_shot"].get("rope", {}).get(str(T)), L0 * T)
            out.append(f"Self-similarity, {T}x: exact-offset accuracy at 1x after the zero-shot swap: "
                       + ", ".join(f"{m} {fmt(a, '.2f')}" for m, a in accs.items())
                       + f" (base {fmt(base_acc, '.2f')}); text ratio at {L0 * T}: PI {fmt(pi_txt)} vs RoPE "
                       f"{fmt(rope_txt)}.")
    return out


# ---------------------------------------------------------------------------------------------
# Plots


def plots(results: dict, out_dir: Path) -> list[str]:
    files: list[str] = []
    for task, rec in results.items():
        L0, lens = rec["base"]["context"], rec["lengths"]
        targets = sorted({int(t) for per in rec["zero_shot"].values() for t in per})
        fig, axes = plt.subplots(len(targets), 2, figsize=(12, 4.6 * len(targets)), squeeze=False,
                                 constrained_layout=True)
        for i, T in enumerate(targets):
            for j, part in enumerate(("zero_shot", "fine_tuned")):
                ax = axes[i][j]
                for n, (method, per) in enumerate(rec[part].items()):
                    ev = per.get(str(T))
                    ys = [ratio(rec, ev, L) if task == "text" else accuracy(ev, L) for L in lens]
                    pts = [(L, y) for L, y in zip(lens, ys) if y is not None]
                    if pts:
                        ax.plot(*zip(*pts), marker=MARKERS[n % len(MARKERS)], label=method)
                length_axis(ax, lens)
                mark_train(ax, L0)
                ax.axvline(L0 * T, color="tab:red", linestyle=":", linewidth=1)
                if task == "text":
                    ax.set_yscale("log")
                    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
                    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
                    ax.axhline(1.0, color="grey", linewidth=0.8)
                    ax.set_ylabel(f"ppl(L) / ppl_base({L0})")
                else:
                    ax.axhline(1 / 26, color="grey", linewidth=0.8, linestyle="--")
                    ax.set_ylabel("block-end accuracy")
                    ax.set_ylim(0, 1.02)
                ax.set_title(f"{'zero-shot' if part == 'zero_shot' else 'fine-tuned'}, factor for {T}x "
                             f"(target {L0 * T}, dotted)", fontsize=10)
                ax.legend(fontsize=8)
        fig.suptitle("Text perplexity ratio vs length" if task == "text" else "Exact-offset accuracy vs length")
        files += save_figure(fig, out_dir, f"extension_{task}")
    return files


# ---------------------------------------------------------------------------------------------
# Pages


def _intro(results: dict, meta: dict) -> str:
    text = results.get("text") or next(iter(results.values()))
    b = text["base"]
    ct = meta.get("compute_cpu_s", {})
    return (f"Base: RoPE, preset `{meta.get('preset')}`, {b['train'].get('steps')} steps at {b['context']} bytes "
            f"(`{b['run']}`, val loss {fmt(b['train'].get('val_loss'))}). Methods: {', '.join(meta['methods'])}; "
            f"factors set for {', '.join(f'{t}x' for t in meta['targets'])} the training length; fine-tunes: "
            f"{text['ft_steps']} steps at the target length, the base's tokens per step, peak lr {meta.get('ft_lr')}. "
            f"This invocation took {meta.get('wall_time_s', 0):.0f} s wall, {meta.get('cpu_time_s', 0):.0f} s CPU. "
            f"All runs and evaluations, reused ones included, took {ct.get('base_train_cpu_s', 0):.0f} s CPU to train "
            f"the base models, {ct.get('fine_tune_cpu_s', 0):.0f} s CPU to fine-tune and {ct.get('eval_cpu_s', 0):.0f} s "
            "CPU to evaluate.")


def page(results: dict, meta: dict, files: list[str]) -> Page:
    header, rows = summary(results)
    return Page("pedsl compare --study extension: RoPE scaling applied to a trained RoPE model", _intro(results, meta),
                [Table("Summary", header, rows), Bullets("Against the published picture", findings(results)),
                 *[Note(f"Note: {n}") for n in meta.get("notes") or []], *tables(results, meta), images(files)],
                meta, html_title="pedsl extension study")


__all__: list[Any] = ["findings", "page", "plots", "ratio", "summary", "tables"]
