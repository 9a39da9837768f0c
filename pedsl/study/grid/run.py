"""``pedsl compare --study grid``: train at 16 x 16, evaluate at 16 ... 64 a side, over seeds.

**Schemes** (:data:`CANDIDATES`, when no SCHEMES are given): raster-order 1-D RoPE (``rope``, the
grid read as one sequence), axial 2-D RoPE (``rope_2d``), RoPE-Mixed (``rope_mixed``), M-RoPE-style
contiguous sections over (h, w) (the study's own scheme, in ``pedsl/study/grid/schemes/``) and a 2-D
distance bias (``alibi_2d``: ALiBi's slopes over |dh| + |dw|). The list is data: a candidate this pedsl cannot load (a library
scheme it does not have, a construct its language lacks) is left out with the reason, which the
report and the progress messages state, and joins the study once it loads.

Layout (``DIR``)::

    DIR/runs/<scheme>/seed<k>/    each run (train.yaml, checkpoints, metrics.jsonl, grid.json)
    DIR/report.md, report.html, results.json, *.png, *.svg

A finished run and its grid.json are reused when their settings match, so an interrupted study
continues; ``--jobs`` trains the runs in worker processes first (:mod:`pedsl.study.parallel`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pedsl.config import TrainConfig
from pedsl.data.grids import GRID_TASKS, grid_shape
from pedsl.errors import UsageError
from pedsl.study import driver
from pedsl.study import seeds as sd
from pedsl.study.candidates import Candidate, pick, publish, train_cpu_s, train_picked
from pedsl.study.common import provenance, read_json, write_json
from pedsl.study.grid import measure as gm
from pedsl.study.grid.report import page, plots

HERE = Path(__file__).resolve().parent


CANDIDATES = (
    Candidate("rope", "rope", "raster-order 1-D RoPE"),
    Candidate("rope_2d", "rope_2d", "axial 2-D RoPE"),
    Candidate("rope_mixed", "rope_mixed", "RoPE-Mixed (learned mixed frequencies)"),
    Candidate("mrope_hw", str(HERE / "schemes" / "mrope_hw.pe"), "M-RoPE-style sections over (h, w)"),
    Candidate("alibi_2d", "alibi_2d", "2-D distance bias (ALiBi over |dh| + |dw|)"),
)
SIZES = (16, 24, 32, 48, 64)
TRAIN_SIZE = 16
SEEDS = (0, 1, 2)
WINDOWS = 8
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "steps": 150, "sizes": (16, 24, 32), "windows": 2}
TRAIN = {"data": "grid_image", "context": TRAIN_SIZE * TRAIN_SIZE}
STUDY_KEYS = ("sizes",)  # --set keys of the study itself
EVAL_SEED = 4321         # the same evaluation grids for every scheme and seed


def study_schemes(schemes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The scheme items to run and the candidates left out (:func:`pedsl.study.candidates.pick`)."""
    return pick(schemes, CANDIDATES)


def parse_sizes(value: Any) -> list[int]:
    """``--set sizes=16,32`` (or a YAML list) -> sorted distinct grid sides."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    try:
        out = sorted({int(x) for x in items})
    except (TypeError, ValueError):
        raise UsageError(f"--set sizes={value}: grid sides are whole numbers", hint="e.g. --set sizes=16,32,64") from None
    if not out or out[0] < 2 or out[-1] > 256:
        raise UsageError(f"--set sizes={value}: grid sides go from 2 to 256", hint="e.g. --set sizes=16,32,64")
    return out


def settings(*, data: str | None, quick: bool, windows: int | None, sets: dict | None) -> dict:
    """The study's training overrides (the study's, then --data and --set) and its measures."""
    sets = dict(sets or {})
    if "seed" in sets:
        raise UsageError(f"--set seed={sets['seed']}: --study grid trains every seed of --seeds (default "
                         f"{','.join(map(str, SEEDS))})", hint="drop --set seed; give --seeds 3 (or --seed 3) instead")
    sizes = parse_sizes(sets.pop("sizes")) if "sizes" in sets else list(QUICK["sizes"] if quick else SIZES)
    if data is not None and data not in GRID_TASKS:
        raise UsageError(f"--study grid trains on a grid task, not '{data}'",
                         hint=f"--data takes one of: {', '.join(GRID_TASKS)}")
    train = {**TRAIN, **driver.given(data=data), **sets}
    return {"train": train, "sizes": sizes, "windows": windows or (QUICK["windows"] if quick else WINDOWS)}


def run_grid(schemes: list[str], out: str | Path, *, seeds: list[int] | None = None, preset: str = "tiny",
             steps: int | None = None, data: str | None = None, windows: int | None = None, quick: bool = False,
             sets: dict | None = None, command: str | None = None, quiet: bool = False,
             say: Callable[[str], None] = lambda m: None, report: bool = True, started: float | None = None) -> dict:
    """The whole study; returns ``{"results", "meta", "files", "per_seed", "skipped"}`` (only
    ``per_seed`` with ``report=False``: a parallel study's runs, whose report the parent writes)."""
    t0, c0 = started or time.perf_counter(), time.process_time()
    st = settings(data=data, quick=quick, windows=windows, sets=sets)  # bad settings: before any folder is made
    out = driver.study_dir(out)
    seed_list = list(seeds or SEEDS)
    if quick and steps is None:
        steps = QUICK["steps"]
    per_seed, skipped = train_picked(schemes, CANDIDATES, out, seed_list, st["train"], key="grid", preset=preset,
                                     steps=steps, measured=lambda run, done: _measured(run, done, st, say), say=say,
                                     quiet=quiet)
    if not report:
        return {"per_seed": per_seed}
    first = next(iter(next(iter(per_seed.values())).values()))
    return _write(out, per_seed, skipped, st, seed_list, command, say, t0, c0, first)


def _measured(run: Path, done: dict, st: dict, say: Callable[[str], None]) -> dict:
    """RUN/grid.json, reused when it was measured on these weights with these settings."""
    cfg = TrainConfig.from_yaml(run / "config.yaml")
    side = grid_shape(cfg.context, cfg.data.grid_width)[1]
    map_sizes = sorted({side, max(st["sizes"])})
    old = read_json(run / "grid.json")
    key = {"version": gm.VERSION, "sizes": st["sizes"], "windows": st["windows"], "seed": EVAL_SEED,
           "map_sizes": map_sizes}
    if driver.reusable(old, done, **key):
        say(f"{run.name}: reusing grid.json")
        return old
    say(f"measuring at sides {st['sizes']}")
    res = gm.measure_grid(run, sizes=st["sizes"], windows=st["windows"], seed=EVAL_SEED, map_sizes=map_sizes, say=say)
    res.update({"step": done.get("steps"), "scheme_hash": done.get("scheme_hash"), "settings": key})
    write_json(run / "grid.json", res)
    return res


def _write(out: Path, per_seed: dict, skipped: dict, st: dict, seed_list: list[int], command: str | None,
           say: Callable[[str], None], t0: float, c0: float, first: dict) -> dict:
    """Aggregate over seeds, draw, write results.json and the report."""
    results = {name: aggregate(runs) for name, runs in per_seed.items()}
    cfg = TrainConfig.from_yaml(out / first["run_dir"] / "config.yaml")
    titles = {c.name: c.title for c in CANDIDATES}
    meta = {"study": "grid", "command": command or "pedsl compare --study grid", **provenance(),
            "preset": cfg.preset, "steps": cfg.steps, "task": cfg.data.source, "context": cfg.context,
            "train_side": grid_shape(cfg.context, cfg.data.grid_width)[1], "sizes": st["sizes"],
            "windows": st["windows"], "seeds": seed_list, "skipped": skipped,
            "titles": {n: titles.get(n, n) for n in results}, "wall_time_s": time.perf_counter() - t0,
            "cpu_time_s": time.process_time() - c0,
            "train_cpu_s": train_cpu_s(per_seed)}
    say("writing the report")
    files = plots(results, per_seed, out, meta)
    return {"results": results, "meta": meta, "per_seed": per_seed, "skipped": skipped,
            "files": publish(out, results, meta, files, page(results, meta, files))}


def aggregate(runs: dict[int, dict]) -> dict:
    """One scheme's runs over seeds -> ``{"seeds", "runs", "mean", "spread"}`` of the per-size numbers."""
    m, s = sd.aggregate([r["grid"]["sizes"] for r in runs.values()])
    return {"seeds": sorted(runs), "runs": {str(k): r["run_dir"] for k, r in runs.items()}, "mean": m, "spread": s}
