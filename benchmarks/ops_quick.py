"""Quick CPU timing of pedsl.ops kernels against the fused-attention floor (not a test).

L=2048, B=4, H=8, D=64, fp32, forward + backward, variants interleaved, median of
5 timed rounds after one warm-up round. Prints each variant's median and its
ratio to the floor ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``.

    python benchmarks/ops_quick.py [--L 2048] [--reps 5] [--only rope,so2_qk]

Denormals are flushed here (docs/semantics.md §6: the application owns that choice).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from pedsl.ops import (
    alibi_bias,
    alibi_key_term,
    alibi_slopes,
    apply_rotary,
    forget_key_term,
    geometric_freqs,
    materialized_bias_attention,
    rotary_cos_sin,
    separable_bias_attention,
    so2_accumulated_attention,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=2048)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave the default)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: process CPU time (steadier on a shared machine; use with --threads 1)")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, L, D = args.B, args.H, args.L, args.D
    P = D // 2
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    go = torch.randn(B, H, L, D)

    # tables precomputed once, as a model would cache them
    freqs = geometric_freqs(P)
    cos, sin = rotary_cos_sin(freqs, torch.arange(L), torch.float32)  # (L, P)
    cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # HF: (L, D)
    steps = (0.3 * torch.randn(B, H, L, P, dtype=torch.float64)).requires_grad_()  # learned token-dependent
    slopes = alibi_slopes(H)
    bias = alibi_bias(slopes, L)  # (1, H, L, L), cached like a hand-written model would
    g_alibi = alibi_key_term(slopes, L)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, H, L) + 3.0).requires_grad_()

    def rotate_half(x):
        x1, x2 = x.chunk(2, -1)
        return torch.cat([-x2, x1], -1)

    variants = {
        "floor": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v)),
        "hf_rope": (lambda: F.scaled_dot_product_attention(
            q * cos2 + rotate_half(q) * sin2, k * cos2 + rotate_half(k) * sin2, v, is_causal=True), (q, k, v)),
        "rope": (lambda: F.scaled_dot_product_attention(
            apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, is_causal=True), (q, k, v)),
        "so2_qk": (lambda: so2_accumulated_attention(q, k, v, steps), (q, k, v, steps)),
        "so2_qkv": (lambda: so2_accumulated_attention(q, k, v, steps, value_rotation=True), (q, k, v, steps)),
        "alibi_materialised": (lambda: materialized_bias_attention(q, k, v, bias), (q, k, v)),
        "alibi_separable": (lambda: separable_bias_attention(q, k, v, g_alibi), (q, k, v)),
        "forget_separable": (lambda: separable_bias_attention(q, k, v, forget_key_term(log_f)), (q, k, v, log_f)),
    }
    if args.only:
        keep = {"floor", *args.only.split(",")}
        variants = {n: f for n, f in variants.items() if n in keep}

    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def run(fn, inputs):
        t0 = clock()
        out = fn()
        torch.autograd.grad(out, inputs, go)
        return clock() - t0

    times: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(args.reps + 1):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate to spread drift
        for n in order:
            t = run(*variants[n])
            if r > 0:
                times[n].append(t)
    floor = statistics.median(times["floor"])
    print(f"L={L} B={B} H={H} D={D} fp32 fwd+bwd, median of {args.reps}, threads={torch.get_num_threads()}, "
          f"clock={args.clock}")
    for n in names:
        m = statistics.median(times[n])
        print(f"{n:20s} {m * 1e3:9.1f} ms   {m / floor:5.2f}x")


if __name__ == "__main__":
    main()
