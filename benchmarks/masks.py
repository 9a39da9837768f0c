"""A bidirectional scheme against plain non-causal SDPA: what the mask statement costs on the fused path.

    python -m benchmarks.masks [--length 2048] [--repeats 7] [--threads 1] [--backward]

Variants, interleaved (each repeat runs every variant once, the first one rotating), float32 on CPU at
B=1, H=8, D=64:

* ``plain non-causal SDPA``: ``F.scaled_dot_product_attention(q, k, v)`` (no positional encoding);
* ``pedsl rope (bidirectional)``: ``schemes/rope.pe`` with ``mask = bidirectional``, one fresh sequence:
  the fused non-causal path (``kernel_support``'s ``bidirectional``: q and k rotated, then the same SDPA);
* ``pedsl rope_2d_encoder``: the library's axial 2-D RoPE encoder, positions of a square grid given (the
  per-token phases of a call with positions: the general path, non-causal blocks of queries).

Times are this process's CPU time (``time.process_time``); the table gives the median per variant and its
ratio to plain SDPA.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pedsl.compiler import compile_scheme
from pedsl.torchenv import setup_torch

SCHEMES = Path(__file__).resolve().parents[1] / "schemes"
B, H, D = 1, 8, 64


def variants(L: int) -> dict:
    """name -> a function of (q, k, v) running one call."""
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme bidir extends rope {{\n  mask = bidirectional\n}}'
    rope = compile_scheme(src, num_heads=H, head_dim=D)
    enc = compile_scheme(SCHEMES / "rope_2d_encoder.pe", num_heads=H, head_dim=D)
    side = int(L ** 0.5)
    idx = torch.arange(L)
    grid = torch.stack([idx // side, idx % side])[:, None, :]  # (2, B, L): row, column
    return {
        "plain non-causal SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "pedsl rope (bidirectional)": lambda q, k, v: rope(q, k, v),
        "pedsl rope_2d_encoder": lambda q, k, v: enc(q, k, v, positions=grid),
    }


def measure(L: int, repeats: int, backward: bool) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(backward) for _ in range(3))
    runs = variants(L)
    names = list(runs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up: tables, kernels
        runs[n](q, k, v)
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.process_time()
            o = runs[n](q, k, v)
            if backward:
                o.sum().backward()
            times[n].append(time.process_time() - t0)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backward", action="store_true", help="time forward plus backward")
    args = ap.parse_args(argv)
    setup_torch(threads=args.threads)
    times = measure(args.length, args.repeats, args.backward)
    base = statistics.median(times["plain non-causal SDPA"])
    what = "forward + backward" if args.backward else "forward"
    print(f"L = {args.length}, B={B} H={H} D={D}, float32, {args.threads} thread(s), {what}, median of {args.repeats}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:30s} {med * 1e3:9.1f} ms   x{med / base:.3f}")


if __name__ == "__main__":
    main()
