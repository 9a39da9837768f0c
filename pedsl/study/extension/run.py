"""``pedsl compare --study extension``: context extension as practitioners do it.

One RoPE model is trained at ``L0`` (the default study's ``runs/rope``, reused when it is there),
then every method of the RoPE scaling family - pi, ntk, dynamic_ntk, yarn, llama3, longrope, the
remapped positions rerope, leaky_rerope, self_extend and dca (docs/semantics.md §2d), and plain rope as
the baseline -
is applied to its weights with the factor set for each target length (default 4x and 16x ``L0``):

(a) zero-shot: the trained weights evaluated under the method (:func:`pedsl.study.common.open_run`
    with ``scheme=``), at 1x to 32x ``L0``;
(b) fine-tuned (not the training-free methods of :data:`ZERO_SHOT_ONLY`): a short fine-tune at the target length from the same weights
    (:func:`pedsl.train.swap.init_config`; default ~10% of the base steps, the same tokens per step
    as the base run), then evaluated the same way.

Perplexity scores the same last ``L0`` bytes of the same validation windows at every length and
for every model, and every ratio is to the **base model's** perplexity at ``L0``: the ratio at 1x
is the in-distribution cost of the swap (or of the fine-tune).

The self-similarity test: the same swaps on a RoPE model trained on the ``blocks`` task (a letter
repeated at a fixed offset: the answer depends on an exact relative distance, ``block_len - 1 -
block_offset``), scored by accuracy at the block ends. Position interpolation maps that distance
to a fraction of itself; methods that keep the high frequencies (NTK, YaRN, Llama 3) should keep it.

Factors are set through scheme parameters looked up by name in each scheme's declared
``params``: ``factor`` (the extension factor) and, where declared, ``original`` /
``train_length`` (the base's training length). A method whose scheme lacks ``factor`` is an
error, except those in :data:`FIXED_OK` (a scheme that carries its own fixed factors), which are
then evaluated as they are, with a note in the report.

Layout (inside the study directory ``DIR``)::

    DIR/runs/rope/                            the base model (shared with the default study)
    DIR/extension/runs/rope_blocks/           the base model of the block task
    DIR/extension/runs/<task>.<method>.x<T>/  fine-tunes
    DIR/extension/evals/<task>.zs.<method>.<params>.json     zero-shot evaluations (reused when their key matches)
    DIR/extension/evals/<task>.ft.<method>.x<T>.json         evaluations of the fine-tunes
    DIR/extension/report.md, report.html, results.json, *.png, *.svg
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.config import TrainConfig
from pedsl.errors import ConfigError
from pedsl.study import driver
from pedsl.study.answers import blocks
from pedsl.study.common import make_dir, open_run, provenance, read_json, write_json, write_text
from pedsl.study.eval_run import validation_data
from pedsl.study.extension.report import page, plots
from pedsl.study.page import html_page, markdown
from pedsl.study.perplexity import perplexity
from pedsl.train.recipe import load_scheme
from pedsl.train.swap import init_config, init_record, scheme_path, suffix

METHODS = ("rope", "pi", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "rerope", "leaky_rerope",
           "self_extend", "dca")
FACTOR = "factor"
ORIGINAL = ("original", "train_length")   # set to the base's training length where the scheme declares them
FIXED_OK = ("longrope", "rerope", "dca")  # may carry fixed factors (no `factor` parameter)
# training-free by design (applied to a trained RoPE checkpoint as they are): evaluated zero-shot only
ZERO_SHOT_ONLY = ("rerope", "leaky_rerope", "self_extend", "dca")
TARGETS = (4, 16)
MULTIPLIERS = (1, 2, 4, 8, 16, 32)
BLOCK_MULTIPLIERS = (1, 4, 16)
WINDOWS = 8              # perplexity windows per length (the last L0 bytes of each are scored)
BLOCK_SAMPLES_PER_WINDOW = 2  # block-task sequences per length: 2 x windows (L0 / block_len answers each)
FT_FRACTION = 0.1        # fine-tune steps as a fraction of the base's
FT_LR = 1e-3             # fine-tune peak learning rate (the base peaks at 3e-3 and ends at 3e-4)
BLOCKS = {"data": "blocks", "data.block_len": 8, "data.block_offset": 0}  # answer: the letter 7 back
QUICK: dict[str, Any] = {  # the quick run's settings, of mixed types, read by key
    "steps": 150, "multipliers": (1, 2, 4, 8, 16), "windows": 2}
EVAL_SEED = 1234         # the same validation windows for every model, method and seed
VERSION = 1


def method_params(method: str, factor: int, L0: int) -> tuple[dict[str, Any], str | None]:
    """The parameters that set ``method`` for extension by ``factor`` from ``L0`` (looked up by name
    in the scheme's declared params), and a note when the scheme has fixed factors."""
    declared = load_scheme(scheme_path(method)).params
    params = {n: L0 for n in ORIGINAL if n in declared}
    if method == "rope":
        return params, None
    if FACTOR not in declared:
        if method in FIXED_OK:
            return params, (f"{method}: the scheme has no '{FACTOR}' parameter (its factors are fixed), "
                            "so it is the same model at every target")
        raise ConfigError(f"scheme '{method}' declares no parameter '{FACTOR}' to set the extension factor "
                          f"(it declares: {', '.join(sorted(declared)) or 'none'})",
                          hint=f"give {method}.pe a '{FACTOR}' parameter, or leave it out of the study")
    params[FACTOR] = factor
    return params, None


def _evaluate(run: Path, scheme: str | None, params: dict, task: str, lens: list[int], L0: int, n: int,
              seed: int, path: Path, say: Callable[[str], None]) -> dict:
    """Perplexity (text) or block accuracy of ``run`` under ``scheme``/``params``; reused from
    ``path`` when its key (weights, scheme, settings) matches."""
    sha = init_record(run)["model_sha256"]
    scheme_hash = load_scheme(scheme_path(scheme)).source_hash if scheme else None
    key = {"version": VERSION, "weights": sha, "scheme": scheme, "scheme_hash": scheme_hash, "params": params,
           "task": task, "lengths": lens, "score_len": L0, "n": n, "seed": seed}
    old = read_json(path)
    if old and old.get("key") == key:
        return old
    t0, c0 = time.perf_counter(), time.process_time()
    model, cfg, meta = open_run(run, scheme=scheme, params=params) if scheme else open_run(run)
    if task == "text":
        res: dict[str, Any] = {"ppl": perplexity(model, validation_data(cfg), lens, L0, windows=n, seed=seed)}
    else:
        res = {"blocks": blocks(model, lens, L0, samples=n, block_len=cfg.data.block_len,
                                offset=cfg.data.block_offset, seed=seed)}
    res.update({"key": key, "scheme": meta["scheme"].name, "scheme_params": dict(meta["scheme"].params),
                "scheme_source_hash": meta["scheme_hash"], "swap": meta.get("swap"),
                "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0})
    write_json(path, res)
    say(f"  {path.stem}: {time.process_time() - c0:.0f} s CPU")
    return res


def _ft_overrides(L0: int, target: int, base_cfg, steps: int, threads: int) -> dict:
    """A fine-tune at ``target * L0`` with the base's tokens per step (batch scaled down)."""
    tokens = base_cfg.batch_size * L0
    return {"context": target * L0, "steps": steps, "batch_size": max(1, tokens // (target * L0)),
            "lr": FT_LR, "min_lr": FT_LR / 10, "warmup": max(1, steps // 10), "log_every": max(1, steps // 10),
            "eval_every": steps, "checkpoint_every": max(1, steps // 2), "eval_batches": 4, "threads": threads}


def run_extension(out: str | Path, *, methods: list[str] | None = None, preset: str = "tiny",
                  steps: int | None = None, seed: int | None = None, data: str | None = None,
                  lengths: list[int] | None = None, windows: int | None = None, quick: bool = False,
                  targets: tuple[int, ...] = TARGETS, ft_steps: int | None = None, blocks_task: bool = True,
                  sets: dict | None = None, command: str | None = None, quiet: bool = False,
                  say: Callable[[str], None] = lambda m: None, base_run: Path | None = None,
                  ext_dir: Path | None = None) -> dict:
    """The whole extension study; returns ``{"results", "meta", "files"}`` (also DIR/extension/results.json).

    ``base_run`` / ``ext_dir`` move the base text model and the study's own folder (the seeded
    study, :mod:`pedsl.study.extension.seeds`, gives every seed its own: ``DIR/runs/rope/seed<k>``
    and ``DIR/extension/seed<k>``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = Path(out)
    ext, methods, tasks = _setup(out, methods=methods, preset=preset, steps=steps, seed=seed, data=data, quick=quick,
                                 blocks_task=blocks_task, sets=sets, base_run=base_run, ext_dir=ext_dir)
    results: dict[str, Any] = {}
    notes: list[str] = []
    for task, base, ov in tasks:
        results[task] = _study_task(task, base, ov, out=out, ext=ext, methods=methods, targets=targets,
                                    lengths=lengths, windows=windows, quick=quick, ft_steps=ft_steps, notes=notes,
                                    say=say, quiet=quiet)
    base_cfg = TrainConfig.from_yaml(tasks[0][1] / "config.yaml")  # the preset the runs were trained with
    meta = {"command": command or "pedsl compare --study extension", **provenance(),
            "preset": base_cfg.preset, "methods": methods, "targets": list(targets), "notes": notes,
            "blocks": {k.split(".")[-1]: v for k, v in BLOCKS.items() if k != "data"},
            "ft_lr": FT_LR, "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0,
            "compute_cpu_s": _compute_cpu(results)}
    say("writing the extension report")
    files = plots(results, ext)
    write_json(ext / "results.json", {"meta": meta, "results": results})
    p = page(results, meta, files)
    write_text(ext / "report.md", markdown(p))
    write_text(ext / "report.html", html_page(p))
    return {"results": results, "meta": meta, "files": ["report.md", "report.html", "results.json", *files]}


def study_methods(methods: list[str] | None) -> list[str]:
    """The methods the study runs: those named (all by default), plain rope (the baseline) first;
    an unknown name fails here, before anything trains."""
    methods = list(methods or METHODS)
    if "rope" not in methods:
        methods.insert(0, "rope")
    driver.resolve_schemes(methods)
    return methods


def _setup(out: Path, *, methods: list[str] | None, preset: str, steps: int | None, seed: int | None,
           data: str | None, quick: bool, blocks_task: bool, sets: dict | None, base_run: Path | None,
           ext_dir: Path | None) -> tuple[Path, list[str], list[tuple[str, Path, dict]]]:
    """The study's folder, its methods (rope first) and its tasks: (task, base run, training settings)."""
    ext = Path(ext_dir) if ext_dir is not None else out / "extension"
    make_dir(ext / "evals")
    methods = study_methods(methods)
    if quick and steps is None:
        steps = QUICK["steps"]
    overrides = driver.given(sets, preset=preset, steps=steps, seed=seed, data=data)
    tasks = [("text", Path(base_run) if base_run is not None else out / "runs" / "rope", dict(overrides))]
    if blocks_task:
        tasks.append(("blocks", ext / "runs" / "rope_blocks", {**overrides, **BLOCKS}))
    return ext, methods, tasks


def run_part(out: str | Path, *, task: str, methods: list[str], preset: str = "tiny", steps: int | None = None,
             seed: int | None = None, data: str | None = None, lengths: list[int] | None = None,
             windows: int | None = None, quick: bool = False, targets: tuple[int, ...] = TARGETS,
             ft_steps: int | None = None, sets: dict | None = None, quiet: bool = False,
             say: Callable[[str], None] = lambda m: None, base_run: Path | None = None,
             ext_dir: Path | None = None) -> None:
    """What the whole study does for ``task`` and ``methods`` (none: the task's base model only),
    writing the same run folders and evaluations, without the report: an executor unit
    (:mod:`pedsl.study.parallel`). ``methods`` are taken as given (rope is not added)."""
    out = Path(out)
    ext, _, tasks = _setup(out, methods=["rope"], preset=preset, steps=steps, seed=seed, data=data, quick=quick,
                           blocks_task=task == "blocks", sets=sets, base_run=base_run, ext_dir=ext_dir)
    driver.resolve_schemes(methods)
    _, base, ov = next(t for t in tasks if t[0] == task)
    _study_task(task, base, ov, out=out, ext=ext, methods=methods, targets=targets, lengths=lengths, windows=windows,
                quick=quick, ft_steps=ft_steps, notes=[], say=say, quiet=quiet)


def _study_task(task: str, base_run: Path, overrides: dict, *, out: Path, ext: Path, methods: list[str],
                targets: tuple[int, ...], lengths: list[int] | None, windows: int | None, quick: bool,
                ft_steps: int | None, notes: list[str], say: Callable[[str], None], quiet: bool) -> dict:
    """One task's base model (trained or reused), then every method's zero-shot swap and fine-tune."""
    say(f"[{task}] base RoPE model")
    done = driver.train_scheme("rope" if task == "text" else "rope_blocks", driver.resolve_schemes(["rope"])[0][1],
                               base_run, overrides, say, quiet)
    base_cfg = TrainConfig.from_yaml(base_run / "config.yaml")
    L0 = base_cfg.context
    mults = (QUICK["multipliers"] if quick else MULTIPLIERS) if task == "text" else BLOCK_MULTIPLIERS
    lens = sorted(set(lengths)) if lengths else [L0 * m for m in mults]
    n = windows or (QUICK["windows"] if quick else WINDOWS)
    if task == "blocks":
        n *= BLOCK_SAMPLES_PER_WINDOW
    S = ft_steps or max(1, round(FT_FRACTION * base_cfg.steps))
    rec: dict[str, Any] = {"base": {"run": str(base_run.relative_to(out)), "train": done, "context": L0},
                           "lengths": lens, "samples": n, "ft_steps": S, "zero_shot": {}, "fine_tuned": {},
                           "fine_tune_runs": {}}
    for method in methods:
        for T in targets:
            params, note = method_params(method, T, L0)
            for said in (note, f"{method}: training-free, evaluated zero-shot only" if method in ZERO_SHOT_ONLY
                         else None):
                if said and said not in notes:
                    notes.append(said)
            _method_at(rec, task, method, T, params, base_run, base_cfg, out=out, ext=ext, say=say, quiet=quiet)
    return rec


def _method_at(rec: dict, task: str, method: str, T: int, params: dict, base_run: Path, base_cfg: TrainConfig, *,
               out: Path, ext: Path, say: Callable[[str], None], quiet: bool) -> None:
    """``method`` set for ``T`` x the base's length: its zero-shot evaluation and its fine-tune, into ``rec``."""
    L0, lens, n, S = rec["base"]["context"], rec["lengths"], rec["samples"], rec["ft_steps"]
    tag = f"{method}.x{T}"
    say(f"[{task}] {method} x{T}: zero-shot")
    zs_path = ext / "evals" / f"{task}.zs.{suffix(method, params)}.json"  # rope: one for every T
    rec["zero_shot"].setdefault(method, {})[str(T)] = _evaluate(
        base_run, method, params, task, lens, L0, n, EVAL_SEED, zs_path, say)
    if method in ZERO_SHOT_ONLY:
        return
    ft_run = ext / "runs" / f"{task}.{tag}"
    cfg, scheme = init_config(base_run, scheme=method, params=params,
                              overrides=_ft_overrides(L0, T, base_cfg, S, torch.get_num_threads()))
    say(f"[{task}] {method} x{T}: fine-tune")
    ft_done = driver.train_or_reuse(f"{task}.{tag}", cfg, scheme, ft_run, say, quiet)
    rec["fine_tune_runs"].setdefault(method, {})[str(T)] = {
        "run": str(ft_run.relative_to(out)), "train": ft_done, "context": cfg.context,
        "batch_size": cfg.batch_size, "params": params}
    rec["fine_tuned"].setdefault(method, {})[str(T)] = _evaluate(
        ft_run, None, {}, task, lens, L0, n, EVAL_SEED, ext / "evals" / f"{task}.ft.{tag}.json", say)


def _compute_cpu(results: dict) -> dict:
    """CPU seconds of every training run and evaluation (each counted once, reused ones included):
    on a shared machine CPU time, not wall time, is what extrapolates."""
    evals = {id(e): e for r in results.values() for part in ("zero_shot", "fine_tuned")
             for per in r[part].values() for e in per.values()}
    ev = sum(e.get("cpu_time_s") or 0 for e in evals.values())
    runs = [r["base"]["train"] for r in results.values()]
    runs += [f["train"] for r in results.values() for per in r["fine_tune_runs"].values() for f in per.values()]
    base = sum((r["base"]["train"] or {}).get("cpu_time_s") or 0 for r in results.values())
    tr = sum((t or {}).get("cpu_time_s") or 0 for t in runs)
    return {"eval_cpu_s": ev, "train_cpu_s": tr, "base_train_cpu_s": base, "fine_tune_cpu_s": tr - base}
