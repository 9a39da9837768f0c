"""``pedsl compare``: train, evaluate and analyze several schemes alike, then write the report.

Layout of the study directory::

    DIR/runs/<scheme>/      a training run (pedsl.train format) + eval.json + analysis.json
    DIR/results.json        every run's train/eval/analysis results and the study's metadata
    DIR/report.md, DIR/report.html, DIR/<plot>.png|svg

Every scheme is trained with the same preset, steps, seed and data (in this process, through
:func:`pedsl.train.train`). A run whose DONE.json exists and whose config matches is reused; a
run with checkpoints but no DONE.json is resumed; eval.json and analysis.json are reused when
their settings match. So rerunning the same command after an interruption continues the study.

The default study (no schemes named): rope, rope_id, alibi, acc_random_qk, acc_random_qkv and
path from the scheme library, tiny preset, on the embedded corpus (the Python stdlib).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from pedsl.errors import ConfigError, OutputError, PedslError
from pedsl.study.common import read_json, write_json, write_text

DEFAULT_SCHEMES = ("rope", "rope_id", "alibi", "acc_random_qk", "acc_random_qkv", "path")
QUICK = {"steps": 150, "multipliers": (1, 2, 4, 8, 16), "windows": 2, "analyze_max": 512}
WINDOWS = 8  # windows (ppl) and samples (tasks) per length: 8 x L_train scored bytes per length


def resolve_schemes(names: list[str]) -> list[tuple[str, Path]]:
    """Scheme names (from the library) or .pe paths -> [(run name, path)]."""
    from pedsl.lang.library import looks_like_path, scheme_file

    items = list(names) or list(DEFAULT_SCHEMES)
    out: list[tuple[str, Path]] = []
    for item in items:
        p = scheme_file(item)  # a path as given, or the library's <item>.pe (did-you-mean otherwise)
        if not p.is_file():
            raise ConfigError(f"scheme file '{item}' does not exist", file=item)
        out.append((p.stem if looks_like_path(item) else item, p))
    names_seen: set[str] = set()
    for name, _ in out:
        if name in names_seen:
            raise ConfigError(f"scheme '{name}' is named twice", hint="compare each scheme once")
        names_seen.add(name)
    return out


def _git_commit() -> str | None:
    try:
        import pedsl

        root = Path(pedsl.__file__).resolve().parent.parent
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if res.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return res.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, Any]:
    import torch

    import pedsl

    return {"pedsl": getattr(pedsl, "__version__", "?"), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads()}


def _train_one(name: str, path: Path, run: Path, overrides: dict, say: Callable[[str], None], quiet: bool) -> dict:
    """Train (or reuse / resume) one scheme's run; returns its DONE.json."""
    from pedsl.config import resolve_train_config
    from pedsl.train.recipe import load_scheme

    scheme = load_scheme(path)
    cfg = resolve_train_config(scheme=str(path), block=scheme.train, overrides=overrides)
    return train_or_reuse(name, cfg, scheme, run, say, quiet)


def train_or_reuse(name: str, cfg, scheme, run: Path, say: Callable[[str], None], quiet: bool) -> dict:
    """Train ``cfg`` into ``run``, resume it, or reuse it when finished with the same settings."""
    from pedsl.config import TrainConfig
    from pedsl.train import checkpoint as ck
    from pedsl.train import rundir, train
    from pedsl.train.schemefiles import attention_files
    from pedsl.train.recipe import from_scheme

    if not cfg.threads:  # keep the study's thread count (set once, from the load before anything ran)
        import torch

        cfg = cfg.model_copy(update={"threads": torch.get_num_threads()})
    done = read_json(run / "DONE.json")
    saved = None
    if (run / "config.yaml").exists():
        try:
            saved = TrainConfig.from_yaml(run / "config.yaml")
        except PedslError:
            saved = None
    same = saved is not None and saved.digest() == cfg.digest()
    attention = from_scheme(cfg, scheme)  # its hash covers every file of the resolved scheme
    has_ckpt = bool(ck.list_checkpoints(run / "checkpoints"))
    if same and (done or has_ckpt):  # an import that changed since: say which file, never reuse
        try:
            rundir.verify_scheme(run, attention_files(attention), what="reuse")
        except PedslError as err:
            raise OutputError(err.diagnostics[0].message,
                              hint=f"use another --out for the changed scheme, or delete '{run}' to retrain it") from None
    same = same and rundir.recorded_hash(run) == attention.source_hash
    if done and same and done.get("steps") == cfg.steps:
        say(f"{name}: reusing the finished run {run}")
        return done
    if run.exists() and any(run.iterdir()) and not same and (has_ckpt or done):
        raise OutputError(f"'{run}' holds a run of '{name}' with other settings (scheme, preset, seed or data)",
                          hint="use another --out for a different study, or delete that run directory")
    if done and same and done.get("steps") != cfg.steps:
        raise OutputError(f"'{run}' was trained for {done.get('steps')} steps, this study asks for {cfg.steps}",
                          hint="use another --out (the learning-rate schedule depends on the step budget)")
    resume = same and has_ckpt
    say(f"{name}: {'resuming' if resume else 'training'} {cfg.steps} steps "
        f"(preset {cfg.preset}, context {cfg.context}, seed {cfg.seed}) -> {run}")
    return train(cfg, run, attention=attention, resume=resume, quiet=quiet)


def study_dir(out: str | Path) -> Path:
    """The study directory with its runs/ folder created (OutputError when that fails, or when
    ``out`` is a non-empty folder that is not a study: never overwrite)."""
    out = Path(out)
    if out.is_dir() and not (out / "runs").is_dir() and any(out.iterdir()):
        shown = ", ".join(sorted(p.name for p in out.iterdir())[:5])
        raise OutputError(f"'{out}' is not empty and is not a pedsl compare study (it holds {shown})",
                          file=str(out), hint="choose a new or empty --out")
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the study directory '{out}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    return out


def run_compare(schemes: list[str], out: str | Path, *, preset: str = "tiny", steps: int | None = None,
                seed: int | None = None, data: str | None = None, lengths: list[int] | None = None,
                windows: int | None = None, quick: bool = False, analyze_max: int | None = None,
                sets: dict | None = None, command: str | None = None, quiet: bool = False,
                say: Callable[[str], None] = lambda m: None, report: bool = True,
                started: float | None = None) -> dict:
    """The whole study; returns ``{"results": ..., "meta": ..., "files": [...]}`` (only ``results``
    with ``report=False``: the runs of a parallel study, whose report the parent writes)."""
    from pedsl.study.analyze import analyze_run, default_lengths
    from pedsl.study.common import open_run
    from pedsl.study.eval_run import EVAL_VERSION, evaluate_run
    from pedsl.study.plots import all_plots
    from pedsl.study.report import markdown, to_html

    t0, c0 = started or time.perf_counter(), time.process_time()  # started: when the workers of --jobs began
    out = study_dir(out)
    items = resolve_schemes(schemes)
    if quick and steps is None:
        steps = QUICK["steps"]
    overrides = {"preset": preset, "steps": steps, "seed": seed, "data": data, **(sets or {})}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    results: dict[str, dict[str, Any]] = {}
    contexts = set()
    cfg_seen = None
    from pedsl.study.progress import STUDY_WEIGHTS as WEIGHTS
    from pedsl.study.progress import Eta

    eta = Eta({p: WEIGHTS[p] * len(items) for p in ("train", "eval", "analysis")}, say, "compare")
    for n, (name, path) in enumerate(items, 1):
        run = out / "runs" / name
        say(f"[{n}/{len(items)}] {name}")
        reused = (run / "DONE.json").exists()  # then _train_one reuses it or refuses (other settings)
        done = _train_one(name, path, run, overrides, say, quiet)
        if reused:
            eta.skip(WEIGHTS["train"], kind="train")
        else:
            eta.done(WEIGHTS["train"], f"trained {name}", kind="train")
        loaded = None
        model_cfg = None
        from pedsl.config import TrainConfig

        model_cfg = TrainConfig.from_yaml(run / "config.yaml")
        cfg_seen = cfg_seen or model_cfg
        contexts.add(model_cfg.context)
        L0 = model_cfg.context
        mults = QUICK["multipliers"] if quick else (1, 2, 4, 8, 16, 32)
        lens = lengths or [L0 * m for m in mults]
        win = windows or (QUICK["windows"] if quick else WINDOWS)
        amax = analyze_max or (QUICK["analyze_max"] if quick else None)
        ev = read_json(run / "eval.json")
        want_tasks = ["ppl", "passkey", "blocks"]
        if not (ev and ev.get("settings", {}).get("version") == EVAL_VERSION and ev.get("step") == done.get("steps") and ev.get("scheme_hash") == done.get("scheme_hash")
                and ev.get("settings", {}).get("lengths") == sorted(set(lens))
                and ev.get("settings", {}).get("windows") == (win or ev.get("settings", {}).get("windows"))
                and ev.get("settings", {}).get("tasks") == want_tasks):
            loaded = loaded or open_run(run)
            say(f"{name}: evaluating at lengths {sorted(set(lens))}")
            ev = evaluate_run(run, lengths=lens, tasks=want_tasks, windows=win, say=say, loaded=loaded)
            eta.done(WEIGHTS["eval"], f"evaluated {name}", kind="eval")
        else:
            say(f"{name}: reusing eval.json")
            eta.skip(WEIGHTS["eval"], kind="eval")
        alens = [L for L in lens if L <= (amax or 1024)] or default_lengths(L0, amax or 1024)
        an = read_json(run / "analysis.json")
        if not (an and an.get("step") == done.get("steps") and an.get("scheme_hash") == done.get("scheme_hash")
                and an.get("lengths") == sorted(set(alens))):
            loaded = loaded or open_run(run)
            say(f"{name}: analyzing at lengths {sorted(set(alens))}")
            an = analyze_run(run, lengths=alens, say=say, loaded=loaded)
            eta.done(WEIGHTS["analysis"], f"analyzed {name}", kind="analysis")
        else:
            say(f"{name}: reusing analysis.json")
            eta.skip(WEIGHTS["analysis"], kind="analysis")
        results[name] = {"train": done, "eval": ev, "analysis": an, "run_dir": str(run.relative_to(out)),
                         "scheme_file": str(path)}
        del loaded
    if not report:
        return {"results": results}
    context = min(contexts) if contexts else 0
    meta = {"command": command or "pedsl compare", "git": _git_commit(), **_versions(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "preset": cfg_seen.preset if cfg_seen else preset, "steps": cfg_seen.steps if cfg_seen else steps,
            "seed": cfg_seen.seed if cfg_seen else seed, "data": (results and next(iter(results.values()))["train"].get("data"))
            or (cfg_seen.data.source if cfg_seen else data), "context": context,
            "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0,
            "compute_time_s": sum((r["train"] or {}).get("wall_time_s") or 0 for r in results.values())
            + sum((r[k] or {}).get("wall_time_s") or 0 for r in results.values() for k in ("eval", "analysis"))}
    say("writing the report")
    plots = all_plots(results, out, context)
    write_json(out / "results.json", {"meta": meta, "results": results})
    write_text(out / "report.md", markdown(results, meta, plots))
    write_text(out / "report.html", to_html(results, meta, plots))
    files = ["report.md", "report.html", "results.json"] + [f for v in plots.values() for f in v]
    return {"results": results, "meta": meta, "files": files}

