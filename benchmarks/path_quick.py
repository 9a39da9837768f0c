"""Quick CPU benchmark of PaTH attention (pedsl/ops/path.py), forward + backward.

Compares, at B=4, H=8, D=64, float32, causal:
  floor         torch SDPA causal (no positional transport at all)
  path[C]       path_attention, blockwise UT/WY scan, block size C
  materialized  path_attention_materialized (all L x L transported keys; skipped when the
                estimated memory exceeds --mat-gb)
  naive         path_attention_naive (float64 loops over explicit products), only at small L,
                extrapolated to larger L by the L^2 scaling of its loop count (D is fixed, so
                the L^2 D^2 cost scales as L^2)
Timings: median of --reps after a warm-up, wall and process CPU time (the CPU time ratio is
the robust one on a shared machine), methods interleaved round by round so that load
from other processes hits all of them alike. Also reports the bytes autograd saves for the
backward (unique storages, via saved_tensors_hooks).

Measured 2026-11-29 on the shared 2-core AMD EPYC (load ~9-13 from other jobs; 1 thread;
CPU-time ratios to the floor, wall in brackets), fwd+bwd:
    L=512:  path C=32 3.8x (3.0x), C=64 3.1x (3.1x), C=128 3.6x (3.8x); materialized 76x (71x),
            3.1 GiB saved for backward vs 72 MiB for path
    L=2048: path C=32 3.9x (3.9x), C=64 2.7x (2.0x), C=128 2.8x (2.1x); materialized skipped
            (~112 GB); naive extrapolated from L=64: ~4800 s cpu, ~1800x slower than path C=64
(before issue 13's two-level scan; the figures after it are in benchmarks/README.md, note 4:
L=2048 C=64 with superblocks of 4: 1.62x cpu, against 2.41x for that kernel in the same run)

    python benchmarks/path_quick.py                 # L = 512, 2048; C = 32, 64, 128
    python benchmarks/path_quick.py --lengths 512 --blocks 64 --threads 1
    # before / after a kernel change, interleaved in one process:
    git show e4c6fad:pedsl/ops/path.py > /tmp/path_before.py
    python benchmarks/path_quick.py --lengths 2048 --blocks 64 --superblocks 1 4 \
        --against /tmp/path_before.py --naive-lengths --reps 7
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F

from pedsl.ops.path import path_attention, path_attention_materialized, path_attention_naive

print = functools.partial(print, flush=True)  # noqa: A001 (show progress while it runs)


def make(B, H, L, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, H, L, generator=g))
    return [t.requires_grad_() for t in (q, k, v, w, beta)]


def step(fn, args):
    for a in args:
        a.grad = None
    out = fn(*args)
    out.backward(torch.ones_like(out))


def timed(fn, args):
    """(wall seconds, process CPU seconds); CPU time is robust to other processes' load."""
    t0, c0 = time.perf_counter(), time.process_time()
    step(fn, args)
    return time.perf_counter() - t0, time.process_time() - c0


def saved_bytes(fn, args):
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    del out
    return sum(seen.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--naive-lengths", type=int, nargs="*", default=[32, 64])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch default; 1: stable timings on a shared machine)")
    ap.add_argument("--mat-gb", type=float, default=8.0, help="skip materialized above this")
    ap.add_argument("--superblocks", type=int, nargs="+", default=[4],
                    help="blocks per superblock of the scan (1: one level)")
    ap.add_argument("--against", default=None, metavar="FILE",
                    help="also time path_attention from this file (e.g. an older pedsl/ops/path.py)")
    a = ap.parse_args()
    torch.set_flush_denormal(True)  # the benchmark owns this process-wide choice (docs/semantics.md §6)
    if a.threads:
        torch.set_num_threads(a.threads)
    B, H, D = 4, 8, 64
    print(f"B={B} H={H} D={D} float32 fwd+bwd, threads={torch.get_num_threads()}, "
          f"median of {a.reps}")

    naive_t = {}
    for L in a.naive_lengths:
        args = make(B, H, L, D)
        step(path_attention_naive, args)
        ts = [timed(path_attention_naive, args) for _ in range(a.reps)]
        naive_t[L] = statistics.median(c for _, c in ts)
        print(f"  naive L={L}: {statistics.median(w for w, _ in ts):.3f} s wall, "
              f"{naive_t[L]:.3f} s cpu")
    L0 = max(naive_t) if naive_t else None

    for L in a.lengths:
        args = make(B, H, L, D)
        methods = {"floor": lambda q, k, v, w, b: F.scaled_dot_product_attention(
            q, k, v, is_causal=True)}
        for C in a.blocks:
            for k in a.superblocks:
                methods[f"path[C={C},k={k}]"] = (
                    lambda C, k: lambda *x: path_attention(*x, block_size=C, superblock=k))(C, k)
        if a.against:
            spec = importlib.util.spec_from_file_location("path_against", a.against)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            methods["against"] = mod.path_attention
        mat_gb = 3.5 * B * H * L * L * D * 4 / 2**30  # KT + padded rows + grad of KT + saved rows
        if mat_gb <= a.mat_gb:
            methods["materialized"] = path_attention_materialized
        times = {name: [] for name in methods}
        for name, fn in methods.items():
            step(fn, args)  # warm-up
        for _ in range(a.reps):
            for name, fn in methods.items():
                times[name].append(timed(fn, args))
        wall = {name: statistics.median(w for w, _ in ts) for name, ts in times.items()}
        med = {name: statistics.median(c for _, c in ts) for name, ts in times.items()}
        print(f"\nL={L}   (wall s, cpu s, ratios to the floor; autograd-saved memory)")
        for name, t in med.items():
            mem = saved_bytes(methods[name], args) / 2**20 if name != "floor" else float("nan")
            print(f"  {name:14s} wall {wall[name]:8.3f} s x{wall[name] / wall['floor']:6.2f}   "
                  f"cpu {t:8.3f} s x{t / med['floor']:6.2f}   saved {mem:8.1f} MiB")
        if mat_gb > a.mat_gb:
            print(f"  materialized   skipped: estimated {mat_gb:.1f} GB > {a.mat_gb} GB")
        if L0:
            est = naive_t[L0] * (L / L0) ** 2
            best = min(t for n, t in med.items() if n.startswith("path"))
            print(f"  naive (cpu, extrapolated from L={L0} by L^2): {est:.1f} s   "
                  f"x{est / best:.0f} slower than best path (cpu)")


if __name__ == "__main__":
    main()
