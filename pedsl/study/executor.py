"""Running a study's independent runs side by side (``--jobs N``): local worker processes.

A study hands :func:`run_units` its runs as :class:`Unit` s: a module-level function and its keyword
arguments that trains (and measures) one run folder, writing every result next to the run. Each unit
runs in a fresh spawned process (no state shared with the others or with the parent) with its share
of the CPU threads; :func:`run_units` returns when all are done. The study then walks its runs as it
does serially, reuses each of them (finished run, eval.json, analysis.json ...) and writes its report
once, so the numbers are those of a serial study (bit for bit with ``--threads`` pinned: same thread
count per run, same seeds).

A worker that dies (killed, out of memory) is started once more: its run resumes from its last
checkpoint (the run lock of a dead process is taken over). A unit that fails with a pedsl error is
not retried; the other units still finish, then the study stops with one error naming the failed runs.
Started again, a study continues where it stopped: finished runs and measurements are reused.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as _queue
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from pedsl.errors import PedslError, TrainError
from pedsl.study.progress import duration
from pedsl.train import live
from pedsl.torchenv import auto_threads

Say = Callable[[str], None]
AUTO = "auto"


@dataclass(frozen=True)
class Unit:
    """One run of a study: ``fn(**kwargs, say=...)`` trains (or reuses, or resumes) and measures it.
    ``fn`` must be importable by name (a module-level function) for the worker process to find it."""

    label: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def plan(jobs: int | str, threads: int, units: int) -> tuple[int, int]:
    """(worker processes, torch threads per run) for ``jobs`` (a count or ``"auto"``: the idle cores)
    and ``threads`` (0: the idle cores split over the workers; pinned: that many per run)."""
    workers = auto_threads() if jobs == AUTO else int(jobs)
    workers = max(1, min(workers, units))
    return workers, threads or auto_threads(workers)


class StudyProgress:
    """The study's one progress line: runs done, running and left, elapsed time and an estimate of
    the time left (the mean wall time of the finished runs, times the runs left, over the workers)."""

    def __init__(self, total: int, workers: int, say: Say, label: str = "study",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.workers, self.say, self.label, self.clock = total, workers, say, label, clock
        self.t0 = clock()
        self.started: dict[str, float] = {}
        self.took: list[float] = []
        self.failed = 0

    def start(self, label: str) -> None:
        self.started[label] = self.clock()
        self.say(self.line(f"started {label}"))

    def finish(self, label: str, ok: bool = True) -> None:
        t = self.started.pop(label, self.clock())
        if ok:
            self.took.append(self.clock() - t)
        else:
            self.failed += 1
        self.say(self.line(f"{'finished' if ok else 'failed'} {label}"))

    def requeue(self, label: str) -> None:
        self.started.pop(label, None)

    def left(self) -> float | None:
        """Seconds still to go, or None before the first run finished."""
        if not self.took:
            return None
        mean = sum(self.took) / len(self.took)
        now = self.clock()
        work = sum(max(0.0, mean - (now - t)) for t in self.started.values())
        work += mean * (self.total - len(self.took) - self.failed - len(self.started))
        return work / self.workers

    def line(self, what: str) -> str:
        done, running = len(self.took), len(self.started)
        left = self.total - done - running - self.failed
        est = self.left()
        return (f"{self.label}: {done}/{self.total} runs done, {running} running, {left} left"
                + (f", {self.failed} failed" if self.failed else "") + f" ({what})"
                + f" - {duration(self.clock() - self.t0)} elapsed"
                + (f", about {duration(est)} left" if est is not None and done + self.failed < self.total else ""))


def run_units(units: list[Unit], *, jobs: int, threads: int, say: Say, label: str = "study",
              retries: int = 1, poll: float = 0.2) -> None:
    """Run every unit in its own spawned process, ``jobs`` at a time, ``threads`` torch threads each;
    return when all are done. Raises TrainError naming the runs that failed (after the others finished)."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    pending = deque(range(len(units)))
    running: dict[int, Any] = {}
    attempts = [0] * len(units)
    errors: dict[int, str] = {}
    view = StudyProgress(len(units), jobs, say, label)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i = pending.popleft()
                attempts[i] += 1
                p = ctx.Process(target=_work, args=(units[i].fn, units[i].kwargs, threads, i, messages, live.current()),
                                name=f"pedsl-{units[i].label}")
                p.start()
                running[i] = p
                view.start(units[i].label)
            _relay(messages, units, errors, say, timeout=poll)
            for i, p in list(running.items()):
                if p.exitcode is None:
                    continue
                p.join()
                del running[i]
                _relay(messages, units, errors, say, timeout=0)
                if p.exitcode == 0 and i not in errors:
                    view.finish(units[i].label)
                elif i not in errors and attempts[i] <= retries:
                    say(f"[{units[i].label}] the worker died ({_how(p.exitcode)}); starting it again: "
                        f"the run resumes from its last checkpoint")
                    view.requeue(units[i].label)
                    pending.appendleft(i)
                else:
                    errors.setdefault(i, f"the worker died ({_how(p.exitcode)})")
                    view.finish(units[i].label, ok=False)
    finally:
        for p in running.values():  # interrupted (Ctrl-C, an error here): no orphan keeps training
            p.terminate()
            p.join()
    if errors:
        raise failure(units, errors)


def _how(exitcode: int | None) -> str:
    return f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit status {exitcode}"


def failure(units: list[Unit], errors: dict[int, str]) -> TrainError:
    texts = sorted(set(errors.values()))
    if len(texts) == 1 and len(errors) > 1:
        what = f"{len(errors)} of {len(units)} runs failed: {texts[0]}"
    else:
        what = f"{len(errors)} of {len(units)} runs failed: " + "; ".join(
            f"{units[i].label}: {e}" for i, e in sorted(errors.items()))
    return TrainError(what, hint="fix the cause and run the same command again: finished runs are reused, "
                                 "interrupted ones resume from their last checkpoint")


def _relay(messages, units: list[Unit], errors: dict[int, str], say: Say, timeout: float) -> None:
    """Print the workers' messages (prefixed with their run) and note their errors."""
    while True:
        try:
            kind, i, text = messages.get(timeout=timeout) if timeout else messages.get_nowait()
        except _queue.Empty:
            return
        timeout = 0
        if kind == "say":
            say(f"[{units[i].label}] {text}")
        else:
            errors[i] = text


def _work(fn: Callable[..., Any], kwargs: dict[str, Any], threads: int, index: int, messages,
          tracking: live.Spec | None = None) -> None:
    """A local worker process: run the unit, send its messages and its failure (if any) to the parent."""
    try:
        err = call(fn, kwargs, threads, lambda msg: messages.put(("say", index, msg)), tracking)
        if err is not None:
            messages.put(("error", index, err))
    finally:
        messages.close()
        messages.join_thread()


def call(fn: Callable[..., Any], kwargs: dict[str, Any], threads: int, say: Say,
         tracking: live.Spec | None = None) -> str | None:
    """Run one unit in this (worker) process with ``threads`` torch threads, its runs reporting live
    to ``tracking`` (the study's tracker, if any); its failure as one line, None when it succeeded. A
    killed process returns nothing: the executor sees it die."""
    from pedsl.torchenv import setup_torch

    try:
        live.use(tracking)
        setup_torch(threads)
        fn(**kwargs, say=say)
    except PedslError as err:
        return str(err) + (f" ({err.hint})" if err.hint else "")
    except Exception as err:  # a bug: the message and where, never a silent success
        where = traceback.extract_tb(err.__traceback__)[-1]
        return f"internal error {type(err).__name__}: {err} ({where.filename}:{where.lineno})"
    return None


__all__ = ["AUTO", "StudyProgress", "Unit", "call", "failure", "plan", "run_units"]
