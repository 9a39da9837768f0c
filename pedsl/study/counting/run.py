"""``pedsl compare --study counting``: train on the counting tasks, evaluate with more and longer
segments, over seeds.

**Schemes** (:data:`CANDIDATES`, when no SCHEMES are given): RoPE, NoPE, ALiBi and CoPE. The list
is data: a candidate this pedsl cannot load (a library scheme it does not have yet) is left out
with the reason, which the report and the progress messages state, and joins the study once it
loads.

**Training**: every run on an even mixture of the tasks (:data:`TRAIN`; ``--data`` one task or
another mixture of them), the answers weighed in the loss (``data.answer_weight``).
**Evaluation** (``--set evals=1x1,4x1,2x2,4x4``): each condition ``RxS`` is rows ``R`` times the
training context with segments ``S`` times as long (:mod:`.measure`).

Layout (``DIR``)::

    DIR/runs/<scheme>/seed<k>/    each run (config.yaml, checkpoints, metrics.jsonl, counting.json)
    DIR/report.md, report.html, results.json, *.png, *.svg

A finished run and its counting.json are reused when their settings match, so an interrupted study
continues; ``--jobs`` trains the runs in worker processes first (:mod:`pedsl.study.parallel`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pedsl.config import TrainConfig
from pedsl.data import counting
from pedsl.data.stream import parse_mixture
from pedsl.errors import DataError, UsageError, did_you_mean
from pedsl.study import driver
from pedsl.study import seeds as sd
from pedsl.study.candidates import Candidate, pick, publish, train_cpu_s, train_picked
from pedsl.study.common import provenance, read_json, write_json
from pedsl.study.counting import measure as cm
from pedsl.study.counting.report import page, plots


CANDIDATES = (
    Candidate("rope", "rope", "RoPE (token-count positions)"),
    Candidate("nope", "nope", "no positional encoding"),
    Candidate("alibi", "alibi", "ALiBi (a recency bias in tokens)"),
    Candidate("cope", "cope", "CoPE (contextual positions: gated counts)"),
)
SEEDS = (0, 1, 2)
EVALS = ((1, 1), (4, 1), (2, 2), (4, 4))
WINDOWS = 16
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "steps": 150, "evals": ((1, 1), (2, 2)), "windows": 4}
TRAIN = {"data": ",".join(f"{t}:1" for t in counting.TASKS), "answer_weight": 1.0}
STUDY_KEYS = ("evals",)  # --set keys of the study itself
EVAL_SEED = 4321         # the same evaluation rows for every scheme and seed
MAX_ROWS = 64            # an evaluation row is at most this many training contexts


def study_schemes(schemes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The scheme items to run and the candidates left out (:func:`pedsl.study.candidates.pick`)."""
    return pick(schemes, CANDIDATES)


def parse_evals(value: Any) -> list[tuple[int, int]]:
    """``--set evals=1x1,4x1,2x2`` (or a YAML list) -> the conditions ``[(rows, stretch), ...]`` in
    the order given, each once; ``RxS``: rows R times the context, segments S times as long."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    hint = "e.g. --set evals=1x1,4x1,2x2,4x4 (RxS: rows R times the training context, segments S times as long)"
    out: list[tuple[int, int]] = []
    for item in items:
        parts = str(item).lower().split("x")
        try:
            rows, stretch = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"--set evals={value}: '{item}' is not RxS", hint=hint) from None
        if not (1 <= rows <= MAX_ROWS and 1 <= stretch <= rows):
            raise UsageError(f"--set evals={value}: in '{item}' the rows R go from 1 to {MAX_ROWS} and the "
                             "stretch S from 1 to R (longer segments need rows at least as long)", hint=hint)
        if (rows, stretch) not in out:
            out.append((rows, stretch))
    if not out:
        raise UsageError(f"--set evals={value}: no condition given", hint=hint)
    return out


def study_tasks(source: str) -> list[str]:
    """The counting tasks a run's data source trains on (one task or a mixture of them), else a
    usage error: the study scores counting answers only."""
    mix = parse_mixture(source)
    names = [source] if mix is None else [n for n, _ in mix]
    bad = [n for n in names if n not in counting.TASKS]
    if bad:
        near = did_you_mean(bad[0], counting.TASKS)
        raise UsageError(f"--study counting trains on the counting tasks, not '{bad[0]}'",
                         hint=(f"{near} " if near else "") + f"--data takes one of {', '.join(counting.TASKS)} or a "
                              f"mixture of them, e.g. {TRAIN['data']}")
    return [t for t in counting.TASKS if t in names]


def settings(*, data: str | None, quick: bool, windows: int | None, sets: dict | None) -> dict:
    """The study's training overrides (the study's, then --data and --set) and its measures."""
    sets = dict(sets or {})
    if "seed" in sets:
        raise UsageError(f"--set seed={sets['seed']}: --study counting trains every seed of --seeds (default "
                         f"{','.join(map(str, SEEDS))})", hint="drop --set seed; give --seeds 3 (or --seed 3) instead")
    evals = parse_evals(sets.pop("evals")) if "evals" in sets else list(QUICK["evals"] if quick else EVALS)
    train = {**TRAIN, **driver.given(data=data), **sets}
    tasks = study_tasks(str(train["data"]))
    return {"train": train, "tasks": tasks, "evals": evals,
            "windows": windows or (QUICK["windows"] if quick else WINDOWS)}


def run_counting(schemes: list[str], out: str | Path, *, seeds: list[int] | None = None, preset: str = "tiny",
                 steps: int | None = None, data: str | None = None, windows: int | None = None, quick: bool = False,
                 sets: dict | None = None, command: str | None = None, quiet: bool = False,
                 say: Callable[[str], None] = lambda m: None, report: bool = True,
                 started: float | None = None) -> dict:
    """The whole study; returns ``{"results", "meta", "files", "per_seed", "skipped"}`` (only
    ``per_seed`` with ``report=False``: a parallel study's runs, whose report the parent writes)."""
    t0, c0 = started or time.perf_counter(), time.process_time()
    st = settings(data=data, quick=quick, windows=windows, sets=sets)  # bad settings: before any folder is made
    out = driver.study_dir(out)
    seed_list = list(seeds or SEEDS)
    if quick and steps is None:
        steps = QUICK["steps"]
    per_seed, skipped = train_picked(schemes, CANDIDATES, out, seed_list, st["train"], key="counting", preset=preset,
                                     steps=steps, measured=lambda run, done: _measured(run, done, st, say), say=say,
                                     quiet=quiet)
    if not report:
        return {"per_seed": per_seed}
    return _write(out, per_seed, skipped, st, seed_list, command, say, t0, c0)


def _measured(run: Path, done: dict, st: dict, say: Callable[[str], None]) -> dict:
    """RUN/counting.json, reused when it was measured on these weights with these settings."""
    old = read_json(run / "counting.json")
    key = {"version": cm.VERSION, "tasks": st["tasks"], "evals": [list(e) for e in st["evals"]],
           "windows": st["windows"], "seed": EVAL_SEED}
    if driver.reusable(old, done, **key):
        say(f"{run.name}: reusing counting.json")
        return old
    say(f"measuring at {', '.join(cm.label(*e) for e in st['evals'])}")
    try:
        res = cm.measure_counting(run, tasks=st["tasks"], conditions=st["evals"], windows=st["windows"],
                                  seed=EVAL_SEED, say=say)
    except DataError as err:  # a condition too short for the stretch at this context
        raise UsageError(err.diagnostics[0].message, hint="choose --set evals with longer rows (R) for that "
                         "stretch, or a longer context") from None
    res.update({"step": done.get("steps"), "scheme_hash": done.get("scheme_hash"), "settings": key})
    write_json(run / "counting.json", res)
    return res


def _write(out: Path, per_seed: dict, skipped: dict, st: dict, seed_list: list[int], command: str | None,
           say: Callable[[str], None], t0: float, c0: float) -> dict:
    """Aggregate over seeds, draw, write results.json and the report."""
    results = {name: aggregate(runs) for name, runs in per_seed.items()}
    first = next(iter(next(iter(per_seed.values())).values()))
    cfg = TrainConfig.from_yaml(out / first["run_dir"] / "config.yaml")
    titles = {c.name: c.title for c in CANDIDATES}
    meta = {"study": "counting", "command": command or "pedsl compare --study counting", **provenance(),
            "preset": cfg.preset, "steps": cfg.steps, "data": cfg.data.source, "context": cfg.context,
            "back": cfg.data.count_back, "tasks": st["tasks"], "evals": [cm.label(*e) for e in st["evals"]],
            "windows": st["windows"], "seeds": seed_list, "skipped": skipped,
            "titles": {n: titles.get(n, n) for n in results}, "wall_time_s": time.perf_counter() - t0,
            "cpu_time_s": time.process_time() - c0,
            "train_cpu_s": train_cpu_s(per_seed)}
    say("writing the report")
    files = plots(results, per_seed, out, meta)
    return {"results": results, "meta": meta, "per_seed": per_seed, "skipped": skipped,
            "files": publish(out, results, meta, files, page(results, meta, files))}


def aggregate(runs: dict[int, dict]) -> dict:
    """One scheme's runs over seeds -> ``{"seeds", "runs", "mean", "spread"}`` of the per-task numbers."""
    m, s = sd.aggregate([r["counting"]["tasks"] for r in runs.values()])
    return {"seeds": sorted(runs), "runs": {str(k): r["run_dir"] for k, r in runs.items()}, "mean": m, "spread": s}
