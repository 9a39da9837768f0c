"""PaTH decode step: the general forward's fused scoring (:mod:`pedsl.ops.path_decode`) and its explicit one.

    python -m benchmarks.path_decode_fused [--cache 4096] [--repeats 7] [--steps 128]

The "explicit" variant patches, for its own samples only, the general forward's fused scoring away (explicit
scores by batched products, flushing every 32 tokens as before the fused scoring). Floor, explicit and fused run interleaved in one process on the same cache (B=4, H=8, D=64, float32, one thread,
process CPU time); a sample is ``--steps`` decode steps (a multiple of both flush intervals, so each includes its
flushes), the cache cut back after it outside the timer (its keys stay as the flushes left them, as in
:mod:`benchmarks.decode`: a step's cost does not depend on them). Ratio: median over repeats of (variant / floor).
compiler_tests/compiler/test_path_decode_fused.py checks that decoding with it equals one forward.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.nn.functional as F

import pedsl.compiler.general.path as general_path
from benchmarks.decode import _fill
from pedsl.compiler import compile_scheme


@contextlib.contextmanager
def explicit_scoring():
    """The general forward without its fused scoring, for the duration of a sample."""
    fused, flush = general_path.fused_path_scores, general_path.PATH_FLUSH
    general_path.fused_path_scores, general_path.PATH_FLUSH = (lambda *a, **kw: None), 32
    try:
        yield
    finally:
        general_path.fused_path_scores, general_path.PATH_FLUSH = fused, flush


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--scheme", default="path")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    B, H, D, N, S = 4, 8, 64, a.cache, a.steps
    g = torch.Generator().manual_seed(N)
    cap = 1 << (N + S).bit_length()
    Kb, Vb = torch.randn(B, H, cap, D, generator=g), torch.randn(B, H, cap, D, generator=g)
    q1, k1, v1 = (torch.randn(B, H, 1, D, generator=g) for _ in range(3))
    mod = compile_scheme(a.scheme, num_heads=H, head_dim=D, d_model=H * D, requires_grad=False)
    cache = mod.new_cache(B)
    with torch.no_grad():
        _fill(mod, cache, N, B, H, D, H * D, g)
    x1 = torch.randn(B, 1, H * D, generator=g) if mod.needs_x else None

    def floor():
        for s in range(N, N + S):
            Kb[:, :, s: s + 1].copy_(k1)
            Vb[:, :, s: s + 1].copy_(v1)
            F.scaled_dot_product_attention(q1, Kb[:, :, : s + 1], Vb[:, :, : s + 1])

    def decode(ctx):
        with ctx():
            for _ in range(S):
                out = mod(q1, k1, v1, x=x1, cache=cache)
        cache.length = N
        cache.path_pending = cache.path_flushed = None
        return out

    variants = {"floor": floor, "explicit": lambda: decode(explicit_scoring),
                "fused": lambda: decode(contextlib.nullcontext)}
    with torch.no_grad():
        times = {n: [] for n in variants}
        for r in range(a.repeats):
            for i in range(len(variants)):
                name = list(variants)[(i + r) % len(variants)]
                t0 = time.process_time()
                variants[name]()
                times[name].append(time.process_time() - t0)
    print(f"cache {N}, {S} steps a sample, B={B} H={H} D={D} float32, 1 thread, {a.repeats} repeats, "
          f"load {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts, times["floor"]))
        print(f"  {name:8s} {statistics.median(ts) / S * 1e3:7.2f} ms/step   x{ratio:.2f} of SDPA decode")


if __name__ == "__main__":
    main()
