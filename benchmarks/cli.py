"""``python -m benchmarks [SCHEMES...]``: time compiled schemes against the attention floor and the usual code.

A development tool of the source tree (its hand-written baselines are not part of the pedsl
package): run it from a checkout. See benchmarks/README.md.
"""

from __future__ import annotations

import sys

import click

from benchmarks import runner
from pedsl import limits as L


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.UsageError(f"{what} expects comma-separated integers (e.g. 512,2048), got '{text}'") from None
    if any(v < 8 for v in vals):
        raise click.UsageError(f"{what}: lengths must be >= 8, got '{text}'")
    if any(v > L.MAX_LENGTH for v in vals) or len(vals) > L.MAX_LIST:
        raise click.UsageError(f"{what}: at most {L.MAX_LIST} lengths of at most {L.MAX_LENGTH:,} tokens, "
                               f"got '{text[:80]}' (see pedsl/limits.py)")
    return vals


@click.command("bench")
@click.argument("schemes", nargs=-1, metavar="[SCHEME...]")
@click.option("--lengths", default="512,2048", show_default=True, help="Sequence lengths of the main table.")
@click.option("--scaling-lengths", default="512,1024,2048,4096,8192", show_default=True,
              help="Lengths of the scaling table (floor, RoPE, ALiBi, PaTH); empty to skip it.")
@click.option("--scaling-backward/--scaling-forward", default=False, show_default=True,
              help="Time the scaling table forward + backward (slow at 8192 on 2 cores) or forward only.")
@click.option("--backward/--forward-only", default=True, show_default=True,
              help="Also time forward + backward (forward alone is always timed).")
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Timed interleaved repeats (after one warm-up); halved at L >= 8192.")
@click.option("--compile", "compile_", is_flag=True, help="Also time pedsl with torch.compile and measure compile time.")
@click.option("--compile-time", "compile_time", default="rope", show_default=True,
              help="Schemes whose first/cached torch.compile time is measured (with --compile).")
@click.option("--flush-denormal/--no-flush-denormal", default=True, show_default=True,
              help="torch.set_flush_denormal for the whole run (docs/semantics.md §6).")
@click.option("-B", "--batch", "B", type=click.IntRange(1, L.MAX_BATCH), default=4, show_default=True)
@click.option("-H", "--heads", "H", type=click.IntRange(1, L.MAX_HEADS), default=8, show_default=True)
@click.option("-D", "--head-dim", "D", type=click.IntRange(2, L.MAX_HEAD_DIM), default=64, show_default=True)
@click.option("--threads", type=click.IntRange(0, L.MAX_THREADS), default=0, help="torch CPU threads (0: torch default).")
@click.option("--clock", type=click.Choice(["auto", "wall", "cpu"]), default="auto", show_default=True,
              help="wall: perf_counter; cpu: process CPU time (robust on a shared machine with --threads 1); "
              "auto: cpu with one thread, else wall.")
@click.option("--mem-cap-gb", type=float, default=4.0, show_default=True,
              help="Skip a hand-written baseline whose estimated memory exceeds this.")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results as JSON.")
@click.option("--md", "md_path", type=click.Path(dir_okay=False), default=None, help="Write the Markdown tables.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def bench(schemes, lengths, scaling_lengths, scaling_backward, backward, repeats, compile_, compile_time,
          flush_denormal, B, H, D, threads, clock, mem_cap_gb, no_memory, json_path, md_path, quiet):
    """Benchmark schemes (names in schemes/ or .pe paths; default: the RoPE family, accumulated
    rotations, ALiBi, FoX, PaTH) against the floor (causal SDPA, no PE) and hand-written code."""
    for s in schemes:
        if not runner.scheme_path(s).exists():
            raise click.UsageError(f"no scheme '{s}': give a name from schemes/ or a path to a .pe file "
                                   "(`pedsl list` shows the library)")
    cfg = runner.Config(
        schemes=tuple(schemes) or runner.DEFAULT_SCHEMES, lengths=_ints(lengths, "--lengths"),
        scaling_lengths=_ints(scaling_lengths, "--scaling-lengths"), scaling_backward=scaling_backward,
        B=B, H=H, D=D, repeats=repeats, backward=backward, compile=compile_,
        compile_time_schemes=tuple(t for t in compile_time.split(",") if t), flush_denormal=flush_denormal,
        threads=threads, clock=clock, mem_cap_gb=mem_cap_gb, memory=not no_memory, json_path=json_path, md_path=md_path,
        command=" ".join(["python -m benchmarks", *sys.argv[1:]]), verbose=not quiet)
    runner.main(cfg)
