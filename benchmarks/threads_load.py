"""Threads under load: each kernel's ratio to the no-PE floor at 1 and at 2 torch threads while a spinning child
process keeps one core busy (the "other core busy" of a shared or loaded machine), one row per kernel.

    python -m benchmarks.threads_load [KERNEL...] [--length 2048] [--repeats 3] [--no-spin] [--md FILE] [--json FILE]

Kernels (B=1, H=8, D=64, float32, forward + backward, gradients to q, k, v and the learned parameters):
``band`` (rope_local: the C++ sliding-window kernel, window 512), ``bias`` (alibi: the C++ causal kernel with
the bias in its rows), ``mlp`` (fire: the C++ MLP-bias kernel), ``path`` (path: PaTH's C++ scan rows), and the
torch paths ``flash-window`` (rope_local with ``PEDSL_CPU_KERNELS`` off: the flash kernel's banded calls) and
``rope`` (rotations, then SDPA). All run interleaved in one process: each repeat sets 1 thread, runs the floor
(``F.scaled_dot_product_attention(is_causal=True)``) and every kernel, then 2 threads and the same, the first
variant rotating; one warm-up repeat dropped. Wall clock (several threads: CPU time would count OpenMP's
spinning). The ratio of a kernel at a thread count is the median over repeats of its time / the floor's at that
count in that repeat; ``2 threads / 1 thread`` is the target's figure (<= 1.5). The spinning process is a
Python busy loop started before the first repeat and ended after the last (``--no-spin``: none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, call
from pedsl.compiler import compile_scheme
from pedsl.fsio import atomic_write_text

B, H, D, D_MODEL = 1, 8, 64, 128
#: kernel: (scheme, its parameters, whether pedsl's C++ kernels run)
KERNELS = {"band": ("rope_local", {}, True), "bias": ("alibi", {}, True), "mlp": ("fire", {}, True),
           "path": ("path", {}, True), "flash-window": ("rope_local", {}, False), "rope": ("rope", {}, True)}
SPIN = "while True:\n    pass\n"


def _variant(kernel: str, L: int) -> Variant:
    scheme, params, cpp = KERNELS[kernel]
    torch.manual_seed(0)
    mod = compile_scheme(scheme, params=params, num_heads=H, head_dim=D, d_model=D_MODEL)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    kw = {"x": torch.randn(B, L, D_MODEL, generator=g)} if mod.needs_x else {}
    if cpp:
        return Variant(kernel, lambda: mod(q, k, v, **kw), [q, k, v, *mod.parameters()])
    from pedsl.ops.window_kernels import banded_attention  # the flash path the band kernel falls back to

    window = mod.plan.window

    def flash():
        return banded_attention(q, k, v, window, None)

    return Variant(kernel, flash, [q, k, v])


def measure(kernels: list[str], L: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    variants = [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v])]
    variants += [_variant(name, L) for name in kernels]
    times = {(t, v.name): [] for t in (1, 2) for v in variants}
    for r in range(1 + repeats):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            order = [variants[(i + r) % len(variants)] for i in range(len(variants))]
            for var in order:
                _, total = call(var, True, None, "wall")
                if r:
                    times[(threads, var.name)].append(total)
    ratio = {(t, n): statistics.median(a / f for a, f in zip(ts, times[(t, "floor")]))
             for (t, n), ts in times.items()}
    return {"L": L, "ms": {f"{n}@{t}": 1000 * statistics.median(ts) for (t, n), ts in times.items()},
            "ratio": {f"{n}@{t}": r for (t, n), r in ratio.items()}, "kernels": kernels}


def table(res: dict) -> str:
    out = ["| kernel | L | 1 thread ms | 2 threads ms | / floor, 1 thread | / floor, 2 threads | "
           "**2 threads / 1 thread** |", "|---|---|---|---|---|---|---|"]
    m, r = res["ms"], res["ratio"]
    for n in ["floor", *res["kernels"]]:
        out.append(f"| {n} | {res['L']} | {m[n + '@1']:.0f} | {m[n + '@2']:.0f} | {r[n + '@1']:.2f} | "
                   f"{r[n + '@2']:.2f} | **{r[n + '@2'] / r[n + '@1']:.2f}** |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", default=list(KERNELS))
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-spin", action="store_true", help="no spinning process (the quiet-machine figures)")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    torch.set_flush_denormal(True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python -m benchmarks.threads_load", *(sys.argv[1:] if argv is None else argv)]),
            "torch": torch.__version__, "cores": os.cpu_count(), "spin": not a.no_spin,
            "loadavg_start": os.getloadavg()}
    spinner = None if a.no_spin else subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        res = measure(a.kernels, a.length, a.repeats)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    meta["loadavg_end"] = os.getloadavg()
    busy = "one spinning process (a Python busy loop) kept a core busy" if spinner else "no spinning process"
    text = (f"{meta['date']}, torch {meta['torch']}, {meta['cores']} cores, {busy}, wall clock, {a.repeats} repeats, "
            f"load average at start / end: {meta['loadavg_start'][0]:.1f} / {meta['loadavg_end'][0]:.1f}\n\n"
            + table(res))
    print(text)
    if a.md:
        atomic_write_text(a.md, text)
    if a.json:
        atomic_write_text(a.json, json.dumps({"meta": meta, "result": res}, indent=1))


if __name__ == "__main__":
    main()
