"""Training throughput of the same model with different schemes, as a ratio to no PE.

    python benchmarks/train_throughput.py [SCHEME ...] [--preset tiny] [--steps 10] [--rounds 3]

A SCHEME is a .pe path or ``nope`` (the built-in causal SDPA floor, the default baseline).
Every scheme trains the same model (same preset, seed, batch) for ``steps`` optimizer steps
(forward, backward, clipping, AdamW) per round; rounds interleave the schemes so a noisy,
shared machine slows them alike; the median and the best (min) step time are reported, and the
ratio uses the best (the least disturbed by other processes). Figures are ratios
measured in one run (the issue's target: RoPE within 1.2x of NoPE on the tiny preset).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def build(name: str, cfg):
    from pedsl.model import TransformerLM
    from pedsl.train.recipe import from_scheme, nope
    from pedsl.train.loop import make_optimizer

    attn = nope() if name == "nope" else from_scheme(cfg.model_copy(update={"scheme": name}))
    torch.manual_seed(0)
    model = TransformerLM(cfg.model, attn.factory(cfg.model))
    return model, make_optimizer(model, cfg)


def step(model, optim, batch, clip: float) -> None:
    loss = model.loss(batch)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optim.step()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("schemes", nargs="*", default=["nope", "schemes/nope.pe", "schemes/rope.pe", "schemes/alibi.pe"])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = ap.parse_args(argv)

    from pedsl.config import resolve_train_config

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    cfg = resolve_train_config(overrides={"preset": args.preset, "context": args.context,
                                          "batch_size": args.batch_size})
    batch = torch.randint(0, 256, (cfg.batch_size, cfg.context + 1), generator=torch.Generator().manual_seed(0))
    names = list(dict.fromkeys(["nope", *args.schemes]))
    runs = {}
    for n in names:
        model, optim = build(n, cfg)
        for _ in range(2):  # warm-up (allocations, lazy tables)
            step(model, optim, batch, cfg.grad_clip)
        runs[n] = (model, optim)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            model, optim = runs[n]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(model, optim, batch, cfg.grad_clip)
            times[n].append((time.perf_counter() - t0) / args.steps)
    tokens = cfg.batch_size * cfg.context
    base = min(times["nope"])
    print(f"preset {args.preset}: {cfg.model.n_layers} layers, d_model {cfg.model.d_model}, context {cfg.context}, "
          f"batch {cfg.batch_size}, threads {torch.get_num_threads()}, {args.rounds} rounds x {args.steps} steps")
    print(f"{'scheme':<28}{'median ms':>10}{'best ms':>10}{'tokens/s':>12}{'vs nope':>10}")
    for n in names:
        t, med = min(times[n]), statistics.median(times[n])
        print(f"{n:<28}{med * 1e3:>10.1f}{t * 1e3:>10.1f}{tokens / t:>12.0f}{t / base:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
