"""The study's plots (matplotlib, Agg backend), each written as PNG and SVG.

- ``ppl_ratio``: perplexity ratio ppl(L) / ppl(L_train) vs evaluation length (log-log), training
  length marked, ratio 1 marked.
- ``far_mass``: far attention mass beyond W vs length, training length marked.
- ``freq_energy``: frequency energy per rotary pair vs the pair's angular frequency (log x).
- ``decoherence``: mean +/- spread of raw scores vs distance at the longest analysis length.
- ``retrieval``: passkey digit accuracy and block accuracy vs length, chance marked, and the loss on
  the answer bytes.
- ``loss_curves``: training and validation loss vs step, one panel per scheme, a line per run
  (:func:`loss_curves`, from each run's ``metrics.jsonl``; :func:`band_plot` draws a mean with its
  min-max band over seeds).

Every function takes the per-scheme results ``{scheme: {"eval": ..., "analysis": ...}}`` and an
output stem; returns the file names written (relative), or [] when there is nothing to plot.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

from pedsl.fsio import atomic_write_bytes, read_text
from pedsl.strictparse import load_json

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401

MARKERS = "osD^vP*Xh<>"


def save_figure(fig, out_dir: Path, stem: str) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        name = f"{stem}.{ext}"
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=130 if ext == "png" else None, bbox_inches="tight")
        atomic_write_bytes(out_dir / name, buf.getvalue())
        names.append(name)
    plt.close(fig)
    return names


def mark_train(ax, L0: int) -> None:
    ax.axvline(L0, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"training length {L0}", xy=(L0, 1), xycoords=("data", "axes fraction"), xytext=(4, -14),
                textcoords="offset points", fontsize=8, color="dimgrey")


def length_axis(ax, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(L) for L in lengths], rotation=0)
    ax.set_xlabel("evaluation length L (tokens, log scale)")
    ax.grid(True, which="major", alpha=0.3)


def place_legend(ax, size: int = 8) -> None:
    """The legend where it hides nothing: inside the axes for a few lines, beside them for many."""
    handles = ax.get_legend_handles_labels()[0]
    if len(handles) > 6:
        ax.legend(fontsize=size, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif handles:
        ax.legend(fontsize=size)


def ratio_axis(ax) -> None:
    """The y axis of a perplexity-ratio plot: a log axis (ticks as plain numbers) only when some line
    rises past 3x, where a scheme breaks down; smaller ratios read better on a linear axis."""
    top = max((line.get_ydata().max() for line in ax.get_lines()), default=1.0)
    logy = top > 3.0
    if logy:
        ax.set_yscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("perplexity ratio ppl(L) / ppl(L_train)" + (" (log scale)" if logy else ""))


def ppl_ratio(results: dict, out_dir: Path, context: int) -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths: set[int] = set()
    for n, (name, r) in enumerate(results.items()):
        ppl = (r.get("eval") or {}).get("ppl") or {}
        pts = sorted((int(k), v["ratio"]) for k, v in ppl.items() if v.get("ratio") is not None)
        if not pts:
            continue
        lengths |= {p[0] for p in pts}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[n % len(MARKERS)], label=name)
    if not lengths:
        plt.close(fig)
        return []
    ratio_axis(ax)
    length_axis(ax, sorted(lengths))
    mark_train(ax, context)
    ax.set_title("Perplexity past the training length (last L_train bytes of each window scored)")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "ppl_ratio")


def far_mass(results: dict, out_dir: Path, context: int) -> list[str]:
    """One run per scheme: its far mass at each analysed length."""
    series, W = {}, None
    for name, r in results.items():
        an = r.get("analysis") or {}
        fm = (an.get("summary") or {}).get("far_mass") or {}
        pts = sorted((int(k), {"mean": v, "n": 1}) for k, v in fm.items() if v is not None)
        if pts:
            series[name], W = pts, an.get("far_window", W)
    return far_mass_figure(series, W, context, out_dir, "Far attention mass vs length")


def far_mass_figure(series: Mapping[str, Sequence[tuple[int, Mapping]]], window: float | None, context: int,
                    out_dir: Path, title: str, legend_size: int = 8) -> list[str]:
    """Far attention mass vs length, a line per scheme; ``series[name]`` is ``[(L, {"mean", "min",
    "max", "n"}), ...]`` (:func:`band_plot`: a min-max band where there are several seeds)."""
    if not series:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (name, pts) in enumerate(series.items()):
        band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
    length_axis(ax, sorted({p[0] for pts in series.values() for p in pts}))
    mark_train(ax, context)
    ax.set_ylim(0, 1)
    w = "?" if window is None else f"{window:g}"
    ax.set_ylabel(f"far mass rho (attention beyond {w} tokens,\nmean over queries, layers, heads)")
    ax.set_title(title)
    place_legend(ax, legend_size)
    return save_figure(fig, out_dir, "far_mass")


def freq_energy(results: dict, out_dir: Path) -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    any_ = False
    for n, (name, r) in enumerate(results.items()):
        for fe in ((r.get("analysis") or {}).get("summary") or {}).get("frequency_energy", []):
            pts = sorted((w, e) for w, e in zip(fe["freqs"], fe["energy"]) if w > 0)
            if not pts:
                continue
            any_ = True
            label = name if fe["group"] in ("all", None) else f"{name} ({fe['group']})"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[n % len(MARKERS)], label=label)
    if not any_:
        plt.close(fig)
        return []
    ax.set_xscale("log")
    ax.set_xlabel("angular frequency w_k of the rotary pair (rad / token, log scale)")
    ax.set_ylabel("frequency energy E_k (fraction of the head's total)")
    ax.set_title("Frequency energy per rotary pair (mean over layers and heads)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "freq_energy")


def retrieval(results: dict, out_dir: Path, context: int) -> list[str]:
    """Top row: accuracy vs length (chance marked); bottom row: answer loss (nats per answer byte)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex="col")
    any_ = False
    tasks = (("passkey", "digit_accuracy", 0.1, "Passkey: answer digits right"),
             ("blocks", "accuracy", 1 / 26, "Blocks: block ends right"))
    for col, (task, key, chance, title) in enumerate(tasks):
        lengths: set[int] = set()
        for row, (field, ylabel) in enumerate(((key, "accuracy (fraction)"),
                                               ("answer_nll", "answer loss (nats per answer byte)"))):
            ax = axes[row][col]
            for n, (name, r) in enumerate(results.items()):
                d = (r.get("eval") or {}).get(task) or {}
                pts = sorted((int(k), v[field]) for k, v in d.items() if v.get(field) is not None)
                if not pts:
                    continue
                any_ = True
                lengths |= {p[0] for p in pts}
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[n % len(MARKERS)], label=name)
            if row == 0:
                ax.axhline(chance, color="red", linestyle=":", linewidth=1, label=f"chance ({chance:.2f})")
                ax.set_ylim(-0.02, 1.02)
                ax.set_title(title)
            ax.set_ylabel(ylabel)
            if lengths:
                length_axis(ax, sorted(lengths))
                mark_train(ax, context)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    if not any_:
        plt.close(fig)
        return []
    return save_figure(fig, out_dir, "retrieval")


def decoherence(results: dict, out_dir: Path) -> list[str]:
    """Mean and spread of raw scores vs distance at the longest analysis length (layer-, head-mean)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    any_ = False
    L = None
    for n, (name, r) in enumerate(results.items()):
        an = r.get("analysis") or {}
        if not an.get("lengths"):
            continue
        dec = [int(x) for layer in an.get("layers", []) for x in layer.get("decoherence", {})]
        if not dec:  # streamed lengths (past analyze.DENSE_MAX) have no decoherence
            continue
        L = str(max(dec))
        recs = [layer["decoherence"][L] for layer in an.get("layers", []) if L in layer.get("decoherence", {})]
        if not recs:
            continue
        bins = recs[0]["bins"]
        x = [max(0.5, (lo + hi) / 2) for lo, hi in bins]
        mean = [sum(sum(h[b] for h in rec["mean"]) / len(rec["mean"]) for rec in recs) / len(recs)
                for b in range(len(bins))]
        std = [sum(sum(h[b] for h in rec["std"]) / len(rec["std"]) for rec in recs) / len(recs)
               for b in range(len(bins))]
        line, = ax.plot(x, mean, marker=MARKERS[n % len(MARKERS)], label=name)
        ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.12)
        any_ = True
    if not any_:
        plt.close(fig)
        return []
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distance i - j (tokens, log scale; bin centres, 0 plotted at 0.5)")
    ax.set_ylabel("raw score <q_i, T(j->i) k_j> (mean, band: +/- 1 std)")
    ax.set_title(f"Score decoherence at L = {L} (mean over layers and heads)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "decoherence")


def all_plots(results: dict, out_dir: Path, context: int) -> dict[str, list[str]]:
    out_dir = Path(out_dir)
    return {"ppl_ratio": ppl_ratio(results, out_dir, context), "far_mass": far_mass(results, out_dir, context),
            "freq_energy": freq_energy(results, out_dir), "decoherence": decoherence(results, out_dir),
            "retrieval": retrieval(results, out_dir, context), "loss_curves": _loss_curves(results, out_dir)}


def _loss_curves(results: dict, out_dir: Path) -> list[str]:
    return loss_curves({name: {"run": out_dir / r["run_dir"]} for name, r in results.items() if r.get("run_dir")},
                       out_dir)


# ---------------------------------------------------------------------------------------------
# Shared by the seeded studies' report: bands over seeds, loss curves from metrics.jsonl


def band_plot(ax, x: Sequence[float], spreads: Sequence[Mapping], *, label: str, marker: str = "o") -> None:
    """The mean as a line with markers and, where there are several seeds, the min-max band."""
    mean = [s["mean"] for s in spreads]
    line, = ax.plot(x, mean, marker=marker, label=label, markersize=4)
    if any(s.get("n", 1) > 1 for s in spreads):
        ax.fill_between(x, [s["min"] for s in spreads], [s["max"] for s in spreads], color=line.get_color(),
                        alpha=0.15, linewidth=0)


MAX_METRICS_BYTES = 1 << 30  # a metrics.jsonl of a long run is a few MB


def read_metrics(run: Path) -> list[dict]:
    """The records of RUN/metrics.jsonl (half-written lines skipped); [] when absent."""
    try:
        lines = read_text(Path(run) / "metrics.jsonl", MAX_METRICS_BYTES).splitlines()  # never a FIFO
    except (OSError, ValueError):
        return []
    out = []
    for line in lines:
        try:
            out.append(load_json(line))
        except ValueError:
            continue
    return out


def loss_curves(runs: Mapping[str, Mapping[object, Path]], out_dir: Path, stem: str = "loss_curves") -> list[str]:
    """One panel per scheme: the training objective as logged (line; with ``data.answer_weight`` it
    includes the answer term, so it sits above the validation loss) and the validation loss
    (markers) vs step, one colour per run (seed). ``runs``: ``{scheme: {seed or label: run directory}}``."""
    data = {name: {k: read_metrics(p) for k, p in rs.items()} for name, rs in runs.items()}
    data = {name: {k: m for k, m in rs.items() if m} for name, rs in data.items()}
    data = {name: rs for name, rs in data.items() if rs}
    if not data:
        return []
    cols = min(4, len(data))
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False, sharey=True,
                             layout="constrained")  # titles clear of the row above's axis labels
    for ax, (name, rs) in zip(axes.flat, data.items()):
        for k, m in rs.items():
            lab = f"seed {k}" if isinstance(k, int) or str(k).isdigit() else str(k)
            line, = ax.plot([r["step"] for r in m], [r["loss"] for r in m], linewidth=1, label=f"{lab} train objective")
            val = [(r["step"], r["val_loss"]) for r in m if r.get("val_loss") is not None]
            if val:
                ax.plot([v[0] for v in val], [v[1] for v in val], "o--", color=line.get_color(), markersize=3,
                        linewidth=0.8, label=f"{lab} validation")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel("loss (nats/byte)", fontsize=8)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    return save_figure(fig, out_dir, stem)
