"""Sliding-window attention: time, peak memory and decoding, side by side in one run.

    python -m benchmarks.windows [--length 8192] [--window 512] [--repeats 5] [--decode 32768] [--contrast 8192]
        [--threads N] [--parts timing,decode] [--variants "windowed floor,pedsl path (full),pedsl path + window"]

Variants, interleaved (each repeat runs every variant once, the first one rotating), forward plus
backward in float32 on CPU at B=1, H=8, D=64:

* ``full causal``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` over the whole
  sequence (what a window saves);
* ``windowed floor``: no positional encoding, SDPA per block of 128 queries over the keys the block
  can see with the band as its mask (the least a windowed kernel can do with SDPA);
* ``banded kernel (no PE)``: ``pedsl.compiler.band_dispatch.sliding_window_attention``, the kernel a
  rotation-only window runs in process (the C++ kernel: per block of 64 queries, GEMMs over the one run
  of keys the block can see), without the rotation: what the rotation itself costs on top;
* ``banded flash path (no PE)``: ``pedsl.ops.window_kernels.sliding_window_attention``, what runs
  where the C++ kernel cannot be built and in generated modules (flash-kernel calls: unmasked middle
  runs, causal diagonal tiles, one masked edge tile per block, merged by log-sum-exp);
* ``pedsl rope_local``: ``compile_scheme("schemes/rope_local.pe", -P width=N)``: RoPE inside the window;
* ``pedsl path (full)``: ``schemes/path.pe`` over the whole sequence (the blockwise PaTH kernel), and
  ``pedsl path + window``: the same scheme with ``window = N`` (the windowed PaTH kernel,
  ``pedsl.ops.path.path_attention_local``), both with their layer input x and its projections.

Times are this process's CPU time (``time.process_time``: robust to other load on the machine; at
``--threads 1`` it is the kernel's own time). Peak memory: each variant once more in a fresh process,
the rise of its peak resident set over the inputs (sampled from /proc). Decoding (``--parts decode``):
``rope_local`` decodes token by token to ``--decode`` tokens (the one-token fast path of
``stream.decode_step``), plain ``rope`` to ``--contrast`` tokens (its cache and time per token grow
with the length); the table gives the median time per token and the cache's bytes at 1K, 4K and the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pedsl.compiler import band_dispatch, compile_scheme
from pedsl.ops import band_kernel, window_kernels
from pedsl.torchenv import setup_torch

SCHEMES = Path(__file__).resolve().parents[1] / "schemes"
B, H, D = 1, 8, 64
BLOCK = 128


def windowed_floor(q, k, v, window: int):
    """No-PE sliding-window attention: SDPA per block of queries over the keys it can see."""
    L = q.shape[2]
    outs = []
    for r0 in range(0, L, BLOCK):
        r1 = min(L, r0 + BLOCK)
        k0 = max(0, r0 - window + 1)
        i = torch.arange(r0, r1)[:, None]
        j = torch.arange(k0, r1)[None, :]
        band = (j <= i) & (i - j < window)
        outs.append(F.scaled_dot_product_attention(q[:, :, r0:r1], k[:, :, k0:r1], v[:, :, k0:r1], attn_mask=band))
    return torch.cat(outs, dim=2)


def variants(window: int) -> dict:
    mod = compile_scheme(SCHEMES / "rope_local.pe", params={"width": window}, num_heads=H, head_dim=D)
    path = compile_scheme(SCHEMES / "path.pe", num_heads=H, head_dim=D, d_model=H * D)
    local = compile_scheme(f'import "{SCHEMES / "path.pe"}"\nscheme path_window extends path {{ window = {window} }}',
                           num_heads=H, head_dim=D, d_model=H * D)
    return {
        "full causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "windowed floor": lambda q, k, v: windowed_floor(q, k, v, window),
        "banded kernel (no PE)": lambda q, k, v: band_dispatch.sliding_window_attention(q, k, v, window),
        "banded flash path (no PE)": lambda q, k, v: window_kernels.sliding_window_attention(q, k, v, window),
        "pedsl rope_local": lambda q, k, v: mod(q, k, v),
        "pedsl path (full)": lambda q, k, v: path(q, k, v, x=model_input(q)),
        "pedsl path + window": lambda q, k, v: local(q, k, v, x=model_input(q)),
    }


def model_input(q):
    """The layer input x (B, L, H D) PaTH's steps are computed from, fixed per length."""
    L = q.shape[2]
    if L not in _X:
        _X[L] = torch.randn(B, L, H * D, generator=torch.Generator().manual_seed(7))
    return _X[L]


_X: dict = {}


def inputs(L: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3)]


def fwd_bwd(fn, q, k, v) -> float:
    t0 = time.process_time()
    fn(q, k, v).sum().backward()
    dt = time.process_time() - t0
    for t in (q, k, v):
        t.grad = None
    return dt


def timing(L: int, window: int, repeats: int, names: list) -> dict:
    fns = variants(window)
    q, k, v = inputs(L)
    times = {n: [] for n in names}
    for r in range(repeats + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            dt = fwd_bwd(fns[n], q, k, v)
            if r:  # the first repeat warms up
                times[n].append(dt)
    return {n: statistics.median(ts) * 1000 for n, ts in times.items()}


def rss() -> int:
    """This process's resident set now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_child(name: str, L: int, window: int) -> None:
    """(child process) the rise of the resident set over the inputs during one forward + backward, in
    MiB, sampled every millisecond by a thread (large tensors are mapped and unmapped as they live)."""
    fn = variants(window)[name]
    q, k, v = inputs(L)
    fwd_bwd(fn, *inputs(256, seed=1))  # allocator and kernels warmed on a small input
    base, top, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            top[0] = max(top[0], rss())
            time.sleep(0.001)

    th = threading.Thread(target=sample)
    th.start()
    fwd_bwd(fn, q, k, v)
    done.set()
    th.join()
    print(json.dumps({"peak_mib": max(0, top[0] - base) / 2**20}))


def peak(name: str, L: int, window: int, threads: int) -> float:
    out = subprocess.run([sys.executable, "-m", "benchmarks.windows", "--peak-child", name, "--length", str(L),
                          "--window", str(window), "--threads", str(threads)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def cache_bytes(cache) -> int:
    return sum(b.numel() * b.element_size() for b in cache._buf.values())


def decode(scheme: str, params: dict, total: int, marks: list[int], span: int = 256) -> dict:
    """Decode ``total`` tokens one at a time; per mark, the median ms per token over the ``span``
    tokens before it and the cache's bytes there."""
    mod = compile_scheme(SCHEMES / f"{scheme}.pe", params=params, num_heads=H, head_dim=D)
    g = torch.Generator().manual_seed(0)
    cache = mod.new_cache(B)
    out, times = {}, []
    with torch.no_grad():
        for t in range(total):
            q, k, v = (torch.randn(B, H, 1, D, generator=g) for _ in range(3))
            t0 = time.process_time()
            mod(q, k, v, cache=cache)
            times.append(time.process_time() - t0)
            if t + 1 in marks:
                out[t + 1] = (statistics.median(times[-span:]) * 1000, cache_bytes(cache), len(cache))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", type=int, default=32768)
    ap.add_argument("--contrast", type=int, default=8192,
                    help="plain rope (a cache that grows, each token slower) decodes this many tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", default="timing,decode", help="timing (with peak memory), decode")
    ap.add_argument("--variants", default=None,
                    help="comma-separated variant names to time (default all; the ratios need 'full causal', "
                         "'windowed floor', 'pedsl rope_local', 'pedsl path (full)' where they are printed)")
    ap.add_argument("--peak-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    setup_torch(a.threads)
    if a.peak_child:
        return peak_child(a.peak_child, a.length, a.window)
    L, N = a.length, a.window
    parts = set(a.parts.split(","))
    if "timing" in parts:
        report_timing(L, N, a.repeats, a.threads, a.variants.split(",") if a.variants else list(variants(N)))
    if "decode" in parts:
        report_decode(N, a.decode, a.contrast)


def report_timing(L: int, N: int, repeats: int, threads: int, names: list) -> None:
    t0 = time.perf_counter()
    built = band_kernel.band_ops() is not None  # built (or loaded from torch's extensions folder) before timing
    print(f"sliding windows in process: {'the C++ kernel' if built else 'the flash path (the C++ kernel did not build)'}"
          f", ready in {time.perf_counter() - t0:.1f} s")
    ms = timing(L, N, repeats, names)
    peaks = {n: peak(n, L, N, threads) for n in ms}
    print(f"Windowed attention, forward + backward (process CPU ms), float32 CPU, B={B} H={H} D={D} L={L} window={N}, "
          f"{threads} thread(s), median of {repeats}")
    print("| variant | fwd+bwd ms | / full causal | / windowed floor | peak MiB over inputs |")
    print("|---|---|---|---|---|")
    for n, t in ms.items():
        print(f"| {n} | {t:.1f} | {ratio(t, ms.get('full causal'), '.3f')} | {ratio(t, ms.get('windowed floor'))} | "
              f"{peaks[n]:.0f} |")
    if {"full causal", "windowed floor", "pedsl rope_local"} <= set(ms):
        print(f"speed-up of pedsl over full causal: {ms['full causal'] / ms['pedsl rope_local']:.1f}x "
              "(target >= 5x); pedsl / windowed floor: "
              f"{ms['pedsl rope_local'] / ms['windowed floor']:.2f} (target <= 1.5)")
    if {"windowed floor", "pedsl path (full)", "pedsl path + window"} <= set(ms):
        t, full = ms["pedsl path + window"], ms["pedsl path (full)"]
        mib, full_mib = peaks["pedsl path + window"], peaks["pedsl path (full)"]
        print(f"PaTH inside the window: {t:.0f} ms, {t / ms['windowed floor']:.2f}x the windowed floor, "
              f"{t / full:.3f}x full PaTH's time ({full / t:.1f}x faster); peak {mib:.0f} MiB over the inputs "
              f"against full PaTH's {full_mib:.0f} MiB ({mib / full_mib:.2f}x)")


def ratio(t: float, base, fmt: str = ".2f") -> str:
    return "-" if base is None else format(t / base, fmt)


def report_decode(N: int, total: int, contrast: int) -> None:
    print(f"\nDecoding one token at a time to {total} tokens (B={B} H={H} D={D}, float32; process CPU ms per "
          "token: median of the 256 tokens before the mark)")
    print("| scheme | tokens | ms / token | cache MiB | tokens held |")
    print("|---|---|---|---|---|")
    for scheme, params, n in (("rope_local", {"width": N}, total), ("rope", {}, min(contrast, total))):
        marks = sorted({min(1024, n), min(4096, n), n})
        for m, (t, nbytes, held) in decode(scheme, params, n, marks).items():
            print(f"| {scheme} | {m} | {t:.3f} | {nbytes / 2**20:.2f} | {held} |")


if __name__ == "__main__":
    main()
