"""``pedsl compare --study extension --seeds 0,1,2``: the extension study once per training seed.

Each seed is a whole extension study (:func:`pedsl.study.extension.run.run_extension`) with its
own base models and fine-tunes: the base text model in ``DIR/runs/rope/seed<k>`` (the seeded
default study's run, reused when it is there) and everything else in ``DIR/extension/seed<k>/``,
which also holds that seed's own report. The evaluation windows are the same for every seed, so
the spread is the spread over training seeds.

It then summarises the seeds in ``DIR/extension/`` (:mod:`.seeds_report`): every perplexity ratio (each seed's
ratio to its own base model at ``L0``) and every block accuracy as mean [min, max] over the seeds
(:mod:`pedsl.study.seeds`), a cell marked ``(n.s.)`` where it is within the spread of plain RoPE
at the same length (zero-shot RoPE for the zero-shot tables, fine-tuned RoPE for the fine-tuned
ones), and the curves with their min-max bands.

Layout::

    DIR/runs/rope/seed<k>/              the base text model of seed k
    DIR/extension/seed<k>/...           seed k's study (runs, evals, report)
    DIR/extension/report.md, report.html, results.json, extension_seeds_<task>.png|svg
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pedsl.study import seeds as sd
from pedsl.study.common import make_dir, utc_now, write_json, write_text
from pedsl.study.extension import run as single
from pedsl.study.extension.report import accuracy, ratio
from pedsl.study.extension.seeds_report import PARTS, page, plots
from pedsl.study.page import html_page, markdown


def _value(task: str, rec: dict, ev: dict | None, L: int) -> float | None:
    return ratio(rec, ev, L) if task == "text" else accuracy(ev, L)


def aggregate(per_seed: dict[int, dict]) -> dict:
    """``{task: {"context", "lengths", part: {method: {T: {str(L): spread}}}}}`` over the seeds'
    results (:func:`run_extension`'s ``results``). Zero-shot RoPE is the same model at every
    target, so it is kept once, under its first target."""
    out: dict[str, Any] = {}
    seeds = sorted(per_seed)
    for task in per_seed[seeds[0]]:
        recs = [per_seed[k][task] for k in seeds if task in per_seed[k]]
        first = recs[0]
        lens = first["lengths"]
        agg: dict[str, Any] = {"context": first["base"]["context"], "lengths": lens, "seeds": len(recs)}
        for part, _ in PARTS:
            agg[part] = {}
            for method, per in first[part].items():
                targets = list(per)[:1] if (part == "zero_shot" and method == "rope") else list(per)
                for T in targets:
                    cells = {}
                    for L in lens:
                        vals = [_value(task, r, r[part].get(method, {}).get(T), L) for r in recs]
                        cells[str(L)] = sd.spread(v for v in vals if v is not None)
                    agg[part].setdefault(method, {})[T] = cells
        out[task] = agg
    return out


def run_extension_seeds(out: str | Path, *, seeds: list[int], command: str | None = None,
                        say: Callable[[str], None] = lambda m: None, **kw: Any) -> dict:
    """Every seed's extension study, then the summary over seeds in ``DIR/extension/``; returns
    ``{"results" (aggregated), "per_seed", "meta", "files"}``. ``kw`` goes to :func:`run_extension`."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = Path(out)
    per_seed: dict[int, dict] = {}
    last_meta: dict = {}
    for i, k in enumerate(seeds):
        say(f"[seed {k}] extension study ({i + 1}/{len(seeds)})")
        res = single.run_extension(out, seed=k, base_run=out / "runs" / "rope" / f"seed{k}",
                            ext_dir=out / "extension" / f"seed{k}", command=command, say=say, **kw)
        per_seed[k] = res["results"]
        last_meta = res["meta"]
    aggregated = aggregate(per_seed)
    ext = make_dir(out / "extension")
    meta = {"command": command or "pedsl compare --study extension --seeds " + ",".join(map(str, seeds)),
            "seeds": list(seeds), "methods": last_meta.get("methods", []),
            **{k: last_meta[k] for k in ("git", "pedsl", "torch", "python", "platform", "cpus", "threads")
               if k in last_meta},
            "date": utc_now(),
            "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0}
    files = plots(aggregated, ext)
    write_json(ext / "results.json", {"meta": meta, "results": aggregated,
                                      "per_seed": {str(k): v for k, v in per_seed.items()}})
    p = page(aggregated, meta, files)
    write_text(ext / "report.md", markdown(p))
    write_text(ext / "report.html", html_page(p))
    return {"results": aggregated, "per_seed": per_seed, "meta": meta,
            "files": ["report.md", "report.html", "results.json", *files]}
