"""Multi-axis RoPE against the no-PE floor and hand-written axial RoPE: ``python -m benchmarks.axes``.

Forward + backward at L = 4096 (a 64 x 64 grid; video: 4 frames of 32 x 32), B = 4, H = 8, D = 64,
float32, interleaved in one process (:func:`benchmarks.measure.interleaved`). Variants:

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, no positional encoding;
- ``hand axial 2-D``: rotary-embedding-torch's axial RoPE written by hand - cos/sin of the grid's (h, w)
  positions cached outside the timer as full-width (L, D) tables (row frequencies on the first half of the
  head, column frequencies on the second, pairs (2k, 2k + 1)), ``q * cos + rot(q) * sin``, then SDPA;
- ``hand M-RoPE``: Hugging Face's Qwen2-VL path - cos/sin (B, L, D) from the (3, B, L) positions and the
  mrope_section recomposition computed inside the timer (HF does it per forward), rotate_half, SDPA;
- ``pedsl rope_2d`` / ``pedsl rope_3d`` / ``pedsl mrope``: the library schemes compiled at this shape,
  called as ``module(q, k, v, positions=P)`` with P (A, B, L).

Every variant computes the same function as its pedsl counterpart (checked at the start on the
timed inputs: max |difference| printed). The target is pedsl <= 1.10x the floor.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, interleaved
from pedsl.compiler import compile_scheme
from pedsl.fsio import atomic_write_text
from pedsl.lang.library import scheme_file

B, H, L, D = 4, 8, 4096, 64  # the shape


def grid_positions(side: int = 64) -> torch.Tensor:
    """(2, B, L): the raster order of a side x side grid, (row, column) per token."""
    idx = torch.arange(side * side)
    return torch.stack([idx // side, idx % side])[:, None].expand(2, B, -1).contiguous()


def video_positions(frames: int = 4, side: int = 32) -> torch.Tensor:
    idx = torch.arange(frames * side * side)
    return torch.stack([idx // (side * side), idx // side % side, idx % side])[:, None].expand(3, B, -1).contiguous()


def image_positions(side: int = 64) -> torch.Tensor:
    """Qwen2-VL's (t, h, w) of one image: t = 0, (h, w) the grid."""
    hw = grid_positions(side)
    return torch.cat([torch.zeros_like(hw[:1]), hw])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def hand_axial_tables(P: torch.Tensor, base: float = 100.0):
    """Full-width (L, D) cos/sin of axial 2-D RoPE as rotary-embedding-torch lays them out: the first half of
    the head the row's frequencies, the second the column's, each repeated over its pair (2k, 2k + 1)."""
    half = D // 2
    inv = base ** (-torch.arange(0, half, 2, dtype=torch.float64) / half)
    ang = torch.cat([P[a, 0, :, None].double() * inv for a in range(2)], -1).repeat_interleave(2, -1)  # (L, D)
    return ang.cos().float(), ang.sin().float()


def rotate_pairs_interleaved(x: torch.Tensor) -> torch.Tensor:
    """rotary-embedding-torch's rotate_half: (x_2k, x_2k+1) -> (-x_2k+1, x_2k)."""
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


def hand_axial(q, k, v, cos, sin):
    def rot(x):
        return x * cos + rotate_pairs_interleaved(x) * sin

    return F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True)


def hand_mrope(q, k, v, P, section, base: float = 1e6):
    """Hugging Face's Qwen2-VL rotary (float32 tables per forward, mrope_section split) and rotate_half."""
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = P[..., None].float() * inv  # (3, B, L, D/2)
    freqs = torch.cat([m[i % 3] for i, m in enumerate(freqs.split(section, dim=-1))], dim=-1)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    return F.scaled_dot_product_attention(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v,
                                          is_causal=True)


def variants(q, k, v):
    mods = {name: compile_scheme(scheme_file(name), num_heads=H, head_dim=D) for name in
            ("rope_2d", "rope_3d", "mrope")}
    P2, P3, Pm = grid_positions(), video_positions(), image_positions()
    cos, sin = hand_axial_tables(P2, float(mods["rope_2d"].scheme.params["base"]))
    s = int(mods["mrope"].scheme.params["space_pairs"])
    section = [D // 2 - 2 * s, s, s]
    out = [
        Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v], "floor"),
        Variant("hand axial 2-D", lambda: hand_axial(q, k, v, cos, sin), [q, k, v], "hand"),
        Variant("hand M-RoPE (HF)", lambda: hand_mrope(q, k, v, Pm, section), [q, k, v], "hand"),
        Variant("pedsl rope_2d", lambda: mods["rope_2d"](q, k, v, positions=P2), [q, k, v], "pedsl"),
        Variant("pedsl rope_3d", lambda: mods["rope_3d"](q, k, v, positions=P3), [q, k, v], "pedsl"),
        Variant("pedsl mrope", lambda: mods["mrope"](q, k, v, positions=Pm), [q, k, v], "pedsl"),
    ]
    with torch.no_grad():  # the same functions: hand-written against pedsl
        agree = {"hand axial 2-D vs pedsl rope_2d": float((out[1].run() - out[3].run()).abs().max()),
                 "hand M-RoPE vs pedsl mrope": float((out[2].run() - out[5].run()).abs().max())}
    return out, agree


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.axes", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_() for _ in range(3))
    vs, agree = variants(q, k, v)
    # one thread: the process CPU clock (time stolen by other processes on a shared machine is not counted)
    clock = "cpu" if torch.get_num_threads() == 1 else "wall"
    res = interleaved(vs, repeats=args.repeats, backward=True, grad_out=torch.ones(B, H, L, D), clock=clock)
    print(f"B={B} H={H} L={L} D={D} float32, forward + backward, {args.repeats} interleaved repeats, "
          f"{torch.get_num_threads()} threads, {clock} clock")
    print("| variant | fwd+bwd ms | ratio to floor |")
    print("|---|---:|---:|")
    for name, r in res.items():
        print(f"| {name} | {r['total']['median'] * 1e3:.0f} | {r['total']['ratio']:.3f} |")
    for what, d in agree.items():
        print(f"max |difference| {what}: {d:.2e}")
    if args.json:
        atomic_write_text(args.json, json.dumps({"results": {n: r["total"] for n, r in res.items()}, "agreement": agree},
                                         indent=1))


if __name__ == "__main__":
    main()
