"""``pedsl compare``: train, evaluate and analyze several schemes alike, then write the report.

Layout of the study directory::

    DIR/runs/<scheme>/      a training run (pedsl.train format) + eval.json + analysis.json
    DIR/results.json        every run's train/eval/analysis results and the study's metadata
    DIR/report.md, DIR/report.html, DIR/<plot>.png|svg

Every scheme is trained with the same preset, steps, seed and data (in this process, through
:func:`pedsl.train.train`). A run whose DONE.json exists and whose config matches is reused; a
run with checkpoints but no DONE.json is resumed; eval.json and analysis.json are reused when
their settings match (:mod:`pedsl.study.driver`). So rerunning the same command after an
interruption continues the study.

The default study (no schemes named): rope, rope_id, alibi, acc_random_qk, acc_random_qkv and
path from the scheme library, tiny preset, on the embedded corpus (the Python stdlib).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pedsl.study import driver
from pedsl.study.common import provenance, write_json, write_text
from pedsl.study.compare.report import page
from pedsl.study.measures import Measures
from pedsl.study.page import html_page, markdown
from pedsl.study.plots import all_plots

DEFAULT_SCHEMES = ("rope", "rope_id", "alibi", "acc_random_qk", "acc_random_qkv", "path")
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "steps": 150, "multipliers": (1, 2, 4, 8, 16), "windows": 2, "analyze_max": 512}
WINDOWS = 8  # windows (ppl) and samples (tasks) per length: 8 x L_train scored bytes per length
MULTIPLIERS = (1, 2, 4, 8, 16, 32)


def measures(*, quick: bool, windows: int | None, analyze_max: int | None,
             lengths: list[int] | None = None) -> Measures:
    """Perplexity, passkey and blocks at 1x..32x the training length (16x with --quick), the
    instruments up to 1024 tokens (512)."""
    return Measures(multipliers=QUICK["multipliers"] if quick else MULTIPLIERS,
                    windows=windows or (QUICK["windows"] if quick else WINDOWS), tasks=("ppl", "passkey", "blocks"),
                    analyze_max=analyze_max or (QUICK["analyze_max"] if quick else 1024),
                    lengths=tuple(lengths) if lengths else None)


def run_compare(schemes: list[str], out: str | Path, *, preset: str = "tiny", steps: int | None = None,
                seed: int | None = None, data: str | None = None, lengths: list[int] | None = None,
                windows: int | None = None, quick: bool = False, analyze_max: int | None = None,
                sets: dict | None = None, command: str | None = None, quiet: bool = False,
                say: Callable[[str], None] = lambda m: None, report: bool = True,
                started: float | None = None) -> dict:
    """The whole study; returns ``{"results": ..., "meta": ..., "files": [...]}`` (only ``results``
    with ``report=False``: the runs of a parallel study, whose report the parent writes).
    ``started``: the perf_counter time the study began, when its runs went to workers first."""
    t0, c0 = started or time.perf_counter(), time.process_time()
    out = driver.study_dir(out)
    items = driver.resolve_schemes(schemes, DEFAULT_SCHEMES)
    if quick and steps is None:
        steps = QUICK["steps"]
    overrides = driver.given(sets, preset=preset, steps=steps, seed=seed, data=data)
    m = measures(quick=quick, windows=windows, analyze_max=analyze_max, lengths=lengths)
    eta = driver.progress_bar(m, len(items), say, "compare")
    results: dict[str, dict[str, Any]] = {}
    configs = []
    for n, (name, path) in enumerate(items, 1):
        run = out / "runs" / name
        say(f"[{n}/{len(items)}] {name}")
        r = driver.train_and_measure(name, path, run, overrides, m, label=name, eta=eta, say=say, quiet=quiet)
        configs.append(r["config"])
        results[name] = {"train": r["train"], "eval": r["eval"], "analysis": r["analysis"],
                         "run_dir": str(run.relative_to(out)), "scheme_file": str(path)}
    if not report:
        return {"results": results}
    meta = {"command": command or "pedsl compare", **provenance(),
            **_settings(results, configs, preset, steps, seed, data), **_cost(results, t0, c0)}
    say("writing the report")
    plots = all_plots(results, out, meta["context"])
    write_json(out / "results.json", {"meta": meta, "results": results})
    p = page(results, meta, plots)
    write_text(out / "report.md", markdown(p))
    write_text(out / "report.html", html_page(p))
    files = ["report.md", "report.html", "results.json"] + [f for v in plots.values() for f in v]
    return {"results": results, "meta": meta, "files": files}


def _settings(results: dict, configs: list, preset: str, steps: int | None, seed: int | None,
              data: str | None) -> dict:
    """Preset, steps, seed, data and (shortest) training length of the study's runs, as trained."""
    first = configs[0] if configs else None
    return {"preset": first.preset if first else preset, "steps": first.steps if first else steps, "seed": first.seed if first else seed,
            "data": (results and next(iter(results.values()))["train"].get("data")) or (first.data.source if first else data),
            "context": min((c.context for c in configs), default=0)}


def _cost(results: dict, t0: float, c0: float) -> dict:
    """This invocation's wall and CPU time, and the compute of every run (reused ones included)."""
    return {"wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0,
            "compute_time_s": sum((r[k] or {}).get("wall_time_s") or 0 for r in results.values()
                                  for k in ("train", "eval", "analysis"))}
