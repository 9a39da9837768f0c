"""Time ``torch.compile`` of one scheme in a fresh process (run twice by the runner: first, then cached).

    python -m benchmarks.compile_time schemes/rope.pe --L 512

Prints ``key=value`` pairs: ``first_call_s`` / ``second_call_s`` (the first two compiled forward +
backward calls, compile and any recompile included), ``steady_s`` (median of 3 later calls),
``compile_s`` = first + second - 2 steady (wall) and ``compile_cpu_s`` (the same in CPU seconds of
this process and its children, i.e. inductor's compile workers; on a shared machine the wall time
mostly measures other people's load), ``process_cpu_s`` (the whole process, imports included). The runner
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

    def cpu() -> float:
        import resource

        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime  # includes inductor's compile workers

    def step():
        t0, c0 = time.perf_counter(), cpu()
        out = mod(q, k, v, x=x, tokens=tokens)
        out.backward(go)
        return time.perf_counter() - t0, cpu() - c0

    first, second = step(), step()  # a recompile, if any, shows in the second call
    rest = [step() for _ in range(3)]
    steady, steady_cpu = statistics.median(r[0] for r in rest), statistics.median(r[1] for r in rest)
    print(f"first_call_s={first[0]:.3f} second_call_s={second[0]:.3f} steady_s={steady:.3f} "
          f"compile_s={first[0] + second[0] - 2 * steady:.3f} "
          f"compile_cpu_s={first[1] + second[1] - 2 * steady_cpu:.3f} process_cpu_s={cpu():.3f}")


if __name__ == "__main__":
    main()
