"""Learned functions of distance (T5, dynamic position bias, KERPLE, FIRE, Sandwich): forward + backward time
of pedsl's module against the no-PE floor and against the materialised-bias layers of x-transformers.

    python -m benchmarks.distance_bias [--lengths 2048,8192] [--repeats 3] [--threads N] [--md FILE]

Variants, run interleaved in one process (each repeat runs every variant once, the first variant rotating;
one warm-up repeat dropped), ratios are medians over repeats of variant / floor in the same repeat:

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` - no positional encoding;
- ``pedsl``: ``compile_scheme(<scheme>)`` (backend ``sdpa``: the ``(H, distances)`` table computed once per
  call and gathered per block of 256 queries into SDPA's float mask; FIRE's per block of queries);
- ``materialised``: what x-transformers does - the whole ``(1, H, L, L)`` bias built every call from the
  learned parameters (``RelativePositionBias`` for T5, ``DynamicPositionBias`` for DPB; for KERPLE, FIRE and
  Sandwich, which x-transformers does not have, the module's own bias materialised by ``bias_table``), with
  the causal mask, as SDPA's float ``attn_mask``; skipped where the bias would exceed ``--mem-cap-gb``.

Gradients flow to q, k, v and every learned parameter. Shape B=1, H=8, D=64, float32.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pedsl.compiler import compile_scheme
from pedsl.fsio import atomic_write_text

SCHEMES = ("t5_bias", "dynamic_position_bias", "kerple_log", "fire", "sandwich")
B, H, D = 1, 8, 64


def _xt_bias(name: str, mod):
    """x-transformers' materialised bias for T5 and DPB with the module's weights; else the module's own."""
    from x_transformers.x_transformers import DynamicPositionBias, RelativePositionBias

    if name == "t5_bias":
        peer = RelativePositionBias(scale=1.0, causal=True, num_buckets=32, max_distance=128, heads=H)
        peer.relative_attention_bias.weight = mod.learned.sites["bias[0]__table0"].weight
        return lambda L: peer(L, L).unsqueeze(0)
    if name == "dynamic_position_bias":
        peer = DynamicPositionBias(dim=32, heads=H, depth=2, log_distance=True)
        net = mod.learned.sites["bias[0]__mlp0"]
        for k in range(2):
            peer.mlp[k][0].weight, peer.mlp[k][0].bias = net[2 * k].weight, net[2 * k].bias
        peer.mlp[2].weight, peer.mlp[2].bias = net[4].weight, net[4].bias
        return lambda L: peer(L, L).unsqueeze(0)
    return lambda L: mod.bias_table(L, None, None, torch.device("cpu")).float()


def _variants(name: str, L: int, mem_cap_gb: float) -> dict:
    mod = compile_scheme(name, num_heads=H, head_dim=D)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    materialise = _xt_bias(name, mod)

    def floor():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def pedsl():
        mod(q, k, v).sum().backward()

    def materialised():
        bias = materialise(L).masked_fill(causal, float("-inf"))
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()

    out = {"floor": floor, "pedsl": pedsl}
    if 4 * B * H * L * L * 3 / 2**30 <= mem_cap_gb:  # the bias, its masked copy and its gradient
        out["materialised"] = materialised
    with torch.no_grad():  # every variant computes the same function
        ref = mod(q, k, v)
        if "materialised" in out:
            bias = materialise(L).masked_fill(causal, float("-inf"))
            gap = float((F.scaled_dot_product_attention(q, k, v, attn_mask=bias) - ref).abs().max())
            assert gap < 1e-4, (name, gap)
    return out


def measure(name: str, L: int, repeats: int, mem_cap_gb: float) -> dict:
    variants = _variants(name, L, mem_cap_gb)
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats + 1):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            variants[n]()
            dt = time.perf_counter() - t0
            if r:  # the first repeat warms up
                times[n].append(dt)
    ratio = {n: statistics.median(t / f for t, f in zip(times[n], times["floor"])) for n in names}
    return {"scheme": name, "L": L, "ms": {n: 1000 * statistics.median(times[n]) for n in names}, "ratio": ratio}


def table(rows: list[dict]) -> str:
    out = ["| scheme | L | floor fwd+bwd ms | pedsl ms | pedsl / floor | materialised ms | materialised / floor |"
           " pedsl / materialised |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, q = r["ms"], r["ratio"]
        mat = f"{m['materialised']:.0f} | {q['materialised']:.2f}" if "materialised" in m else "skipped (memory) | -"
        rel = f"{m['pedsl'] / m['materialised']:.2f}" if "materialised" in m else "-"
        out.append(f"| {r['scheme']} | {r['L']} | {m['floor']:.0f} | {m['pedsl']:.0f} | {q['pedsl']:.2f} | {mat} | {rel} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=list(SCHEMES))
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--mem-cap-gb", type=float, default=3.0)
    ap.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    rows = [measure(s, int(L), a.repeats, a.mem_cap_gb) for L in a.lengths.split(",") for s in a.schemes]
    text = table(rows)
    print(text)
    if a.md:
        atomic_write_text(a.md, text)


if __name__ == "__main__":
    main()
