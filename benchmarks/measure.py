"""Timing and memory measurement for the benchmark runner.

A *variant* is ``Variant(name, run, leaves)``: ``run()`` returns the attention output
``(B, H, L, D)``; the runner times ``run()`` alone (forward) or ``run()`` followed by
``torch.autograd.backward(out, grad_out)`` (forward + backward). Gradients of the
leaves (q, k, v, learned parameters) are cleared between calls, outside the timer.

Interleaving: in every repeat each variant of a group runs once, in a rotated order
(repeat r starts at variant r mod n), so load from other processes on a shared machine
hits every variant alike. Warm-up rounds are not recorded. Besides the median time,
the runner keeps the median of the per-repeat ratios to the floor measured in the same
repeat (robust to slow drifts of the machine's load).

Memory: ``peak_extra_bytes`` runs the variant once under ``torch.profiler`` with
``profile_memory=True`` and replays the allocator events (sign-carrying byte counts,
in time order) to get the peak of bytes allocated during the call on top of what was
live before it (inputs, parameters, cached tables are not counted). torch's CPU
allocations are invisible to ``tracemalloc`` and RSS deltas are blurred by the C
allocator, so this is the measurement used.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor


@dataclass
class Variant:
    name: str
    run: Callable[[], Tensor]
    leaves: Sequence[Tensor] = field(default_factory=list)
    kind: str = ""  # floor | hand | pedsl | pedsl-compiled | ...


def _clear(leaves: Sequence[Tensor]) -> None:
    for t in leaves:
        t.grad = None


def call(v: Variant, backward: bool, grad_out: Tensor | None) -> float:
    """One timed call (seconds)."""
    _clear(v.leaves)
    if backward:
        t0 = time.perf_counter()
        out = v.run()
        torch.autograd.backward(out, grad_out if grad_out is not None else torch.ones_like(out))
        t = time.perf_counter() - t0
    else:
        with torch.no_grad():
            t0 = time.perf_counter()
            v.run()
            t = time.perf_counter() - t0
    _clear(v.leaves)
    return t


def interleaved(variants: Sequence[Variant], *, repeats: int, warmup: int = 1, backward: bool = True,
                grad_out: Tensor | None = None, floor: str = "floor",
                on_round: Callable[[int], None] | None = None) -> dict[str, dict]:
    """Times every variant ``repeats`` times, round-robin; returns per-variant stats.

    Each entry: ``times`` (s), ``median`` (s), ``ratio`` (median over repeats of the time
    divided by the floor's time in the same repeat; None when no floor is in the group).
    """
    names = [v.name for v in variants]
    times: dict[str, list[float]] = {n: [] for n in names}
    n = len(variants)
    for r in range(warmup + repeats):
        order = [variants[(i + r) % n] for i in range(n)]
        for v in order:
            t = call(v, backward, grad_out)
            if r >= warmup:
                times[v.name].append(t)
        gc.collect()
        if on_round is not None:
            on_round(r)
    out = {}
    for name in names:
        ts = times[name]
        ratio = None
        if floor in times and times[floor]:
            ratio = statistics.median(t / f for t, f in zip(ts, times[floor]))
        out[name] = {"times": ts, "median": statistics.median(ts), "ratio": ratio}
    return out


def peak_extra_bytes(v: Variant, backward: bool, grad_out: Tensor | None = None) -> int:
    """Peak bytes allocated during one call above what was live before it (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    _clear(v.leaves)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if backward:
            out = v.run()
            torch.autograd.backward(out, grad_out if grad_out is not None else torch.ones_like(out))
            del out
        else:
            with torch.no_grad():
                out = v.run()
                del out
    _clear(v.leaves)
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort()
    cur = peak = 0
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return int(peak)


def profile_table(v: Variant, backward: bool, grad_out: Tensor | None = None, row_limit: int = 12) -> str:
    """torch.profiler key_averages table (self CPU time) of one call, for the README's notes."""
    from torch.profiler import ProfilerActivity, profile

    call(v, backward, grad_out)  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call(v, backward, grad_out)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
