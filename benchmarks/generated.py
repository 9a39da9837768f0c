"""Generated modules against in-process modules: forward + backward time of the module ``pedsl compile`` writes
and of ``compile_scheme``'s, against the no-PE floor, one row per library scheme family.

    python -m benchmarks.generated [SCHEME...] [--lengths 2048] [--repeats 3] [--threads N]
                                   [--clock auto|wall|cpu] [--md FILE] [--json FILE]

Variants, run interleaved in one process by :func:`benchmarks.measure.interleaved` (each repeat runs every
variant once, the first variant rotating; one warm-up repeat dropped); ratios are medians over repeats of
variant / floor (and generated / in-process) in the same repeat:

- ``floor``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` - no positional encoding;
- ``in-process``: ``compile_scheme(<scheme>)`` called as ``module(q, k, v)`` (``x=`` where it reads the hidden
  state);
- ``generated``: the module ``pedsl compile`` writes for the same scheme (:func:`pedsl.compiler.codegen.generate`),
  imported from a file, with the in-process module's weights (``load_state_dict``): it carries the C++ kernels'
  sources and loader, and loads the build pedsl in process uses.

Gradients flow to q, k, v (and x) and every learned parameter. Shape B=1, H=8, D=64, float32. Before timing,
each row checks that the two modules give the same output (float32: within 1e-4) and says which C++ kernels
the generated one loaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import Variant, interleaved
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.fsio import atomic_write_text

#: One scheme per family: the RoPE family, xPos, ALiBi, FoX, the distance tables (T5, KERPLE, Sandwich), FIRE,
#: PaTH (and PaTH-FoX), a sliding window, chunks, a sink.
SCHEMES = ("rope", "xpos", "alibi", "fox", "t5_bias", "kerple_log", "sandwich", "fire", "path", "path_fox",
           "rope_local", "rope_chunked", "rope_sink")
B, H, D, D_MODEL = 1, 8, 64, 128


def load_generated(mod, folder: Path):
    """The module ``pedsl compile`` writes for ``mod``'s scheme, imported from ``folder``, with ``mod``'s weights;
    and the imported Python module."""
    path = folder / f"gen_{mod.scheme.name}.py"
    atomic_write_text(path, generate(mod.scheme, mod.plan, d_model=D_MODEL if mod.needs_x else None))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module()
    gen.load_state_dict(mod.state_dict())
    return gen, module


def _variants(name: str, L: int, folder: Path) -> tuple[list[Variant], str]:
    """The floor, the in-process and the generated module of one scheme at one length; which kernels loaded."""
    torch.manual_seed(0)  # FIRE's time depends on where its MLP's kinks fall: the same weights every run
    mod = compile_scheme(name, num_heads=H, head_dim=D, d_model=D_MODEL)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
    kw = {}
    if mod.needs_x:
        kw["x"] = torch.randn(B, L, D_MODEL, generator=g).requires_grad_(True)
    if mod.needs_tokens:
        kw["tokens"] = torch.randint(0, 256, (B, L), generator=g)
    gen, module = load_generated(mod, folder)
    leaves = [q, k, v, *[t for t in kw.values() if t.is_floating_point()]]
    with torch.no_grad():
        gap = float((gen(q, k, v, **kw) - mod(q, k, v, **kw)).abs().max())
    assert gap < 1e-4, (name, gap)
    state = getattr(module, "state", lambda: None)()  # after a call: the first one loads (or builds) them
    loaded = "yes" if state and state.loaded else f"no ({state.reason})" if state else "none carried"
    return [Variant("floor", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v]),
            Variant("in-process", lambda: mod(q, k, v, **kw), leaves + list(mod.parameters())),
            Variant("generated", lambda: gen(q, k, v, **kw), leaves + list(gen.parameters()))], loaded


def measure(name: str, L: int, repeats: int, clock: str, folder: Path) -> dict:
    variants, loaded = _variants(name, L, folder)
    stats = interleaved(variants, repeats=repeats, clock=clock)
    times = {n: s["total"]["times"] for n, s in stats.items()}
    return {"scheme": name, "L": L, "kernels_loaded": loaded,
            "ms": {n: 1000 * s["total"]["median"] for n, s in stats.items()},
            "ratio": {n: s["total"]["ratio"] for n, s in stats.items()},
            "generated_over_in_process": statistics.median(a / b for a, b in zip(times["generated"],
                                                                                   times["in-process"])),
            "times": times}


def table(rows: list[dict]) -> str:
    out = ["| scheme | L | floor ms | in-process ms | generated ms | in-process / floor | generated / floor | "
           "**generated / in-process** | C++ kernels loaded |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, q = r["ms"], r["ratio"]
        out.append(f"| {r['scheme']} | {r['L']} | {m['floor']:.0f} | {m['in-process']:.0f} | {m['generated']:.0f} | "
                   f"{q['in-process']:.2f} | {q['generated']:.2f} | **{r['generated_over_in_process']:.2f}** | "
                   f"{r['kernels_loaded']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=list(SCHEMES))
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="auto: process CPU time with one thread, wall time otherwise (benchmarks/README.md)")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    clock = a.clock if a.clock != "auto" else ("cpu" if torch.get_num_threads() == 1 else "wall")
    torch.set_flush_denormal(True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python -m benchmarks.generated", *(sys.argv[1:] if argv is None else argv)]),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "clock": clock, "repeats": a.repeats,
            "shape": {"B": B, "H": H, "D": D}, "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(s, int(L), a.repeats, clock, Path(tmp)) for L in a.lengths.split(",") for s in a.schemes]
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
