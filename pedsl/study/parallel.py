"""The runs of a study as executor units (:mod:`pedsl.study.executor`), and the study run on them.

Each unit is the study itself restricted to one run (one scheme; one scheme and one seed; one width
and seed of the frequency study; one task and method of the extension study) with its report left
out: it trains, evaluates and analyzes that run folder exactly as the whole study would. The
extension study runs in two stages, since its swaps and fine-tunes start from its base models.
:func:`prepare` runs them all on the chosen :class:`Executor` (local workers, Ray, Slurm); the caller then runs the whole study, which reuses every
run and writes the report once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pedsl.study import cluster, driver
from pedsl.study.compare import run as cmp
from pedsl.study.counting import run as counting
from pedsl.study.extension import run as ext
from pedsl.study.frequency import run as freq
from pedsl.study.grid import run as grid
from pedsl.study.seeded import run as seeded
from pedsl.study.executor import AUTO, Unit, plan, run_units
from pedsl.torchenv import setup_torch

Say = Callable[[str], None]


def compare_units(schemes: list[str], out: str | Path, **settings: Any) -> list[Unit]:
    """One unit per scheme of ``pedsl compare`` (``settings``: run_compare's keyword arguments)."""
    items = list(schemes) or list(cmp.DEFAULT_SCHEMES)
    resolved = driver.resolve_schemes(items)  # a misspelt or doubled scheme: one error here, not one per worker
    return [Unit(name, _compare_one, {"scheme": item, "out": str(out), **settings})
            for item, (name, _) in zip(items, resolved)]


def seeded_units(study: str | None, schemes: list[str], out: str | Path, *, seeds: list[int] | None,
                 **settings: Any) -> list[Unit]:
    """One unit per scheme and seed of a seeded study (``settings``: run_seeded's keyword arguments)."""
    st = seeded.study_settings(study, quick=settings.get("quick", False), windows=settings.get("windows"),
                               analyze_max=settings.get("analyze_max"), lengths=settings.get("lengths"))
    items = seeded.study_items(st, list(schemes)) or list(st["schemes"])
    resolved = driver.resolve_schemes(items)
    return [Unit(f"{name} seed {seed}", _seeded_one,
                 {"study": study, "scheme": item, "out": str(out), "seed": seed, **settings})
            for seed in (seeds or st.get("seeds") or [0]) for item, (name, _) in zip(items, resolved)]


def frequency_units(out: str | Path, *, steps: int | None, quick: bool, sets: dict) -> list[Unit]:
    """One unit per width and seed of ``--study frequency`` (its settings checked here, once)."""
    plan = freq.plan_study(steps=steps, quick=quick, sets=sets)
    return [Unit(f"{plan.task}{B}_s{s}", _frequency_one,
                 {"out": str(out), "steps": steps, "quick": quick, "sets": sets, "width": B, "seed": s})
            for B, s in plan.runs()]


def extension_units(out: str | Path, *, methods: list[str] | None, seeds: list[int] | None,
                    seed: int | None = None, **settings: Any) -> tuple[list[Unit], list[Unit]]:
    """``--study extension`` in two stages of units: the base models (per task, and per seed with
    ``seeds``), then one unit per task and method (and seed): its zero-shot evaluations and
    fine-tunes at every target. ``settings``: run_extension's keyword arguments."""
    names = ext.study_methods(methods)
    where: list[tuple[int | None, str, dict[str, str]]] = ([(k, f" seed {k}", {"base_run": str(Path(out) / "runs" / "rope" / f"seed{k}"),
                                  "ext_dir": str(Path(out) / "extension" / f"seed{k}")}) for k in seeds]
             if seeds else [(seed, "", {})])
    bases, swaps = [], []
    for k, tag, paths in where:
        for task in ("text", "blocks"):
            common = {"out": str(out), "task": task, "seed": k, **paths, **settings}
            bases.append(Unit(f"{task} base{tag}", _extension_one, {**common, "methods": []}))
            swaps += [Unit(f"{task} {m}{tag}", _extension_one, {**common, "methods": [m]}) for m in names]
    return bases, swaps


def grid_units(schemes: list[str], out: str | Path, *, seeds: list[int] | None, **settings: Any) -> list[Unit]:
    """One unit per scheme and seed of ``--study grid`` (``settings``: run_grid's keyword arguments)."""
    items, _ = grid.study_schemes(list(schemes))  # the candidates this pedsl loads, when none are named
    resolved = driver.resolve_schemes(items)
    return [Unit(f"{name} seed {seed}", _grid_one, {"scheme": item, "out": str(out), "seed": seed, **settings})
            for seed in (seeds or grid.SEEDS) for item, (name, _) in zip(items, resolved)]


def counting_units(schemes: list[str], out: str | Path, *, seeds: list[int] | None, **settings: Any) -> list[Unit]:
    """One unit per scheme and seed of ``--study counting`` (``settings``: run_counting's keyword arguments)."""
    items, _ = counting.study_schemes(list(schemes))  # the candidates this pedsl loads, when none are named
    resolved = driver.resolve_schemes(items)
    return [Unit(f"{name} seed {seed}", _counting_one, {"scheme": item, "out": str(out), "seed": seed, **settings})
            for seed in (seeds or counting.SEEDS) for item, (name, _) in zip(items, resolved)]


@dataclass(frozen=True)
class Executor:
    """Where a study's runs go: ``local`` worker processes (``jobs`` of them: a count or ``"auto"``),
    ``ray`` tasks (``address``: an existing cluster, None: a local Ray) or ``slurm`` jobs (``cluster``:
    submitit's cluster, "local" for local processes). ``jobs`` caps the runs in flight on Ray and Slurm
    (None: no cap); ``threads`` is the torch threads per run (0: the idle cores split over the local
    workers; 1 on a cluster)."""

    kind: str = "local"
    jobs: int | str | None = None
    threads: int = 0
    address: str | None = None
    gpus: float = 0
    partition: str | None = None
    time_min: int | None = None
    cluster: str | None = None

    @property
    def serial(self) -> bool:
        """Whether the study simply runs in this process (the default)."""
        return self.kind == "local" and self.jobs in (None, 1)


def prepare(units: list[Unit], out: str | Path, executor: Executor, *, say: Say, label: str) -> int:
    """Train and measure every unit on ``executor``; sets this process's torch threads to the per-run
    count, so that what is left to do here (nothing, when every unit succeeded) runs alike. Returns
    the threads per run."""
    driver.study_dir(out)  # refuse a folder that is not a study before starting any worker
    cap = None if executor.jobs in (None, AUTO) else int(executor.jobs)
    if executor.kind == "ray":
        per_run = executor.threads or 1
        cluster.run_ray(units, threads=per_run, say=say, label=label, address=executor.address,
                        gpus=executor.gpus, jobs=cap)
    elif executor.kind == "slurm":
        per_run = executor.threads or 1
        cluster.run_slurm(units, threads=per_run, say=say, label=label, folder=Path(out) / "slurm",
                          partition=executor.partition, time_min=executor.time_min, gpus=int(executor.gpus),
                          jobs=cap, cluster=executor.cluster)
    else:
        workers, per_run = plan(executor.jobs or 1, executor.threads, len(units))
        say(f"{label}: {len(units)} runs on {workers} worker process(es), {per_run} torch thread(s) each")
        run_units(units, jobs=workers, threads=per_run, say=say, label=label)
    setup_torch(per_run)
    return per_run


def _frequency_one(out: str, steps: int | None, quick: bool, sets: dict, width: int, seed: int, say: Say) -> None:
    freq.run_one(Path(out), freq.plan_study(steps=steps, quick=quick, sets=sets), width, seed, say=say, quiet=True)


def _extension_one(out: str, say: Say, **settings: Any) -> None:
    ext.run_part(out, say=say, **{**settings, "quiet": True})


def _compare_one(scheme: str, out: str, say: Say, **settings: Any) -> None:
    cmp.run_compare([scheme], out, report=False, say=say, **{**settings, "quiet": True})


def _grid_one(scheme: str, out: str, seed: int, say: Say, **settings: Any) -> None:
    grid.run_grid([scheme], out, seeds=[seed], report=False, say=say, **{**settings, "quiet": True})


def _counting_one(scheme: str, out: str, seed: int, say: Say, **settings: Any) -> None:
    counting.run_counting([scheme], out, seeds=[seed], report=False, say=say, **{**settings, "quiet": True})


def _seeded_one(study: str | None, scheme: str, out: str, seed: int, say: Say, **settings: Any) -> None:
    seeded.run_seeded(study, [scheme], out, seeds=[seed], report=False, say=say, **{**settings, "quiet": True})


__all__ = ["Executor", "compare_units", "counting_units", "extension_units", "frequency_units", "grid_units", "prepare", "seeded_units"]
