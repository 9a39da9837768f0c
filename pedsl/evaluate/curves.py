"""Curves shared by the studies' reports: a line with its min-max band over seeds, and the loss
curves of the training runs (from each run's ``metrics.jsonl``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from pedsl.evaluate.plots import _save, plt


def band_plot(ax, x: Sequence[float], spreads: Sequence[Mapping], *, label: str, marker: str = "o") -> None:
    """The mean as a line with markers and, where there are several seeds, the min-max band."""
    mean = [s["mean"] for s in spreads]
    line, = ax.plot(x, mean, marker=marker, label=label, markersize=4)
    if any(s.get("n", 1) > 1 for s in spreads):
        ax.fill_between(x, [s["min"] for s in spreads], [s["max"] for s in spreads], color=line.get_color(),
                        alpha=0.15, linewidth=0)


def read_metrics(run: Path) -> list[dict]:
    """The records of RUN/metrics.jsonl (half-written lines skipped); [] when absent."""
    try:
        lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def loss_curves(runs: Mapping[str, Mapping[object, Path]], out_dir: Path, stem: str = "loss_curves") -> list[str]:
    """One panel per scheme: training loss (line) and validation loss (markers) vs step, one
    colour per run (seed). ``runs``: ``{scheme: {seed or label: run directory}}``."""
    data = {name: {k: read_metrics(p) for k, p in rs.items()} for name, rs in runs.items()}
    data = {name: {k: m for k, m in rs.items() if m} for name, rs in data.items()}
    data = {name: rs for name, rs in data.items() if rs}
    if not data:
        return []
    cols = min(4, len(data))
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False, sharey=True)
    for ax, (name, rs) in zip(axes.flat, data.items()):
        for k, m in rs.items():
            lab = f"seed {k}" if isinstance(k, int) or str(k).isdigit() else str(k)
            line, = ax.plot([r["step"] for r in m], [r["loss"] for r in m], linewidth=1, label=f"{lab} train")
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
    return _save(fig, out_dir, stem)
