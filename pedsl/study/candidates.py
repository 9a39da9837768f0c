"""A study's default schemes as data: candidates that join the study once this pedsl loads them.

A study lists :class:`Candidate` records; :func:`pick` runs the SCHEMES a user named (a candidate's
name meaning its file) or, when none were named, the candidates that load, and says why each of the
others is left out (a library scheme this pedsl does not have yet, a construct its language lacks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pedsl.errors import PedslError, UsageError
from pedsl.lang.library import scheme_file
from pedsl.study import driver
from pedsl.study.common import write_json, write_text
from pedsl.study.page import Page, html_page, markdown
from pedsl.train.recipe import load_scheme


@dataclass(frozen=True)
class Candidate:
    """A scheme a study compares by default: its run name, library name or file, and what it is."""

    name: str
    source: str
    title: str


def available(c: Candidate) -> str | None:
    """None when this pedsl loads the candidate, else why not (one line)."""
    try:
        load_scheme(scheme_file(c.source))
    except PedslError as err:
        return err.diagnostics[0].message.splitlines()[0]
    return None


def pick(schemes: list[str], candidates: tuple[Candidate, ...]) -> tuple[list[str], dict[str, str]]:
    """The scheme items to run (``schemes`` as given, a candidate's name meaning its file; else the
    loadable candidates) and the candidates left out, ``{name: why}``."""
    if schemes:
        by_name = {c.name: c.source for c in candidates}
        return [by_name.get(s, s) for s in schemes], {}
    items, skipped = [], {}
    for c in candidates:
        why = available(c)
        if why is None:
            items.append(c.source)
        else:
            skipped[c.name] = why
    return items, skipped


def train_picked(schemes: list[str], candidates: tuple[Candidate, ...], out: Path, seeds: list[int], train: dict,
                 **kw) -> tuple[dict[str, dict[int, dict]], dict[str, str]]:
    """:func:`pick` the schemes (saying which candidates are left out and why), then :func:`train_each`
    them (``kw``: its keywords); returns the runs and the candidates left out."""
    names, skipped = pick(schemes, candidates)
    for name, why in skipped.items():
        kw["say"](f"{name}: left out ({why})")
    return train_each(names, out, seeds, train, **kw), skipped


def train_each(names: list[str], out: Path, seeds: list[int], train: dict, *, key: str,
               measured: Callable[[Path, dict], dict], preset: str, steps: int | None,
               say: Callable[[str], None], quiet: bool) -> dict[str, dict[int, dict]]:
    """Train (or reuse) every scheme at every seed in ``out/runs/<name>/seed<k>`` with the study's
    ``train`` settings, and measure each run: ``{name: {seed: {"train", key, "run_dir"}}}``."""
    if not names:
        raise UsageError("no scheme to train: every default candidate was left out",
                         hint="name the schemes to compare (pedsl compare --study ... SCHEMES)")
    items = driver.resolve_schemes(names)
    per_seed: dict[str, dict[int, dict]] = {name: {} for name, _ in items}
    for seed in seeds:
        for name, path in items:
            run = out / "runs" / name / f"seed{seed}"
            say(f"{name}, seed {seed}")
            overrides = {**train, **driver.given(preset=preset, steps=steps, seed=seed)}
            done = driver.train_scheme(name, path, run, overrides, say, quiet)
            per_seed[name][seed] = {"train": done, key: measured(run, done), "run_dir": str(run.relative_to(out))}
    return per_seed


def train_cpu_s(per_seed: dict[str, dict[int, dict]]) -> float:
    """The CPU seconds of every run's training (0 for a run without the figure)."""
    return sum((r["train"] or {}).get("cpu_time_s") or 0 for runs in per_seed.values() for r in runs.values())


def publish(out: Path, results: dict, meta: dict, files: dict[str, list[str]], p: Page) -> list[str]:
    """Write the study's results.json and its report page (Markdown and HTML); every file it made,
    the plots ``files`` included."""
    write_json(out / "results.json", {"meta": meta, "results": results})
    write_text(out / "report.md", markdown(p))
    write_text(out / "report.html", html_page(p))
    return ["report.md", "report.html", "results.json"] + [f for v in files.values() for f in v]
