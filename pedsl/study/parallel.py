"""The runs of a study as executor units (:mod:`pedsl.study.executor`), and the study run on them.

Each unit is the study itself restricted to one run (one scheme; one scheme and one seed) with its
report left out: it trains, evaluates and analyzes that run folder exactly as the whole study would.
:func:`prepare` runs them all in workers; the caller then runs the whole study, which reuses every
run and writes the report once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pedsl.study import compare as cmp
from pedsl.study import compare_seeds as seeded
from pedsl.study.executor import Unit, plan, run_units
from pedsl.torchenv import setup_torch

Say = Callable[[str], None]


def compare_units(schemes: list[str], out: str | Path, **settings: Any) -> list[Unit]:
    """One unit per scheme of ``pedsl compare`` (``settings``: run_compare's keyword arguments)."""
    items = list(schemes) or list(cmp.DEFAULT_SCHEMES)
    resolved = cmp.resolve_schemes(items)  # a misspelt or doubled scheme: one error here, not one per worker
    return [Unit(name, _compare_one, {"scheme": item, "out": str(out), **settings})
            for item, (name, _) in zip(items, resolved)]


def seeded_units(study: str | None, schemes: list[str], out: str | Path, *, seeds: list[int] | None,
                 **settings: Any) -> list[Unit]:
    """One unit per scheme and seed of a seeded study (``settings``: run_seeded's keyword arguments)."""
    st = seeded.study_settings(study, quick=settings.get("quick", False), windows=settings.get("windows"),
                               analyze_max=settings.get("analyze_max"))
    items = list(schemes) or list(st["schemes"])
    resolved = cmp.resolve_schemes(items)
    return [Unit(f"{name} seed {seed}", _seeded_one,
                 {"study": study, "scheme": item, "out": str(out), "seed": seed, **settings})
            for seed in (seeds or [0]) for item, (name, _) in zip(items, resolved)]


def prepare(units: list[Unit], out: str | Path, *, jobs: int | str, threads: int, say: Say, label: str) -> int:
    """Train and measure every unit in ``jobs`` workers (see :func:`pedsl.study.executor.plan`); sets
    this process's torch threads to the per-run count, so that what is left to do here (nothing, when
    every unit succeeded) runs alike. Returns the threads per run."""
    cmp.study_dir(out)  # refuse a folder that is not a study before starting any worker
    workers, per_run = plan(jobs, threads, len(units))
    say(f"{label}: {len(units)} runs on {workers} worker process(es), {per_run} torch thread(s) each")
    run_units(units, jobs=workers, threads=per_run, say=say, label=label)
    setup_torch(per_run)
    return per_run


def _compare_one(scheme: str, out: str, say: Say, **settings: Any) -> None:
    cmp.run_compare([scheme], out, report=False, say=say, **{**settings, "quiet": True})


def _seeded_one(study: str | None, scheme: str, out: str, seed: int, say: Say, **settings: Any) -> None:
    seeded.run_seeded(study, [scheme], out, seeds=[seed], report=False, say=say, **{**settings, "quiet": True})


__all__ = ["compare_units", "prepare", "seeded_units"]
