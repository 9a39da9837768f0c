"""``pedsl compare --study frequency``: train RoPE over widths x seeds, measure, fit, plot, report
(see :mod:`pedsl.study.frequency`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pedsl.errors import ConfigError, UsageError
from pedsl.lang.library import library_dir
from pedsl.study import driver
from pedsl.study.common import git_commit, read_json, versions, write_json, write_text
from pedsl.study.frequency.fit import fit_law
from pedsl.study.frequency.measure import PROBE_SAMPLES, measure_run
from pedsl.study.frequency.plot import plot_law
from pedsl.study.frequency.report import report

WIDTHS = (8, 16, 32, 64)  # W: the block length (topic), the lag (lag), B - 1 (blocks)
SEEDS = (0, 1, 2)
# One small model for every width: 1 layer, 2 heads of 32 channels (16 rotary pairs), context 128
# (two blocks of the longest width). Measured here: a lag of 32 is learned in 600 steps at context
# 256, a lag of 128 is not (loss still ln 26 after 600 steps); so widths stop at 64.
DEFAULTS: dict[str, Any] = {"n_layers": 1, "d_model": 64, "n_heads": 2, "head_dim": 32, "context": 128,
                            "steps": 500, "batch_size": 16, "lr": 3e-3, "min_lr": 3e-4, "warmup": 30,
                            "eval_every": 100, "checkpoint_every": 500}
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "widths": (8, 32, 64), "seeds": (0,), "steps": 300}
STUDY_KEYS = ("task", "widths", "seeds", "probe_samples")  # --set keys of the study itself
# --set keys the study decides for each run itself (its DEFAULTS also cover every field of a preset)
RUN_KEYS = ("data", "source", "data.source", "block_len", "data.block_len", "seed", "preset")
MEASURE_VERSION = 2  # bump when measure_run changes: the study then re-measures (not retrains) its runs


@dataclass(frozen=True)
class Plan:
    """What the study runs: the task, widths x seeds, the probe samples and every run's settings."""

    task: str
    widths: tuple[int, ...]
    seeds: tuple[int, ...]
    samples: int
    overrides: dict[str, Any]

    def runs(self) -> list[tuple[int, int]]:
        """(width, seed) of every run, in the study's order."""
        return [(B, s) for B in self.widths for s in self.seeds]


def plan_study(*, steps: int | None = None, quick: bool = False, sets: dict | None = None) -> Plan:
    """The study's runs and settings from the command's options (errors for bad --set values)."""
    sets = dict(sets or {})
    widths = tuple(int(b) for b in listish(sets.pop("widths", QUICK["widths"] if quick else WIDTHS)))
    seeds = tuple(int(s) for s in listish(sets.pop("seeds", QUICK["seeds"] if quick else SEEDS)))
    samples = int(sets.pop("probe_samples", PROBE_SAMPLES))
    task = str(sets.pop("task", "topic"))
    if task not in ("lag", "blocks", "topic"):
        raise ConfigError(f"unknown frequency-study task '{task}'", hint="--set task=topic (default), lag or blocks")
    if not widths or min(widths) < 3 or not seeds:
        raise ConfigError("--set widths= needs block lengths >= 3 and --set seeds= at least one seed")
    if set(sets) & set(RUN_KEYS) or ("context" in sets and int(sets["context"]) < 2 * max(widths)):
        bad = ", ".join(k for k in sets if k in RUN_KEYS) or f"context={sets['context']}"
        raise UsageError(f"--set {bad}: the frequency study sets the task, its width, the seed, the model and a "
                         f"context of at least two blocks ({2 * max(widths)} here) for each run itself",
                         hint="choose them with --set task=, widths=, seeds= (or --seeds) and a longer context")
    overrides = {**DEFAULTS, **({"steps": QUICK["steps"]} if quick else {}), **sets}
    if steps is not None:
        overrides["steps"] = steps
    overrides["context"] = max(int(overrides["context"]), 2 * max(widths))  # one context for every width
    return Plan(task, widths, seeds, samples, overrides)


def run_one(out: Path, plan: Plan, B: int, s: int, *, say: Callable[[str], None], quiet: bool,
            prefix: str = "") -> dict:
    """Train (or reuse) the run of width ``B`` and seed ``s`` and measure it (or reuse its
    frequency.json when it measured this very run)."""
    task, samples = plan.task, plan.samples
    name = f"{task}{B}_s{s}"
    run = out / "runs" / name
    Wd = B - 1 if task == "blocks" else B
    say(f"{prefix}{name}: RoPE on the {task} task, W = {Wd}")
    done = driver.train_scheme(name, library_dir() / "rope.pe", run,
                               {**plan.overrides, "data": task, "block_len": B, "seed": s}, say, quiet)
    m = read_json(run / "frequency.json")
    if not (m and m.get("step") == done.get("steps") and m.get("samples") == samples
            and m.get("scheme_hash") == done.get("scheme_hash") and m.get("task") == task
            and m.get("version") == MEASURE_VERSION):
        m = {**measure_run(run, B, task, samples=samples), "step": done.get("steps"), "samples": samples,
             "scheme_hash": done.get("scheme_hash"), "seed": s, "val_loss": done.get("val_loss"),
             "version": MEASURE_VERSION}
        write_json(run / "frequency.json", m)
    say(f"  theta = {math.exp(m['log_freq']):.4g} (period {2 * math.pi / math.exp(m['log_freq']):.1f}; "
        f"pi / W = {math.pi / Wd:.4g}), all-channel {math.exp(m['all_channel_log_freq']):.4g}, "
        f"copy accuracy {m['copy_accuracy']:.2f}")
    return m


def run_frequency_study(out: str | Path, *, steps: int | None = None, quick: bool = False,
                        sets: dict | None = None, command: str | None = None, quiet: bool = True,
                        say: Callable[[str], None] = lambda m: None) -> dict:
    """Train RoPE over widths x seeds, measure, fit, plot and write the report."""
    t0 = time.perf_counter()
    plan = plan_study(steps=steps, quick=quick, sets=sets)
    task, widths, seeds, overrides = plan.task, plan.widths, plan.seeds, plan.overrides
    out = Path(out)
    runs = []
    for n, (B, s) in enumerate(plan.runs(), 1):
        runs.append(run_one(out, plan, B, s, say=say, quiet=quiet, prefix=f"[{n}/{len(plan.runs())}] "))
    W = np.array([r["W"] for r in runs], float)
    fit = fit_law(W, np.exp([r["log_freq"] for r in runs]))
    fit_all = fit_law(W, np.exp([r["all_channel_log_freq"] for r in runs]))
    fit_peak = fit_law(W, np.exp([r["peak_log_freq"] for r in runs]))
    learned = [r for r in runs if r["copy_accuracy"] >= 0.5]
    fit_learned = None
    if len(learned) >= 3 and len({r["W"] for r in learned}) >= 2:
        fit_learned = fit_law(np.array([r["W"] for r in learned], float), np.exp([r["log_freq"] for r in learned]))
    meta = {"command": command or "pedsl compare --study frequency", "git": git_commit(), **versions(),
            "task": task, "widths": list(widths), "seeds": list(seeds), "training": dict(overrides),
            "wall_time_s": time.perf_counter() - t0}
    result: dict[str, Any] = {"meta": meta, "runs": runs, "fit": fit, "fit_all_channel": fit_all, "fit_peak": fit_peak,
              "fit_learned": fit_learned}
    files = plot_law(runs, fit, out) + ["frequency.json", "frequency.md"]
    write_json(out / "frequency.json", result)
    write_text(out / "frequency.md", report(result))
    result["files"] = files
    return result


def listish(v) -> list:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        return [x for x in v.replace(",", " ").split() if x]
    return [v]
