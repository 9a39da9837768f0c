"""The frequency study's figure: theta per width, the fit, and theta = pi / W."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.ticker as mt
import numpy as np

from pedsl.study.plots import plt, save_figure


def plot_law(runs: list[dict], fit: dict, out: Path) -> list[str]:
    """Mean +- sd of theta per width (positional and all-channel), the fit, and theta = pi / W."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    Ws = sorted({r["W"] for r in runs})
    for key, label, col, mk in (("log_freq", "positional energy", "C0", "o"),
                                ("all_channel_log_freq", "all-channel energy", "C7", "s")):
        mean = [np.mean([r[key] for r in runs if r["W"] == w]) for w in Ws]
        sd = [np.std([r[key] for r in runs if r["W"] == w]) for w in Ws]
        y = np.exp(mean)
        ax.errorbar(Ws, y, yerr=[y - np.exp(np.subtract(mean, sd)), np.exp(np.add(mean, sd)) - y], fmt=mk,
                    color=col, capsize=3, label=f"{label} (mean +- sd over seeds)")
    bad = [r for r in runs if r["copy_accuracy"] < 0.5]
    if bad:
        ax.plot([r["W"] for r in bad], [math.exp(r["log_freq"]) for r in bad], "x", color="C3", ms=8,
                label="run that did not learn the copy (accuracy < 0.5)")
    x = np.array([min(Ws) * 0.8, max(Ws) * 1.25])
    ax.plot(x, math.exp(fit["intercept"]) * x ** fit["slope"], "-", color="C0",
            label=f"fit: slope {fit['slope']:.2f} +- {fit['slope_se']:.2f}")
    ax.plot(x, math.pi / x, "--", color="k", lw=1, label="theta = pi / W")
    ax.set(xscale="log", yscale="log", xlabel="dependency width W (tokens)",
           ylabel="energy-weighted log-mean frequency (rad/token)", title="RoPE frequency use vs dependency width")
    ax.xaxis.set_minor_formatter(mt.NullFormatter())
    ax.set_xticks(Ws)
    ax.set_xticklabels([str(int(w)) for w in Ws])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, "frequency")
