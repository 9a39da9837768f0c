"""Decode-step benchmark: one new token against a cache of N tokens, every scheme next to SDPA.

    python -m benchmarks.decode [SCHEME...] [--cache 4096,16384] [--repeats 7] [--threads 1] [--md FILE] [--general] [--own-floor]

For each cache length, in one process and interleaved (every repeat runs each variant once, the
starting variant rotating), under ``no_grad``:

* ``floor``: SDPA decode with the same cache and no positional encoding: the new k, v written into a
  preallocated (B, H, capacity, D) buffer (capacity the next power of two, as the module's cache
  buffers: page-aligned heads read measurably faster than a (B, H, N+1, D) tensor), then
  ``F.scaled_dot_product_attention(q, K[:N+1], V[:N+1])``;
* each scheme: ``module(q, k, v, x=x, tokens=tokens, cache=cache)`` on one token;
* ``floor@NAME`` (``--own-floor``, RoPE family): the floor's work on that module's own cache
  buffers; the scheme's row then also gives its ratio to it. Two buffers of the same shape and
  contents can differ by 10-15% in SDPA time on a shared machine (memory placement), which this
  removes from the comparison.

A timed sample is 32 consecutive decode steps (the cache grows from N to N + 32 tokens; PaTH's
pending steps are applied to every cached key once in 32 tokens, so this includes that cost);
``step ms`` is a sample's time / 32.

The cache is made by a real 8-token prefill, then its key/value buffers are extended with random
keys to N tokens (a decode step's cost does not depend on the cached values; a real 16k-token
prefill takes minutes on 2 cores). After every timed sample the cache is cut back to N tokens outside
the timer. The ratio column is the median over repeats of (scheme time / floor time in the same
repeat). Default shape B=4, H=8, D=64, float32, CPU; clock: process CPU time with one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from pedsl.compiler import compile_scheme

DEFAULT = ("rope", "yarn", "rope_id", "acc_random_qk", "acc_random_qkv", "acc_learned_qk", "alibi", "fox", "path",
           "path_fox")
FAMILY = {"rope": "RoPE", "yarn": "RoPE", "rope_id": "RoPE", "acc_random_qk": "SO(2)", "acc_random_qkv": "SO(2)",
          "acc_learned_qk": "SO(2)", "alibi": "bias", "fox": "bias", "path": "PaTH", "path_fox": "PaTH"}
TARGET = {"RoPE": 1.10, "SO(2)": 1.25, "bias": 1.25, "PaTH": 3.0}
STEPS = 32  # decode steps per timed sample (PaTH applies its pending steps to the cache every 32 tokens)


def _fill(mod, cache, N, B, H, D, d_model, g):
    """A real 8-token prefill, then random keys up to N tokens."""
    P = 8
    q, k, v = (torch.randn(B, H, P, D, generator=g) for _ in range(3))
    x = torch.randn(B, P, d_model, generator=g) if mod.needs_x else None
    tok = torch.randint(0, 256, (B, P), generator=g) if mod.needs_tokens else None
    mod(q, k, v, x=x, tokens=tok, cache=cache)
    n = N - P
    Hk = cache.heads_kv
    cache.put("k", torch.randn(B, Hk, n, D, generator=g) * 0.3, P)
    cache.put("v", torch.randn(B, Hk, n, D, generator=g), P)
    cache.put("pos", torch.arange(P, N).expand(B, n).contiguous(), P)
    cache.put("doc", torch.zeros(B, n, dtype=torch.long), P)
    cache.put("valid", torch.ones(B, n, dtype=torch.bool), P)
    if "coord" in cache._buf:
        c = cache._buf["coord"][:, :, P - 1: P].to(torch.float64)
        cache.put("coord", c - 0.05 * torch.arange(1, n + 1, dtype=torch.float64).expand(B, 1, n), P)
    cache.length = N
    cache.last_pos = torch.full((B,), N - 1, dtype=torch.long)


def run(schemes, caches, *, B=4, H=8, D=64, repeats=7, threads=1, general=False, own_floor=False):
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    clock = time.process_time if threads == 1 else time.perf_counter
    d_model = H * D
    rows = []
    for N in caches:
        g = torch.Generator().manual_seed(N)
        steps = {}
        # floor: SDPA decode over a preallocated cache
        cap = 1 << (N + STEPS).bit_length()  # preallocated like a static cache (and like the module's doubling buffers)
        Kb, Vb = torch.randn(B, H, cap, D, generator=g), torch.randn(B, H, cap, D, generator=g)
        q1, k1, v1 = (torch.randn(B, H, 1, D, generator=g) for _ in range(3))

        def floor():
            for s in range(N, N + STEPS):
                Kb[:, :, s: s + 1].copy_(k1)
                Vb[:, :, s: s + 1].copy_(v1)
                o = F.scaled_dot_product_attention(q1, Kb[:, :, : s + 1], Vb[:, :, : s + 1])
            return o

        steps["floor"] = (floor, lambda: None)
        variants = [(n, False) for n in schemes]
        if general:  # the same schemes with the one-token fast path switched off (the general stream_forward)
            variants += [(n, True) for n in schemes if FAMILY.get(n) == "RoPE"]
        for name, slow in variants:
            mod = compile_scheme(name, num_heads=H, head_dim=D, d_model=d_model, requires_grad=False)
            if slow:
                mod._fast_decode = False  # pedsl.compiler.stream.decode_step declines: general path
            cache = mod.new_cache(B)
            with torch.no_grad():
                _fill(mod, cache, N, B, H, D, d_model, g)
            x1 = torch.randn(B, 1, d_model, generator=g) if mod.needs_x else None
            t1 = torch.randint(0, 256, (B, 1), generator=g) if mod.needs_tokens else None
            saved = (dict(cache.angles), dict(cache.gates), cache.window, cache.last_pos, cache.last_doc)

            def step(mod=mod, cache=cache, x1=x1, t1=t1):
                for _ in range(STEPS):
                    o = mod(q1, k1, v1, x=x1, tokens=t1, cache=cache)
                return o

            def reset(cache=cache, saved=saved):
                cache.length = N
                cache.angles, cache.gates, cache.window, cache.last_pos, cache.last_doc = (
                    dict(saved[0]), dict(saved[1]), saved[2], saved[3], saved[4])
                cache.path_pending = cache.path_flushed = None

            steps[name + ("/general" if slow else "")] = (step, reset)
            if own_floor and not slow and FAMILY.get(name) == "RoPE":
                with torch.no_grad():  # grow the cache buffers past N + STEPS once, outside the timer
                    step()
                reset()

                def floor_own(cache=cache):  # the floor's work on this module's own cache buffers
                    Kc, Vc = cache._buf["k"], cache._buf["v"]
                    for s in range(N, N + STEPS):
                        Kc[:, :, s: s + 1].copy_(k1)
                        Vc[:, :, s: s + 1].copy_(v1)
                        o = F.scaled_dot_product_attention(q1, Kc[:, :, : s + 1], Vc[:, :, : s + 1])
                    return o

                steps["floor@" + name] = (floor_own, lambda: None)
        times = {n: [] for n in steps}
        names = list(steps)
        with torch.no_grad():
            for r in range(repeats + 1):
                for i in range(len(names)):
                    n = names[(i + r) % len(names)]
                    fn, reset = steps[n]
                    t0 = clock()
                    fn()
                    dt = clock() - t0
                    reset()
                    if r:
                        times[n].append(dt)
        for n in names:
            ratio = statistics.median(t / f for t, f in zip(times[n], times["floor"]))
            own = times.get("floor@" + n)
            own = None if own is None else statistics.median(t / f for t, f in zip(times[n], own))
            rs = sorted(t / f for t, f in zip(times[n], times["floor"]))
            fam = FAMILY.get(n.split("/")[0], "-")
            rows.append(dict(cache=N, scheme=n, ms=1e3 * statistics.median(times[n]) / STEPS, ratio=ratio,
                             lo=rs[0], hi=rs[-1], family=fam, target=TARGET.get(fam, None), own=own))
            tail = "" if own is None else f"  vs floor on its own cache buffers {own:5.2f}"
            print(f"N={N:6d} {n:20s} {rows[-1]['ms']:8.2f} ms  ratio {ratio:5.2f} ({rs[0]:.2f}-{rs[-1]:.2f}){tail}",
                  flush=True)
    return rows


def markdown(rows) -> str:
    own = any(r.get("own") is not None for r in rows)
    extra = " ratio to SDPA on its own cache buffers |" if own else ""
    out = ["| cache | scheme | family | step ms | ratio to SDPA decode | min-max over repeats | target |" + extra,
           "|---:|---|---|---:|---:|---:|---:|" + ("---:|" if own else "")]
    for r in rows:
        tgt = "" if r["target"] is None else f"<= {r['target']:.2f}"
        cell = "" if not own else (" |" if r.get("own") is None else f" {r['own']:.2f} |")
        out.append(f"| {r['cache']} | {r['scheme']} | {r['family']} | {r['ms']:.2f} | {r['ratio']:.2f} | "
                   f"{r['lo']:.2f}-{r['hi']:.2f} | {tgt} |" + cell)
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=list(DEFAULT))
    ap.add_argument("--cache", default="4096,16384", help="cache lengths, comma-separated")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--md", default=None, help="also write the table to this Markdown file")
    ap.add_argument("--general", action="store_true",
                    help="also time each RoPE-family scheme with the one-token fast path off (NAME/general)")
    ap.add_argument("--own-floor", action="store_true",
                    help="also time the floor on each RoPE-family module's own cache buffers (floor@NAME) and "
                    "report the scheme against it (removes the buffers' memory-placement effect)")
    a = ap.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = run(a.schemes, [int(c) for c in a.cache.split(",") if c], B=a.batch, repeats=a.repeats,
               threads=a.threads, general=a.general, own_floor=a.own_floor)
    table = markdown(rows) + f"\n\nB={a.batch}, H=8, D=64, float32, {a.threads} thread(s), {a.repeats} repeats; " \
        f"load average {load:.1f} at the start ({os.cpu_count()} CPUs).\n"
    print()
    print(table)
    if a.md:
        from pedsl.fsio import atomic_write_text

        atomic_write_text(a.md, table)


if __name__ == "__main__":
    main()
