"""``pedsl compare --seeds 0,1,2`` and ``pedsl compare --study NAME``: studies over several seeds.

Every scheme is trained once per seed (``DIR/runs/<scheme>/seed<k>``), evaluated and analyzed
like ``pedsl compare`` does; the report gives every number as mean [min, max] over the seeds
(:mod:`pedsl.study.seeds`), every curve with its min-max band, flags differences from RoPE
within the spread as not significant, and draws a loss curve per run.

Studies (:func:`study_settings`):

- ``None`` (the default study with ``--seeds``): the default schemes on the text corpus,
  perplexity at 1x..32x, the instruments up to 1024 (:mod:`pedsl.study.compare.run`);
- ``"retrieval"`` (:mod:`pedsl.study.retrieval`): the default schemes plus fox and path_fox
  trained on the retrieval tasks plus copy rows (the study's recipe: ``recipe.MIXTURE`` and
  ``recipe.TRAIN``), accuracy vs length (1x..16x) and needle depth;
- ``"bias"`` (:mod:`pedsl.study.bias`): the distance-bias schemes on the text corpus, seeds 0, 1, 2
  unless given, perplexity at 1x..32x and the claims table (FIRE, KERPLE vs T5, ALiBi).
- ``"layers"`` (:mod:`pedsl.study.layers`): full, windowed, Gemma-3-style and Llama-4-style layer maps
  with and without learned sinks, 6 layers, 3 seeds, on text plus the retrieval tasks: perplexity to
  32x, retrieval to 16x, far, first-token and learned-sink attention mass.

Finished runs, eval.json, retrieval.json and analysis.json are reused when their settings match,
so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pedsl.errors import UsageError
from pedsl.study import driver
from pedsl.study import seeds as sd
from pedsl.study.common import provenance, write_json, write_text
from pedsl.study.bias import recipe as bias_study
from pedsl.study.compare import run as default_study
from pedsl.study.layers import recipe as layers_study
from pedsl.study.page import html_page, markdown
from pedsl.study.retrieval import recipe as retrieval_study
from pedsl.study.seeded import report as rep
from pedsl.study.seeded.plots import plots as seeded_plots
from pedsl.train.recipe import load_scheme

PARTS = ("train", "eval", "retrieval", "analysis")


def study_settings(study: str | None, *, quick: bool, windows: int | None, analyze_max: int | None,
                   lengths: list[int] | None = None) -> dict:
    """Schemes, data, training settings (under ``--steps`` and ``--set``), default seeds (``seeds``; one
    seed, 0, where absent), the study's own scheme files by name (``own``) and :class:`Measures` of a study."""
    if study == "bias":
        return {"schemes": bias_study.SCHEMES, "data": None, "seeds": bias_study.SEEDS, "own": bias_study.OWN,
                "train": dict(bias_study.TRAIN),
                "measures": bias_study.measures(quick=quick, windows=windows, analyze_max=analyze_max,
                                                lengths=lengths)}
    if study == "retrieval":
        return {"schemes": retrieval_study.SCHEMES, "data": retrieval_study.MIXTURE,
                "train": dict(retrieval_study.TRAIN),
                "measures": retrieval_study.measures(quick=quick, windows=windows, analyze_max=analyze_max,
                                                     lengths=lengths)}
    if study == "layers":
        return {"schemes": layers_study.SCHEMES, "data": layers_study.MIXTURE, "train": dict(layers_study.TRAIN),
                "seeds": layers_study.SEEDS, "own": layers_study.OWN,
                "measures": layers_study.measures(quick=quick, windows=windows, analyze_max=analyze_max,
                                                  lengths=lengths)}
    if study is not None:
        raise UsageError(f"unknown study '{study}'", hint="studies: retrieval, bias, layers")
    return {"schemes": default_study.DEFAULT_SCHEMES, "data": None, "train": {},
            "measures": default_study.measures(quick=quick, windows=windows, analyze_max=analyze_max,
                                               lengths=lengths)}


def study_items(st: dict, schemes: list[str]) -> list[str]:
    """SCHEMES as given, a name of one of the study's own files meaning that file."""
    own = st.get("own") or {}
    return [own.get(s, s) for s in schemes]


def run_seeded(study: str | None, schemes: list[str], out: str | Path, *, seeds: list[int] | None = None,
               preset: str = "tiny", steps: int | None = None, data: str | None = None,
               lengths: list[int] | None = None, windows: int | None = None, quick: bool = False,
               analyze_max: int | None = None, sets: dict | None = None, command: str | None = None,
               quiet: bool = False, say: Callable[[str], None] = lambda m: None, report: bool = True,
               started: float | None = None) -> dict:
    """The whole study; returns ``{"results", "meta", "files", "per_seed", "summary"}`` (only
    ``per_seed`` with ``report=False``: the runs of a parallel study, whose report the parent writes).
    ``started``: the perf_counter time the study began, when its runs went to workers first."""
    t0, c0 = started or time.perf_counter(), time.process_time()
    out = driver.study_dir(out)
    st = study_settings(study, quick=quick, windows=windows, analyze_max=analyze_max, lengths=lengths)
    m = st["measures"]
    items = driver.resolve_schemes(study_items(st, schemes), st["schemes"])
    seed_list = list(seeds or st.get("seeds") or [0])
    if quick and steps is None:
        steps = default_study.QUICK["steps"]
    data = data or st["data"]
    eta = driver.progress_bar(m, len(items) * len(seed_list), say, "study")
    per_seed: dict[str, dict[int, dict]] = {name: {} for name, _ in items}
    context = None
    for seed in seed_list:
        for name, path in items:
            run = out / "runs" / name / f"seed{seed}"
            say(f"{name}, seed {seed}")
            overrides = {**st["train"], **driver.given(sets, preset=preset, steps=steps, seed=seed,
                                                       data=data)}  # the study's, then yours
            r = driver.train_and_measure(name, path, run, overrides, m, label=f"{name} seed {seed}", eta=eta,
                                         say=say, quiet=quiet)
            cfg = r.pop("config")
            context = context or cfg.context
            per_seed[name][seed] = {**r, "run_dir": str(run.relative_to(out)), "scheme_file": str(path)}
    if not report:
        return {"per_seed": per_seed}
    results = {name: aggregate_runs(runs) for name, runs in per_seed.items()}
    first = next(iter(next(iter(per_seed.values())).values()))
    meta = {"study": study or "default", "command": command or "pedsl compare", **provenance(),
            "preset": cfg.preset, "steps": first["train"].get("steps"), "seeds": seed_list,
            "data": cfg.data.source, "context": context, "depths": (m.retrieval or {}).get("depths"),
            "samples": (m.retrieval or {}).get("samples"), "wall_time_s": time.perf_counter() - t0,
            "cpu_time_s": time.process_time() - c0,
            "schemes": {name: describe(path, cfg.model.n_layers) for name, path in items},
            "compute_time_s": sum((r[k] or {}).get("wall_time_s") or 0 for runs in per_seed.values()
                                  for r in runs.values() for k in PARTS)}
    say("writing the report")
    plots = seeded_plots(results, per_seed, out, meta)
    write_json(out / "results.json", {"meta": meta, "results": results})
    page = rep.page(results, meta, plots)
    write_text(out / "report.md", markdown(page))
    write_text(out / "report.html", html_page(page))
    files = ["report.md", "report.html", "results.json"] + [f for v in plots.values() for f in v]
    summary = [(t.title, t.header, t.rows) for t in rep.study_tables(results, meta)]
    return {"results": results, "meta": meta, "files": files, "per_seed": per_seed, "summary": summary}


def aggregate_runs(runs: dict[int, dict]) -> dict:
    """One scheme's runs over seeds -> ``{"seeds", "runs", "mean": {part: tree}, "spread": {part: tree}}``."""
    out: dict[str, Any] = {"seeds": sorted(runs), "runs": {str(s): r["run_dir"] for s, r in runs.items()},
                           "mean": {}, "spread": {}}
    for part in PARTS:
        m, s = sd.aggregate([r.get(part) for r in runs.values()])
        if part == "analysis" and m:  # the per-layer detail stays in each run's analysis.json
            m = {k: v for k, v in m.items() if k != "layers"}
            s = {k: v for k, v in (s or {}).items() if k != "layers"}
        out["mean"][part], out["spread"][part] = m, s
    return out


def describe(path: Path, n_layers: int) -> str:
    """A scheme's description line and, for a ``layers`` scheme, the part of each of the model's layers."""
    scheme = load_scheme(path)
    if scheme.layers is None:
        return scheme.doc
    parts, runs, start = scheme.layers.assign(n_layers), [], 0
    for i in range(1, n_layers + 1):  # runs of one part: "0-4 local, 5 global"
        if i == n_layers or parts[i] != parts[start]:
            runs.append(f"{start}{'' if i - 1 == start else f'-{i - 1}'} {parts[start]}")
            start = i
    return f"{scheme.doc} (layers {', '.join(runs)})"
