"""The benchmark runner: every scheme against the floor and the usual code, in one process.

    python -m benchmarks                              # default schemes, L = 512, 2048; scaling to 8192
    python -m benchmarks rope alibi --lengths 512,2048 --repeats 5 --json out.json
    python -m benchmarks rope alibi --lengths 2048 --forward-only

For every length and scheme the variants (floor, hand-written, pedsl eager, pedsl compiled with
``--compile``) are timed interleaved (see :mod:`benchmarks.measure`), forward and forward +
backward, with the peak extra memory of one forward + backward. Then: the PaTH naive reference
at small L extrapolated by L^2, a scaling table (floor, RoPE, ALiBi, PaTH vs L), the front-end
time (check + lower) and, with ``--compile``, the first / cached ``torch.compile`` time measured
in fresh subprocesses. Results go to JSON and Markdown (:mod:`benchmarks.report`).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SCHEMES_DIR = ROOT / "schemes"
DEFAULT_SCHEMES = ("rope", "pi", "ntk", "yarn", "rope_id", "acc_random_qk", "acc_random_qkv", "acc_learned_qk",
                   "alibi", "fox", "path")
SCALING_SCHEMES = ("rope", "alibi", "path")


@dataclass
class Config:
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    lengths: tuple[int, ...] = (512, 2048)
    scaling_lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    scaling_backward: bool = False
    B: int = 4
    H: int = 8
    D: int = 64
    repeats: int = 5
    backward: bool = True  # also time forward + backward (forward alone is always timed)
    compile: bool = False
    compile_time_schemes: tuple[str, ...] = ("rope",)
    flush_denormal: bool = True
    threads: int = 0
    clock: str = "auto"  # wall | cpu | auto (cpu when running one torch thread, else wall)
    mem_cap_gb: float = 4.0
    naive_lengths: tuple[int, ...] = (32, 64)
    memory: bool = True
    json_path: str | None = None
    md_path: str | None = None
    command: str = ""
    verbose: bool = True
    extra: dict = field(default_factory=dict)


def log(cfg: Config, msg: str) -> None:
    if cfg.verbose:
        print(msg, file=sys.stderr, flush=True)


def scheme_path(name: str) -> Path:
    """A .pe path or a library name (pedsl's one rule); an unknown name gives a path that does not exist."""
    from pedsl.errors import CheckError
    from pedsl.lang.library import scheme_file

    try:
        return scheme_file(name)
    except CheckError:
        return SCHEMES_DIR / f"{name}.pe"


def compile_module(name: str, cfg: Config, compile_: bool = False):
    from pedsl.compiler import compile_scheme

    return compile_scheme(str(scheme_path(name)), head_dim=cfg.D, num_heads=cfg.H, d_model=cfg.H * cfg.D,
                          compile=compile_)


def _reps(cfg: Config, L: int) -> int:
    """Fewer repeats at long lengths (each call is ~16x longer at 4x the length)."""
    return max(2, cfg.repeats // 2) if L >= 8192 else cfg.repeats


def time_case(case, cfg: Config) -> dict:
    from benchmarks.measure import interleaved, peak_extra_bytes

    reps = _reps(cfg, case.L)
    res: dict = {"family": case.family, "skipped": case.skipped, "variants": {}}
    st = interleaved(case.variants, repeats=reps, backward=cfg.backward, grad_out=case.grad_out, clock=cfg.clock)
    for v in case.variants:
        f, t = st[v.name]["fwd"], st[v.name]["total"]
        r = {"fwd_ms": 1e3 * f["median"], "fwd_ratio": f["ratio"], "fwd_times_ms": [1e3 * x for x in f["times"]]}
        if cfg.backward:
            r.update(fwdbwd_ms=1e3 * t["median"], fwdbwd_ratio=t["ratio"],
                     fwdbwd_times_ms=[1e3 * x for x in t["times"]])
        if cfg.memory:
            r["peak_extra_mib"] = peak_extra_bytes(v, cfg.backward, case.grad_out) / 2**20
        res["variants"][v.name] = r
    return res


def naive_path(cfg: Config) -> dict:
    """path_attention_naive fwd+bwd at small L (median of 2), for the L^2 extrapolation."""
    from benchmarks.cases import make_inputs
    from benchmarks.measure import Variant, interleaved
    from pedsl.ops.path import path_attention_naive

    mod = compile_module("path", cfg)
    out = {}
    for L in cfg.naive_lengths:
        q, k, v, x, tokens, go = make_inputs(cfg.B, cfg.H, L, cfg.D, cfg.H * cfg.D)
        fn = lambda: path_attention_naive(  # noqa: E731
            q, k, v, *mod.householder_inputs(q.shape[0], L, x, tokens, q.device, q.dtype))
        st = interleaved([Variant("naive", fn, [q, k, v])], repeats=2, backward=cfg.backward, grad_out=go,
                         clock=cfg.clock)
        out[L] = 1e3 * st["naive"]["total"]["median"]
    return out


def frontend_times(cfg: Config, n: int = 20) -> dict:
    """check + lower (pedsl.lang.api.load + compile_graph) per scheme, in-process, median of n after one warm-up."""
    from pedsl.compiler import compile_graph
    from pedsl.lang.api import load

    res = {}
    for name in cfg.schemes:
        path = str(scheme_path(name))
        t0 = time.perf_counter()
        compile_graph(load(path, heads=cfg.H, head_dim=cfg.D))
        if not res:  # the process's first scheme: includes building (or unpickling) the LALR parser
            res["(first call)"] = 1e3 * (time.perf_counter() - t0)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            compile_graph(load(path, heads=cfg.H, head_dim=cfg.D))
            ts.append(time.perf_counter() - t0)
        res[name] = 1e3 * statistics.median(ts)
    return res


def compile_times(cfg: Config) -> dict:
    """First and cached torch.compile time per scheme (fresh subprocesses sharing a new inductor cache)."""
    import subprocess
    import tempfile

    res = {}
    for name in cfg.compile_time_schemes:
        with tempfile.TemporaryDirectory(prefix="pedsl-inductor-") as cache:
            # compile in-process (no worker pool) so that the CPU seconds of this process and its finished
            # children (the C++ compiler) cover all the compile work
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
            runs = []
            for _ in range(2):
                cmd = [sys.executable, "-m", "benchmarks.compile_time", str(scheme_path(name)), "--L", "512",
                       "--H", str(cfg.H), "--D", str(cfg.D)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
                if p.returncode != 0:
                    runs.append({"error": p.stderr.strip().splitlines()[-1:] or ["failed"]})
                    break
                runs.append({k: float(v) for k, v in (kv.split("=") for kv in p.stdout.split())})
            res[name] = {"first": runs[0], "cached": runs[1] if len(runs) > 1 else None}
    return res


def scaling(cfg: Config) -> dict:
    from benchmarks.cases import build_case
    from benchmarks.measure import Variant, interleaved

    mods = {s: compile_module(s, cfg) for s in SCALING_SCHEMES}
    out = {}
    for L in cfg.scaling_lengths:
        variants, go = [], None
        for s, mod in mods.items():
            case = build_case(s, mod, None, B=cfg.B, H=cfg.H, L=L, D=cfg.D, d_model=cfg.H * cfg.D, hand=False)
            if not variants:
                variants.append(case.variants[0])
                go = case.grad_out
            pv = case.variants[-1]
            variants.append(Variant(s, pv.run, pv.leaves, "pedsl"))
        log(cfg, f"  scaling L={L} ({'fwd+bwd' if cfg.scaling_backward else 'fwd'})")
        st = interleaved(variants, repeats=_reps(cfg, L) if L < 8192 else 2, backward=cfg.scaling_backward,
                         grad_out=go, clock=cfg.clock)
        out[L] = {n: {"ms": 1e3 * r["total"]["median"], "ratio": r["total"]["ratio"]} for n, r in st.items()}
    return out


def meta(cfg: Config) -> dict:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": cfg.command,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "shape": {"B": cfg.B, "H": cfg.H, "D": cfg.D, "dtype": "float32"},
        "repeats": cfg.repeats,
        "flush_denormal": cfg.flush_denormal,
        "clock": cfg.clock,
        "loadavg_start": os.getloadavg(),
    }


def run(cfg: Config) -> dict:
    from benchmarks.cases import agreement, build_case

    torch.set_flush_denormal(cfg.flush_denormal)  # the application owns this (docs/semantics.md §6)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.clock == "auto":
        cfg.clock = "cpu" if torch.get_num_threads() == 1 else "wall"
    torch.manual_seed(0)
    results: dict = {"meta": meta(cfg), "cases": {}, "agreement": {}}
    t_start = time.perf_counter()
    log(cfg, f"front end: check + lower x{len(cfg.schemes)}")
    results["frontend_ms"] = frontend_times(cfg)
    mods = {s: compile_module(s, cfg) for s in cfg.schemes}
    cmods = {s: compile_module(s, cfg, compile_=True) for s in cfg.schemes} if cfg.compile else {}
    for s, cm in cmods.items():  # the same learned parameters: both compute one function
        cm.load_state_dict(mods[s].state_dict())
    for s, mod in mods.items():  # all variants compute the same function (small L, forward)
        case = build_case(s, mod, cmods.get(s), B=2, H=cfg.H, L=64, D=cfg.D, d_model=cfg.H * cfg.D)
        results["agreement"][s] = agreement(case)
    for L in cfg.lengths:
        for s in cfg.schemes:
            case = build_case(s, mods[s], cmods.get(s), B=cfg.B, H=cfg.H, L=L, D=cfg.D, d_model=cfg.H * cfg.D,
                              mem_cap_gb=cfg.mem_cap_gb)
            t0 = time.perf_counter()
            results["cases"].setdefault(str(L), {})[s] = time_case(case, cfg)
            log(cfg, f"  L={L} {s}: {time.perf_counter() - t0:.0f}s  " + _brief(results["cases"][str(L)][s]))
            del case
    if "path" in cfg.schemes or "path_fox" in cfg.schemes:
        log(cfg, "PaTH naive reference at small L")
        results["path_naive_ms"] = naive_path(cfg)
    if cfg.scaling_lengths:
        results["scaling"] = scaling(cfg)
        results["scaling_backward"] = cfg.scaling_backward
    if cfg.compile and cfg.compile_time_schemes:
        log(cfg, f"compile times ({', '.join(cfg.compile_time_schemes)}) in subprocesses")
        results["compile_s"] = compile_times(cfg)
    results["meta"]["loadavg_end"] = os.getloadavg()
    results["meta"]["total_s"] = time.perf_counter() - t_start
    return results


def _brief(r: dict) -> str:
    key = "fwdbwd_ratio" if any("fwdbwd_ratio" in v for v in r["variants"].values()) else "fwd_ratio"
    return "  ".join(f"{n}={v[key]:.2f}x" for n, v in r["variants"].items() if v.get(key) is not None)


def main(cfg: Config) -> dict:
    from benchmarks.report import markdown, write

    res = run(cfg)
    md = markdown(res)
    write(res, md, cfg.json_path, cfg.md_path)
    print(md)
    return res
