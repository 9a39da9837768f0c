"""Soft caps, sink logits and windows beside biases on the C++ causal kernel (``rows_attend`` of
:mod:`pedsl.compiler.general.attention`), against the path they took before (the general forward's blocks of
queries) and the no-PE floor: forward + backward, interleaved in one process.

    python -m benchmarks.row_modifiers [CASE...] [--length 2048] [--repeats 3] [--threads 1]

A case is a library scheme with statements added (``rope+softcap = 50.0``; ``+`` separates statements).
Variants, run by :func:`benchmarks.measure.interleaved` (each repeat runs every variant once, the first rotating;
one warm-up repeat dropped; ratios are medians over repeats of variant / floor in the same repeat):

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, no positional encoding, every key;
- ``before``: the module with ``rows_attend`` answering None (the blocks of queries: SDPA with a sink column and
  a float64 bias per block, or explicit scores under a soft cap, with activation checkpointing);
- ``after``: the module as it is.

Shape B=4, H=8, D=64, float32, gradients to q, k, v and every learned parameter. With one thread the clock
is the process CPU time (:mod:`benchmarks.measure`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, interleaved
from pedsl.compiler import compile_scheme
from pedsl.compiler.general import attention

CASES = ("rope_sink", "rope+softcap = 50.0", "rope_sink+window = 128", "alibi+window = 512", "fox+window = 512",
         "t5_bias+softcap = 30.0")
B, H, D = 4, 8, 64
SCHEMES = Path(__file__).resolve().parents[1] / "schemes"


def _module(case: str):
    base, *extra = case.split("+")
    src = f'import "{SCHEMES / (base + ".pe")}"\nscheme s extends {base} {{\n' + "\n".join(extra) + "\n}"
    torch.manual_seed(0)
    return compile_scheme(src, num_heads=H, head_dim=D, d_model=H * D)


def _before(mod, q, k, v, x):
    real = attention.rows_attend
    attention.rows_attend = lambda *a, **kw: None
    try:
        return mod(q, k, v, x=x)
    finally:
        attention.rows_attend = real


def measure(case: str, L: int, repeats: int, clock: str) -> dict:
    mod = _module(case)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    x = torch.randn(B, L, H * D, generator=g)
    leaves = [q, k, v, *mod.parameters()]
    with torch.no_grad():  # both compute the same function
        gap = float((_before(mod, q, k, v, x) - mod(q, k, v, x=x)).abs().max())
    variants = [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v]),
                Variant("before", lambda: _before(mod, q, k, v, x), leaves),
                Variant("after", lambda: mod(q, k, v, x=x), leaves)]
    stats = interleaved(variants, repeats=repeats, clock=clock)
    return {"case": case, "gap": gap, **{n: (s["total"]["ratio"], s["fwd"]["ratio"]) for n, s in stats.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    clock = "cpu" if torch.get_num_threads() == 1 else "wall"
    torch.set_flush_denormal(True)
    start = os.getloadavg()[0]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, L = {a.length}, {torch.get_num_threads()} "
          f"threads, clock {clock}, {a.repeats} repeats, B={B} H={H} D={D} float32, fwd+bwd (fwd) / floor\n")
    print("| case | before | after | max abs before - after |\n|---|---|---|---|")
    for case in a.cases:
        r = measure(case, a.length, a.repeats, clock)
        print(f"| {case} | {r['before'][0]:.2f}x ({r['before'][1]:.2f}x) | **{r['after'][0]:.2f}x** "
              f"({r['after'][1]:.2f}x) | {r['gap']:.1e} |", flush=True)
    print(f"\nload average at start / end: {start:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
