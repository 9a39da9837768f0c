"""An overall progress line with an estimate of the time left (compare, eval, analyze).

Work is counted in weighted units (a training run, one evaluation length weighted by its
length ...). After each finished unit :meth:`Eta.done` prints ``"<label> 40% (what) - 3 min
elapsed, about 4 min left"``: the time left is the time per unit of weight measured since the
first unit finished (so start-up costs - loading, compiling, the first tables - do not inflate
it) times the weight still to do; no estimate before the second unit. Units that cost nothing (a reused run) are removed from the total
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
    def __init__(self, total: float, say: Callable[[str], None], label: str = "progress",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.say, self.label, self.clock = float(total), say, label, clock
        self.t0 = clock()
        self.finished = 0.0
        self.skipped = 0.0
        self.first: tuple[float, float] | None = None  # (time, weight done) when the first unit finished

    def skip(self, weight: float) -> None:
        """A unit that took no time (reused): drop it from the work to do."""
        self.total -= weight
        self.skipped += weight

    def left(self) -> float | None:
        """Seconds still to go, or None before the second unit."""
        if self.first is None or self.finished <= self.first[1]:
            return None
        rate = (self.clock() - self.first[0]) / (self.finished - self.first[1])
        return rate * max(0.0, self.total - self.finished)

    def line(self, what: str = "") -> str:
        frac = self.finished / self.total if self.total > 0 else 1.0
        left = self.left()
        return (f"{self.label} {100 * min(frac, 1.0):.0f}%" + (f" ({what})" if what else "")
                + f" - {duration(self.clock() - self.t0)} elapsed"
                + (f", about {duration(left)} left" if left is not None and frac < 1 else ""))

    def done(self, weight: float, what: str = "") -> None:
        self.finished += weight
        if self.first is None:
            self.first = (self.clock(), self.finished)
        self.say(self.line(what))
