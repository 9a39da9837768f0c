"""Time ``torch.compile`` of one scheme in a fresh process (run twice by the runner: first, then cached).

    python -m benchmarks.compile_time schemes/rope.pe --L 512

Prints ``key=value`` pairs: ``first_call_s`` (the first compiled forward + backward, compile
included), ``steady_s`` (median of 3 later calls) and ``compile_s`` = first - steady. The runner
points ``TORCHINDUCTOR_CACHE_DIR`` at a fresh folder, so the first process compiles from
scratch and the second one finds inductor's on-disk cache (dynamo tracing still runs).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scheme")
    ap.add_argument("--L", type=int, default=512)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    a = ap.parse_args()
    import torch

    torch.set_flush_denormal(True)
    from benchmarks.cases import make_inputs
    from pedsl.compiler import compile_scheme

    mod = compile_scheme(a.scheme, head_dim=a.D, num_heads=a.H, d_model=a.H * a.D, compile=True)
    q, k, v, x, tokens, go = make_inputs(a.B, a.H, a.L, a.D, a.H * a.D)

    def step():
        t0 = time.perf_counter()
        out = mod(q, k, v, x=x, tokens=tokens)
        out.backward(go)
        return time.perf_counter() - t0

    first = step()
    steady = statistics.median(step() for _ in range(3))
    print(f"first_call_s={first:.3f} steady_s={steady:.3f} compile_s={first - steady:.3f}")


if __name__ == "__main__":
    main()
