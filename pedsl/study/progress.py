"""An overall progress line with an estimate of the time left (compare, eval, analyze).

Work is counted in weighted units (a training run, one evaluation length weighted by its
length ...). After each finished unit :meth:`Eta.done` prints ``"<label> 40% (what) - 3 min
elapsed, about 4 min left"``: the time left is the time per unit of weight measured since the
first unit finished (so start-up costs - loading, compiling, the first tables - do not inflate
it) times the weight still to do, per kind of unit when the work has kinds (training,
evaluation ...); no estimate before the second unit. Units that cost nothing (a reused run) are removed from the total
with :meth:`Eta.skip`, so they do not make the estimate optimistic.
"""

from __future__ import annotations

import time
from typing import Callable


STUDY_WEIGHTS = {"train": 6.0, "eval": 1.0, "retrieval": 2.0, "analysis": 0.5}  # rough relative costs in a study


def duration(seconds: float) -> str:
    """``"45 s"``, ``"3 min"``, ``"1 h 05 min"``."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def length_cost(L: int) -> float:
    """Rough relative cost of scoring a fixed number of windows of length ``L``: the linear
    layers grow with L, attention with L^2 (equal at 2048 tokens for the tiny preset)."""
    return L * (1.0 + L / 2048)


class Eta:
    """``total``: the work's weight, or a dict of weights per kind of unit (``{"train": 18, "eval": 3}``).

    With kinds, each kind's time per unit of weight is measured on its own units, so a misjudged
    weight (training runs that cost 15 times their evaluations, not 6) does not skew the estimate
    of the rest; a kind not measured yet borrows the rate of the kinds that are."""

    def __init__(self, total: float | dict[str, float], say: Callable[[str], None], label: str = "progress",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.todo = {k: float(v) for k, v in total.items()} if isinstance(total, dict) else {"": float(total)}
        self.total = sum(self.todo.values())
        self.say, self.label, self.clock = say, label, clock
        self.t0 = self.last = clock()
        self.finished = 0.0
        self.skipped = 0.0
        self.first: tuple[str, float, float] | None = None  # (kind, seconds, weight) of the first unit
        self.measured: dict[str, list[float]] = {}  # kind -> [seconds, weight] of the units after the first

    def skip(self, weight: float, kind: str = "") -> None:
        """A unit that took no time (reused): drop it from the work to do."""
        self.total -= weight
        self.skipped += weight
        self.todo[kind] = self.todo.get(kind, 0.0) - weight

    def left(self) -> float | None:
        """Seconds still to go, or None before the second unit."""
        if self.first is None or not any(w > 0 for _, w in self.measured.values()):
            return None
        secs = sum(s for s, _ in self.measured.values())
        weight = sum(w for _, w in self.measured.values())
        out = 0.0
        for kind, w in self.todo.items():
            if w <= 0:
                continue
            s_k, w_k = self.measured.get(kind, (0.0, 0.0))
            if w_k > 0:
                rate = s_k / w_k
            elif kind == self.first[0] and self.first[2] > 0:  # only the first unit (start-up and all) measured it
                rate = self.first[1] / self.first[2]
            else:
                rate = secs / weight
            out += w * rate
        return out

    def line(self, what: str = "") -> str:
        frac = self.finished / self.total if self.total > 0 else 1.0
        left = self.left()
        return (f"{self.label} {100 * min(frac, 1.0):.0f}%" + (f" ({what})" if what else "")
                + f" - {duration(self.clock() - self.t0)} elapsed"
                + (f", about {duration(left)} left" if left is not None and frac < 1 else ""))

    def done(self, weight: float, what: str = "", kind: str = "") -> None:
        now = self.clock()
        took, self.last = now - self.last, now
        self.finished += weight
        self.todo[kind] = self.todo.get(kind, 0.0) - weight
        if self.first is None:  # it carries the start-up (loading, compiling): kept apart
            self.first = (kind, took, weight)
        else:
            acc = self.measured.setdefault(kind, [0.0, 0.0])
            acc[0] += took
            acc[1] += weight
        self.say(self.line(what))
