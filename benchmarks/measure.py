"""Timing and memory measurement for the benchmark runner.

A *variant* is ``Variant(name, run, leaves)``: ``run()`` returns the attention output
``(B, H, L, D)``; the runner times ``run()`` alone (forward) or ``run()`` followed by
``torch.autograd.backward(out, grad_out)`` (forward + backward). Gradients of the
leaves (q, k, v, learned parameters) are cleared between calls, outside the timer.

Interleaving: in every repeat each variant of a group runs once, in a rotated order
(repeat r starts at variant r mod n), so load from other processes on a shared machine
hits every variant alike. Warm-up rounds are not recorded. The clock is wall time
(``perf_counter``) or, with one torch thread on a shared machine, the process CPU time
(``process_time``): a single-threaded process is charged only for its own work, so time
stolen by other processes does not enter the measurement (with several threads it would
count OpenMP spin-waits, so wall time is used there). Besides the median time,
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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def call(v: Variant, backward: bool, grad_out: Tensor | None, clock: str = "wall") -> tuple[float, float]:
    """One timed call: (forward seconds, forward + backward seconds) of the chosen clock.

    With ``backward`` the forward runs with autograd recording (as in training) and the
    backward follows at once; otherwise the forward runs under ``no_grad`` and both numbers
    are the forward time.
    """
    now = CLOCKS[clock]
    _clear(v.leaves)
    if backward:
        t0 = now()
        out = v.run()
        t1 = now()
        torch.autograd.backward(out, grad_out if grad_out is not None else torch.ones_like(out))
        t2 = now()
    else:
        with torch.no_grad():
            t0 = now()
            v.run()
            t1 = t2 = now()
    _clear(v.leaves)
    return t1 - t0, t2 - t0


def interleaved(variants: Sequence[Variant], *, repeats: int, warmup: int = 1, backward: bool = True,
                grad_out: Tensor | None = None, floor: str = "floor", clock: str = "wall",
                on_round: Callable[[int], None] | None = None) -> dict[str, dict]:
    """Times every variant ``repeats`` times, round-robin; returns per-variant stats.

    Each entry has ``fwd`` and ``total`` (forward + backward; equal to fwd without
    ``backward``), each with ``times`` (s), ``median`` (s) and ``ratio`` (median over repeats
    of the time divided by the floor's time in the same repeat; None without a floor).
    """
    names = [v.name for v in variants]
    times: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "total": []} for n in names}
    n = len(variants)
    for r in range(warmup + repeats):
        order = [variants[(i + r) % n] for i in range(n)]
        for v in order:
            tf, tt = call(v, backward, grad_out, clock)
            if r >= warmup:
                times[v.name]["fwd"].append(tf)
                times[v.name]["total"].append(tt)
        gc.collect()
        if on_round is not None:
            on_round(r)
    out: dict[str, dict] = {}
    for name in names:
        out[name] = {}
        for key in ("fwd", "total"):
            ts = times[name][key]
            ratio = None
            if floor in times:
                ratio = statistics.median(t / f for t, f in zip(ts, times[floor][key]))
            out[name][key] = {"times": ts, "median": statistics.median(ts), "ratio": ratio}
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

    call(v, backward, grad_out)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call(v, backward, grad_out)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
