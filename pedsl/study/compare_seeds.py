"""``pedsl compare --seeds 0,1,2`` and ``pedsl compare --study NAME``: studies over several seeds.

Every scheme is trained once per seed (``DIR/runs/<scheme>/seed<k>``), evaluated and analyzed
like ``pedsl compare`` does; the report gives every number as mean [min, max] over the seeds
(:mod:`pedsl.study.seeds`), every curve with its min-max band, flags differences from RoPE
within the spread as not significant, and draws a loss curve per run.

Studies (``STUDIES``):

- ``None`` (the default study with ``--seeds``): the default schemes on the text corpus,
  perplexity at 1x..32x, the instruments up to 1024;
- ``"retrieval"`` (:mod:`pedsl.study.study_retrieval`): the default schemes plus fox and
  path_fox trained on the retrieval tasks plus copy rows (the study's recipe:
  ``study_retrieval.MIXTURE`` and ``TRAIN``), accuracy vs length (1x..16x) and needle depth.

Finished runs, eval.json, retrieval.json and analysis.json are reused when their settings match,
so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any, Callable

from pedsl.study import seeds as sd
from pedsl.study.common import read_json, write_json, write_text

from pedsl.study.progress import STUDY_WEIGHTS as WEIGHTS


def _reusable(old: dict | None, done: dict, **settings: Any) -> bool:
    if not old or old.get("step") != done.get("steps") or old.get("scheme_hash") != done.get("scheme_hash"):
        return False
    s = old.get("settings", {})
    return all(s.get(k) == v for k, v in settings.items())


def study_settings(study: str | None, *, quick: bool, windows: int | None, analyze_max: int | None) -> dict:
    """Schemes, data, training settings (under ``--steps`` and ``--set``), length multipliers, windows,
    analysis cap, and retrieval settings of a study."""
    from pedsl.study import compare as cmp

    if study == "retrieval":
        from pedsl.study import study_retrieval as sr

        q = sr.QUICK if quick else {}
        return {"schemes": sr.SCHEMES, "data": sr.MIXTURE, "train": dict(sr.TRAIN), "multipliers": q.get("multipliers", sr.MULTIPLIERS),
                "windows": windows or q.get("windows", cmp.WINDOWS), "tasks": ["ppl"],
                "analyze_max": analyze_max or q.get("analyze_max", 1024),
                "retrieval": {"depths": list(q.get("depths", sr.DEPTHS)), "samples": windows or q.get("samples", sr.SAMPLES)}}
    if study is not None:
        from pedsl.errors import UsageError

        raise UsageError(f"unknown study '{study}'", hint="studies: retrieval")
    return {"schemes": cmp.DEFAULT_SCHEMES, "data": None, "train": {},
            "multipliers": cmp.QUICK["multipliers"] if quick else (1, 2, 4, 8, 16, 32),
            "windows": windows or (cmp.QUICK["windows"] if quick else cmp.WINDOWS), "tasks": ["ppl", "passkey", "blocks"],
            "analyze_max": analyze_max or (cmp.QUICK["analyze_max"] if quick else 1024), "retrieval": None}


def run_seeded(study: str | None, schemes: list[str], out: str | Path, *, seeds: list[int] | None = None,
               preset: str = "tiny", steps: int | None = None, data: str | None = None,
               lengths: list[int] | None = None, windows: int | None = None, quick: bool = False,
               analyze_max: int | None = None, sets: dict | None = None, command: str | None = None,
               quiet: bool = False, say: Callable[[str], None] = lambda m: None, report: bool = True,
               started: float | None = None) -> dict:
    """The whole study; returns ``{"results", "meta", "files", "per_seed", "summary"}`` (only
    ``per_seed`` with ``report=False``: the runs of a parallel study, whose report the parent writes)."""
    from pedsl.config import TrainConfig
    from pedsl.study import compare as cmp
    from pedsl.study import study_retrieval_report as rep
    from pedsl.study.analyze import analyze_run
    from pedsl.study.common import open_run
    from pedsl.study.eval_run import EVAL_VERSION, evaluate_run
    from pedsl.study.progress import Eta

    t0, c0 = started or time.perf_counter(), time.process_time()  # started: when the workers of --jobs began
    out = cmp.study_dir(out)
    st = study_settings(study, quick=quick, windows=windows, analyze_max=analyze_max)
    items = cmp.resolve_schemes(list(schemes) or list(st["schemes"]))
    seed_list = list(seeds) if seeds else [0]
    if quick and steps is None:
        steps = cmp.QUICK["steps"]
    data = data or st["data"]
    ret = st["retrieval"]
    parts = ["train", "eval", "analysis"] + (["retrieval"] if ret else [])
    eta = Eta({p: WEIGHTS[p] * len(items) * len(seed_list) for p in parts}, say, "study")
    per_seed: dict[str, dict[int, dict]] = {name: {} for name, _ in items}
    context = None
    for seed in seed_list:
        for name, path in items:
            run = out / "runs" / name / f"seed{seed}"
            say(f"{name}, seed {seed}")
            given = {"preset": preset, "steps": steps, "seed": seed, "data": data, **(sets or {})}
            overrides = {**st["train"], **{k: v for k, v in given.items() if v is not None}}  # the study's, then yours
            reused = (run / "DONE.json").exists()  # then _train_one reuses it or refuses (other settings)
            done = cmp._train_one(name, path, run, overrides, say, quiet)
            if reused:
                eta.skip(WEIGHTS["train"], kind="train")
            else:
                eta.done(WEIGHTS["train"], f"trained {name} seed {seed}", kind="train")
            cfg = TrainConfig.from_yaml(run / "config.yaml")
            L0 = cfg.context
            context = context or L0
            lens = sorted(set(lengths or [L0 * m for m in st["multipliers"]]))
            loaded = None
            ev = read_json(run / "eval.json")
            if _reusable(ev, done, version=EVAL_VERSION, lengths=lens, windows=st["windows"], tasks=st["tasks"]):
                eta.skip(WEIGHTS["eval"], kind="eval")
            else:
                loaded = loaded or open_run(run)
                ev = evaluate_run(run, lengths=lens, tasks=st["tasks"], windows=st["windows"], say=say, loaded=loaded)
                eta.done(WEIGHTS["eval"], f"perplexity of {name} seed {seed}", kind="eval")
            rt = None
            if ret:
                from pedsl.study.study_retrieval import VERSION, retrieval_run

                rt = read_json(run / "retrieval.json")
                if _reusable(rt, done, version=VERSION, lengths=lens, depths=ret["depths"], samples=ret["samples"]):
                    eta.skip(WEIGHTS["retrieval"], kind="retrieval")
                else:
                    loaded = loaded or open_run(run)
                    rt = retrieval_run(run, lens, depths=ret["depths"], samples=ret["samples"], say=say, loaded=loaded)
                    eta.done(WEIGHTS["retrieval"], f"retrieval of {name} seed {seed}", kind="retrieval")
            alens = [L for L in lens if L <= st["analyze_max"]] or [L0]
            an = read_json(run / "analysis.json")
            if an and an.get("step") == done.get("steps") and an.get("scheme_hash") == done.get("scheme_hash") \
                    and an.get("lengths") == alens:
                eta.skip(WEIGHTS["analysis"], kind="analysis")
            else:
                loaded = loaded or open_run(run)
                an = analyze_run(run, lengths=alens, say=say, loaded=loaded)
                eta.done(WEIGHTS["analysis"], f"instruments of {name} seed {seed}", kind="analysis")
            per_seed[name][seed] = {"train": done, "eval": ev, "retrieval": rt, "analysis": an,
                                    "run_dir": str(run.relative_to(out)), "scheme_file": str(path)}
            del loaded
    if not report:
        return {"per_seed": per_seed}
    results = {name: aggregate_runs(runs) for name, runs in per_seed.items()}
    first = next(iter(next(iter(per_seed.values())).values()))
    meta = {"study": study or "default", "command": command or "pedsl compare", "git": cmp._git_commit(),
            **cmp._versions(), "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "preset": cfg.preset, "steps": first["train"].get("steps"), "seeds": seed_list,
            "data": cfg.data.source, "context": context, "depths": (ret or {}).get("depths"),
            "samples": (ret or {}).get("samples"), "wall_time_s": time.perf_counter() - t0,
            "cpu_time_s": time.process_time() - c0,
            "compute_time_s": sum((r[k] or {}).get("wall_time_s") or 0 for runs in per_seed.values()
                                  for r in runs.values() for k in ("train", "eval", "retrieval", "analysis"))}
    say("writing the report")
    plots = rep.plots(results, per_seed, out, meta)
    write_json(out / "results.json", {"meta": meta, "results": results})
    write_text(out / "report.md", rep.markdown(results, meta, plots))
    write_text(out / "report.html", rep.html_page(results, meta, plots))
    files = ["report.md", "report.html", "results.json"] + [f for v in plots.values() for f in v]
    summary = [(t, h, r) for t, h, r, _ in rep.tables(results, meta)]
    return {"results": results, "meta": meta, "files": files, "per_seed": per_seed, "summary": summary}


def aggregate_runs(runs: dict[int, dict]) -> dict:
    """One scheme's runs over seeds -> ``{"seeds", "runs", "mean": {part: tree}, "spread": {part: tree}}``."""
    out: dict[str, Any] = {"seeds": sorted(runs), "runs": {str(s): r["run_dir"] for s, r in runs.items()},
                           "mean": {}, "spread": {}}
    for part in ("train", "eval", "retrieval", "analysis"):
        m, s = sd.aggregate([r.get(part) for r in runs.values()])
        if part == "analysis" and m:  # the per-layer detail stays in each run's analysis.json
            m = {k: v for k, v in m.items() if k != "layers"}
            s = {k: v for k, v in (s or {}).items() if k != "layers"}
        out["mean"][part], out["spread"][part] = m, s
    return out
