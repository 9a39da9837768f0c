"""The study's plots (matplotlib, Agg backend), each written as PNG and SVG.

- ``ppl_ratio``: perplexity ratio ppl(L) / ppl(L_train) vs evaluation length (log-log), training
  length marked, ratio 1 marked.
- ``far_mass``: far attention mass beyond W vs length, training length marked.
- ``freq_energy``: frequency energy per rotary pair vs the pair's angular frequency (log x).
- ``decoherence``: mean +/- spread of raw scores vs distance at the longest analysis length.
- ``retrieval``: passkey digit accuracy and block accuracy vs length, chance marked, and the loss on
  the answer bytes.

Every function takes the per-scheme results ``{scheme: {"eval": ..., "analysis": ...}}`` and an
output stem; returns the file names written (relative), or [] when there is nothing to plot.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

from pedsl.fsio import atomic_write_bytes

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401

MARKERS = "osD^vP*Xh<>"


def _save(fig, out_dir: Path, stem: str) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        name = f"{stem}.{ext}"
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=130 if ext == "png" else None, bbox_inches="tight")
        atomic_write_bytes(out_dir / name, buf.getvalue())
        names.append(name)
    plt.close(fig)
    return names


def _mark_train(ax, L0: int) -> None:
    ax.axvline(L0, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"training length {L0}", xy=(L0, 1), xycoords=("data", "axes fraction"), xytext=(4, -14),
                textcoords="offset points", fontsize=8, color="dimgrey")


def _length_axis(ax, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(L) for L in lengths], rotation=0)
    ax.set_xlabel("evaluation length L (tokens, log scale)")
    ax.grid(True, which="major", alpha=0.3)


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
    top = max((line.get_ydata().max() for line in ax.get_lines()), default=1.0)
    logy = top > 3.0  # a log axis only when some scheme breaks down; small ratios read better linear
    if logy:
        ax.set_yscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.axhline(1.0, color="black", linewidth=0.8)
    _length_axis(ax, sorted(lengths))
    _mark_train(ax, context)
    ax.set_ylabel("perplexity ratio ppl(L) / ppl(L_train)" + (" (log scale)" if logy else ""))
    ax.set_title("Perplexity past the training length (last L_train bytes of each window scored)")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "ppl_ratio")


def far_mass(results: dict, out_dir: Path, context: int) -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths: set[int] = set()
    W = None
    for n, (name, r) in enumerate(results.items()):
        an = r.get("analysis") or {}
        fm = (an.get("summary") or {}).get("far_mass") or {}
        pts = sorted((int(k), v) for k, v in fm.items() if v is not None)
        if not pts:
            continue
        W = an.get("far_window", W)
        lengths |= {p[0] for p in pts}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[n % len(MARKERS)], label=name)
    if not lengths:
        plt.close(fig)
        return []
    _length_axis(ax, sorted(lengths))
    _mark_train(ax, context)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"far mass rho (attention beyond {W} tokens,\nmean over queries, layers, heads)")
    ax.set_title("Far attention mass vs length")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "far_mass")


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
    return _save(fig, out_dir, "freq_energy")


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
                _length_axis(ax, sorted(lengths))
                _mark_train(ax, context)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    if not any_:
        plt.close(fig)
        return []
    return _save(fig, out_dir, "retrieval")


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
    return _save(fig, out_dir, "decoherence")


def all_plots(results: dict, out_dir: Path, context: int) -> dict[str, list[str]]:
    out_dir = Path(out_dir)
    return {"ppl_ratio": ppl_ratio(results, out_dir, context), "far_mass": far_mass(results, out_dir, context),
            "freq_energy": freq_energy(results, out_dir), "decoherence": decoherence(results, out_dir),
            "retrieval": retrieval(results, out_dir, context), "loss_curves": _loss_curves(results, out_dir)}


def _loss_curves(results: dict, out_dir: Path) -> list[str]:
    from pedsl.evaluate.curves import loss_curves

    return loss_curves({name: {"run": out_dir / r["run_dir"]} for name, r in results.items() if r.get("run_dir")},
                       out_dir)
