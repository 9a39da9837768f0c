"""Learned functions of distance (T5, dynamic position bias, KERPLE, FIRE, Sandwich) and xPos: forward +
backward time and peak memory of pedsl's module against the no-PE floor and against the materialised-bias
layers of x-transformers.

    python -m benchmarks.distance_bias [SCHEME...] [--lengths 2048,8192] [--repeats 3] [--threads N]
                                       [--clock auto|wall|cpu] [--mem-cap-gb 3] [--md FILE] [--json FILE]

Variants, run interleaved in one process by :func:`benchmarks.measure.interleaved` (each repeat runs every
variant once, the first variant rotating; one warm-up repeat dropped); ratios are medians over repeats of
variant / floor in the same repeat:

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` - no positional encoding;
- ``pedsl``: ``compile_scheme(<scheme>)`` called as ``module(q, k, v)``: a distance table computed once per
  call (O(H L)) and read per block of 256 queries as a strided view by the flash kernel
  (:mod:`pedsl.ops.distance_bias`); FIRE's bias, which reads the query position, on the C++ MLP-bias kernel
  (:mod:`pedsl.ops.mlp_kernel`: per row the MLP's units switch at most once along the distances, the bias
  linear in u per segment; :mod:`pedsl.ops.mlp_bias` where no C++ compiler is there); xPos a
  rotation of q and k;
- ``materialised``: what x-transformers does - the whole ``(1, H, L, L)`` bias built every call from the
  learned parameters (``RelativePositionBias`` for T5, ``DynamicPositionBias`` for DPB; for KERPLE, FIRE and
  Sandwich, which x-transformers does not have, the module's own bias materialised by ``bias_table``), with
  the causal mask, as SDPA's float ``attn_mask``; skipped where the bias would exceed ``--mem-cap-gb``
  (none for xPos, which has no bias).

Gradients flow to q, k, v and every learned parameter. Shape B=1, H=8, D=64, float32. Peak memory: one
more call of each variant under ``torch.profiler`` (:func:`benchmarks.measure.peak_extra_bytes`: bytes
allocated during the call above what was live before it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, interleaved, peak_extra_bytes
from pedsl.compiler import compile_scheme
from pedsl.fsio import atomic_write_text

SCHEMES = ("t5_bias", "dynamic_position_bias", "kerple_log", "kerple_power", "fire", "sandwich", "xpos")
NO_BIAS = ("xpos",)
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


def _variants(name: str, L: int, mem_cap_gb: float) -> tuple[list[Variant], str]:
    """The variants of one scheme at one length, and why the materialised one is missing ("" if it is not)."""
    # the same initial parameters in every run: FIRE's time depends on where its MLP's kinks fall (how many
    # units are evaluated per pair, over how wide bands), which a fresh random initialisation moves
    torch.manual_seed(0)
    mod = compile_scheme(name, num_heads=H, head_dim=D)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    leaves = [q, k, v, *mod.parameters()]
    out = [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v])]
    out.append(Variant("pedsl", lambda: mod(q, k, v), leaves))
    if name in NO_BIAS:
        return out, "no bias"
    gb = 4 * B * H * L * L * 3 / 2**30  # the bias, its masked copy and its gradient
    if gb > mem_cap_gb:
        return out, f"est. {gb:.1f} GB > cap {mem_cap_gb:g} GB"
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    materialise = _xt_bias(name, mod)

    def materialised():
        bias = materialise(L).masked_fill(causal, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    with torch.no_grad():  # both compute the same function
        gap = float((materialised() - mod(q, k, v)).abs().max())
    assert gap < 1e-4, (name, gap)
    return out + [Variant("materialised", materialised, leaves)], ""


def measure(name: str, L: int, repeats: int, mem_cap_gb: float, clock: str) -> dict:
    variants, skipped = _variants(name, L, mem_cap_gb)
    stats = interleaved(variants, repeats=repeats, clock=clock)
    peak = {v.name: peak_extra_bytes(v, True) / 2**20 for v in variants}
    return {"scheme": name, "L": L, "ms": {n: 1000 * s["total"]["median"] for n, s in stats.items()},
            "fwd_ms": {n: 1000 * s["fwd"]["median"] for n, s in stats.items()},
            "ratio": {n: s["total"]["ratio"] for n, s in stats.items()},
            "times": {n: s["total"]["times"] for n, s in stats.items()}, "peak_mib": peak, "skipped": skipped}


def table(rows: list[dict]) -> str:
    out = ["| scheme | L | floor ms | pedsl ms | **pedsl / floor** | materialised ms | materialised / floor |"
           " materialised / pedsl | peak extra MiB: floor / pedsl / materialised |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, q, pk = r["ms"], r["ratio"], r["peak_mib"]
        if "pedsl" not in m:
            out.append(f"| {r['scheme']} | {r['L']} | {m['floor']:.0f} | skipped ({r['skipped']}) | - | - | - | - | - |")
            continue
        if "materialised" in m:
            mat = f"{m['materialised']:.0f} | {q['materialised']:.2f} | {q['materialised'] / q['pedsl']:.1f}x"
            mem = f"{pk['floor']:.0f} / {pk['pedsl']:.0f} / {pk['materialised']:.0f}"
        else:
            mat = f"skipped ({r['skipped']}) | - | -"
            mem = f"{pk['floor']:.0f} / {pk['pedsl']:.0f} / -"
        out.append(f"| {r['scheme']} | {r['L']} | {m['floor']:.0f} | {m['pedsl']:.0f} | **{q['pedsl']:.2f}** | {mat} "
                   f"| {mem} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=list(SCHEMES))
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="auto: process CPU time with one thread, wall time otherwise (benchmarks/README.md)")
    ap.add_argument("--mem-cap-gb", type=float, default=3.0)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    clock = a.clock if a.clock != "auto" else ("cpu" if torch.get_num_threads() == 1 else "wall")
    torch.set_flush_denormal(True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(["python -m benchmarks.distance_bias", *(sys.argv[1:] if argv is None else argv)]),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "clock": clock,
            "repeats": a.repeats, "shape": {"B": B, "H": H, "D": D}, "loadavg_start": os.getloadavg()}
    rows = [measure(s, int(L), a.repeats, a.mem_cap_gb, clock) for L in a.lengths.split(",") for s in a.schemes]
    meta["loadavg_end"] = os.getloadavg()
    text = (f"{meta['date']}, torch {meta['torch']}, {meta['threads']} threads, clock {clock}, {a.repeats} repeats, "
            f"load average at start / end: {meta['loadavg_start'][0]:.1f} / {meta['loadavg_end'][0]:.1f}\n\n"
            + table(rows))
    print(text)
    if a.md:
        atomic_write_text(a.md, text)
    if a.json:
        atomic_write_text(a.json, json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
