"""Process-wide torch settings every command that runs a model shares: threads and denormals.

No torch at import time (``pedsl check`` and ``diff`` never pay for it).
"""

from __future__ import annotations

import os
import time

from pedsl.errors import UsageError
from pedsl.limits import MAX_THREADS


def auto_threads(processes: int = 1) -> int:
    """CPU threads per process: the cores not already busy, split over ``processes`` (torchrun
    ranks on one machine), at least 1. Busy is the 1-minute load average, capped by the tasks
    runnable right now (so work that just finished does not count).

    On a small shared CPU this matters more than anything else: measured on the 2-core machine
    with one other busy process, 2 torch threads trained the tiny model at ~1,200 tokens/s (the
    OpenMP threads wait on each other) and 1 thread at ~17,000 tokens/s; alone, 2 threads reach
    ~34,000 tokens/s.
    """
    cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (OSError, AttributeError):
        busy = 0.0
    others = others_running()
    if others is not None:  # the load average still counts work that just ended (pip, a finished run)
        busy = min(busy, others)
    idle = max(1, min(cpus, int(cpus - busy + 0.5)))
    return max(1, idle // max(1, processes))


def others_running(samples: int = 5, interval: float = 0.02) -> int | None:
    """Runnable tasks besides this one right now (Linux: the 4th field of /proc/loadavg), the most
    seen in a few samples ~0.1 s apart; None where the system does not say."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        seen.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(interval)
    return max(seen)


def setup_torch(threads: int = 0, *, processes: int = 1, flush_denormal: bool = True) -> int:
    """Flush denormals (docs/semantics.md §6: peaked softmax rows go denormal on CPU) and set the thread
    count (0: :func:`auto_threads`); returns the count torch now uses."""
    import torch  # on use: importing pedsl.torchenv does not load torch

    if not 0 <= threads <= MAX_THREADS:  # thousands of threads crash or hang torch's pool
        raise UsageError(f"--threads {threads} is out of range (0 .. {MAX_THREADS}; 0: the idle cores)", code="E994")
    if flush_denormal:
        torch.set_flush_denormal(True)
    torch.set_num_threads(threads or auto_threads(processes))
    return torch.get_num_threads()
