"""CoPE: forward + backward time of pedsl's ``cope`` scheme against the no-PE floor and x-transformers' CoPE.

    python -m benchmarks.cope [--lengths 2048] [--repeats 3] [--threads N] [--max-pos 16] [--mem-cap-gb 8]
        [--profile] [--md FILE]

Variants, run interleaved in one process (each repeat runs every variant once, the first variant rotating;
one warm-up repeat dropped), ratios are medians over repeats of variant / floor in the same repeat:

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` - no positional encoding;
- ``pedsl``: ``compile_scheme("cope")``: the general path's explicit blocks of 256 queries (scores, gates,
  suffix sums, ``q . e``, two gathers, interpolation, softmax), each recomputed in the backward pass;
- ``x-transformers``: its ``Attend(causal=True, cope=CoPE(...))`` - the whole ``(B, H, L, L)`` logits, gates,
  positions and interpolated embedding materialised, with the same ``pos_emb`` (checked equal first);
  left out where its estimated peak (about 12 floats per (B, H, L, L) entry: 1.6 GB at L = 2048) is over
  ``--mem-cap-gb``, which a machine's memory would not survive (at 8192 it took 24 GB and was killed).

Timing and memory come from :mod:`benchmarks.measure` (process CPU time with one thread, wall time
otherwise; the peak of bytes allocated during one fwd+bwd above what was live before it). ``--profile``
prints the operators that take the time (self CPU time of one fwd+bwd under ``torch.profiler``). Shape
B=1, H=8, D=64, float32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, interleaved, peak_extra_bytes, profile_table
from pedsl.compiler import compile_scheme
from pedsl.fsio import atomic_write_text

B, H, D = 1, 8, 64


def xt_estimate_gb(L: int) -> float:
    """x-transformers' CoPE peak: logits, gates, positions, floor / ceil gathers, their interpolation and
    the gradients of each, about 12 floats per (B, H, L, L) entry (1,425 MiB measured at L = 2048)."""
    return 4 * B * H * L * L * 12 / 2**30


def _variants(L: int, max_pos: int, mem_cap_gb: float = float("inf")) -> list[Variant]:
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import CoPE

    mod = compile_scheme("cope", num_heads=H, head_dim=D, params={"max_pos": max_pos})
    cope = CoPE(dim=D, heads=H, max_pos=max_pos)
    with torch.no_grad():
        cope.pos_emb.normal_(std=0.5, generator=torch.Generator().manual_seed(1))
        mod.contextual_embedding.copy_(cope.pos_emb)  # the peer's parameters loaded into the pedsl module
    att = Attend(heads=H, causal=True, cope=cope, scale=D ** -0.5)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    out = [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v]),
           Variant("pedsl", lambda: mod(q, k, v), [q, k, v, mod.contextual_embedding])]
    if xt_estimate_gb(L) > mem_cap_gb:
        return out
    with torch.no_grad():  # both compute the same function
        gap = float((mod(q, k, v) - att(q, k, v)[0]).abs().max())
        assert gap < 1e-4, gap
    return out + [Variant("x-transformers", lambda: att(q, k, v)[0], [q, k, v, cope.pos_emb])]


def measure(L: int, repeats: int, max_pos: int, clock: str, mem_cap_gb: float = float("inf")) -> dict:
    variants = _variants(L, max_pos, mem_cap_gb)
    stats = interleaved(variants, repeats=repeats, clock=clock)
    return {"L": L, "max_pos": max_pos, "ms": {n: 1000 * s["total"]["median"] for n, s in stats.items()},
            "ratio": {n: s["total"]["ratio"] for n, s in stats.items()},
            "peak_mib": {v.name: peak_extra_bytes(v, True) / 2**20 for v in variants}}


def profile(L: int, max_pos: int, top: int = 10) -> str:
    """The operators that take the time of one fwd+bwd of pedsl and of x-transformers (self CPU time)."""
    variants = {v.name: v for v in _variants(L, max_pos)}
    return "\n".join(f"{name}, L = {L}: top operators by self CPU time\n" + profile_table(variants[name], True,
                                                                                       row_limit=top)
                     for name in ("pedsl", "x-transformers"))


def table(rows: list[dict]) -> str:
    out = ["| L, fwd+bwd | variant | ms | ratio to the floor | peak extra MiB |", "|---|---|---|---|---|"]
    for r in rows:
        for n in r["ms"]:
            out.append(f"| {r['L']} | {n} | {r['ms'][n]:.0f} | {r['ratio'][n]:.2f} | {r['peak_mib'][n]:.0f} |")
        if "x-transformers" in r["ms"]:
            out.append(f"| {r['L']} | pedsl / x-transformers | {r['ms']['pedsl'] / r['ms']['x-transformers']:.2f} | | |")
        else:
            out.append(f"| {r['L']} | x-transformers | skipped (est. {xt_estimate_gb(r['L']):.1f} GB > --mem-cap-gb) | | |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-pos", type=int, default=16)
    ap.add_argument("--mem-cap-gb", type=float, default=8.0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    clock = "cpu" if torch.get_num_threads() == 1 else "wall"  # one thread: process CPU time (measure.py)
    lengths = [int(L) for L in a.lengths.split(",")]
    text = table([measure(L, a.repeats, a.max_pos, clock, a.mem_cap_gb) for L in lengths])
    print(text)
    if a.profile:
        print(profile(lengths[0], a.max_pos))
    if a.md:
        atomic_write_text(a.md, text)


if __name__ == "__main__":
    main()
