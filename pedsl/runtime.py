"""Process-wide torch settings every command that runs a model shares: threads and denormals.

No torch at import time (``pedsl check`` and ``diff`` never pay for it).
"""

from __future__ import annotations

import os


def auto_threads(processes: int = 1) -> int:
    """CPU threads per process: the cores not already busy (1-minute load average), split over
    ``processes`` (torchrun ranks on one machine), at least 1.

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
    idle = max(1, min(cpus, int(cpus - busy + 0.5)))
    return max(1, idle // max(1, processes))


def setup_torch(threads: int = 0, *, processes: int = 1, flush_denormal: bool = True) -> int:
    """Flush denormals (SEMANTICS 6: peaked softmax rows go denormal on CPU) and set the thread
    count (0: :func:`auto_threads`); returns the count torch now uses."""
    import torch

    if flush_denormal:
        torch.set_flush_denormal(True)
    torch.set_num_threads(threads or auto_threads(processes))
    return torch.get_num_threads()
