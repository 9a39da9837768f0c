"""``pedsl compare --study extension --seeds 0,1,2``: the extension study once per training seed.

Each seed is a whole extension study (:func:`pedsl.study.study_extension.run_extension`) with its
own base models and fine-tunes: the base text model in ``DIR/runs/rope/seed<k>`` (the seeded
default study's run, reused when it is there) and everything else in ``DIR/extension/seed<k>/``,
which also holds that seed's own report. The evaluation windows are the same for every seed, so
the spread is the spread over training seeds.

This module then summarises the seeds in ``DIR/extension/``: every perplexity ratio (each seed's
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

import datetime as _dt
import html
import time
from pathlib import Path
from typing import Any, Callable

from pedsl.errors import OutputError
from pedsl.study import seeds as sd
from pedsl.study.common import write_json, write_text
from pedsl.study.report import STYLE, html_images, html_sections, html_table, md_images, md_sections, md_table, reproduce_html, reproduce_md
from pedsl.study.report_extension import accuracy, ratio

PARTS = (("zero_shot", "zero-shot (weights as trained, scheme swapped)"),
         ("fine_tuned", "after the fine-tune at the target length"))


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


def _cells(agg: dict, part: str, method: str, T: str | int) -> dict | None:
    """The cells (``{str(L): spread}``) of ``method`` at target ``T``; zero-shot RoPE is one model
    whatever the target (kept once by :func:`aggregate`)."""
    per = agg[part].get(method) or {}
    if part == "zero_shot" and method == "rope":
        return next(iter(per.values()), None)
    return per.get(str(T))


def _reference(agg: dict, part: str, T: str) -> dict | None:
    """Plain RoPE's cells for a comparison: zero-shot RoPE (one model), or fine-tuned RoPE at ``T``."""
    return _cells(agg, part, "rope", T)


def tables(aggregated: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    out = []
    for task, agg in aggregated.items():
        L0, lens = agg["context"], agg["lengths"]
        spec = ".3f" if task == "text" else ".2f"
        for part, label in PARTS:
            rows = []
            for method, per in agg[part].items():
                for T, cells in per.items():
                    ref = _reference(agg, part, T) if method != "rope" else None
                    target = "-" if (part == "zero_shot" and method == "rope") else f"{T}x"
                    rows.append([method, target] + [sd.fmt(cells.get(str(L)), spec)
                                                    + sd.flag(cells.get(str(L)), (ref or {}).get(str(L)))
                                                    for L in lens])
            what = "perplexity ratio to each seed's base model at " + str(L0) if task == "text" else \
                "exact-offset accuracy at the block ends (chance 0.04)"
            note = (f"mean [min, max] over {agg['seeds']} seeds; (n.s.): within the spread of "
                    f"{'zero-shot' if part == 'zero_shot' else 'fine-tuned'} RoPE at the same length.")
            out.append((f"{'Text' if task == 'text' else 'Block task'}: {what}, {label}",
                        ["method", "factor"] + [f"{L / L0:g}x" for L in lens], rows, note))
    return out


def summary(aggregated: dict) -> tuple[list[str], list[list[str]]]:
    """One row per method and target: text ratio at 1x and at the target, zero-shot and fine-tuned."""
    text = aggregated.get("text")
    header = ["method", "target", "zero-shot 1x", "zero-shot @ target", "fine-tuned 1x", "fine-tuned @ target"]
    rows = []
    if not text:
        return header, rows
    L0 = text["context"]
    for method, per in text["fine_tuned"].items():
        for T, ft in per.items():
            zs = _cells(text, "zero_shot", method, T) or {}
            at = str(L0 * int(T))
            rz, rf = _reference(text, "zero_shot", T) or {}, _reference(text, "fine_tuned", T) or {}
            mark = method != "rope"
            rows.append([method, f"{T}x", sd.fmt(zs.get(str(L0))),
                         sd.fmt(zs.get(at)) + (sd.flag(zs.get(at), rz.get(at)) if mark else ""),
                         sd.fmt(ft.get(str(L0))),
                         sd.fmt(ft.get(at)) + (sd.flag(ft.get(at), rf.get(at)) if mark else "")])
    return header, rows


def findings(aggregated: dict) -> list[str]:
    """At each target: the best fine-tuned and zero-shot method on text and whether its lead over
    the runner-up is larger than their spreads."""
    text = aggregated.get("text")
    if not text:
        return []
    L0, out = text["context"], []
    targets = sorted({int(T) for per in text["fine_tuned"].values() for T in per})
    for T in targets:
        at = str(L0 * T)
        for part, word in (("zero_shot", "zero-shot"), ("fine_tuned", "fine-tuned")):
            cells = {}
            for method in text[part]:
                c = (_cells(text, part, method, T) or {}).get(at)
                if c:
                    cells[method] = c
            if len(cells) < 2:
                continue
            order = sorted(cells, key=lambda m: cells[m]["mean"])
            a, b = order[0], order[1]
            sig = sd.significant(cells[a], cells[b])
            verdict = {True: "beyond the spread", False: "within the spread (not significant)",
                       None: "no spread to judge with"}[sig]
            out.append(f"{T}x {word} at {at}: best {a} {sd.fmt(cells[a])}, then {b} {sd.fmt(cells[b])}: "
                       f"the lead is {verdict}.")
    return out


def plots(aggregated: dict, out_dir: Path) -> list[str]:
    from pedsl.study.plots import MARKERS, length_axis, mark_train, save_figure, band_plot, plt

    files: list[str] = []
    for task, agg in aggregated.items():
        L0, lens = agg["context"], agg["lengths"]
        targets = sorted({int(T) for per in agg["fine_tuned"].values() for T in per})
        fig, axes = plt.subplots(len(targets), 2, figsize=(12, 4.6 * len(targets)), squeeze=False,
                                 constrained_layout=True)
        for i, T in enumerate(targets):
            for j, (part, _) in enumerate(PARTS):
                ax = axes[i][j]
                for n, method in enumerate(agg[part]):
                    cells = _cells(agg, part, method, T)
                    pts = [(L, cells[str(L)]) for L in lens if cells and cells.get(str(L))]
                    if pts:
                        band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=method,
                                  marker=MARKERS[n % len(MARKERS)])
                length_axis(ax, lens)
                mark_train(ax, L0)
                ax.axvline(L0 * T, color="tab:red", linestyle=":", linewidth=1)
                if task == "text":
                    ax.set_yscale("log")
                    ax.set_ylabel(f"ppl(L) / ppl_base({L0})")
                else:
                    ax.set_ylim(0, 1.02)
                    ax.set_ylabel("block-end accuracy")
                ax.set_title(f"{'zero-shot' if part == 'zero_shot' else 'fine-tuned'}, factor for {T}x "
                             f"(target {L0 * T}, dotted); band: min-max over {agg['seeds']} seeds", fontsize=9)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8)
        fig.suptitle("Text perplexity ratio vs length" if task == "text" else "Exact-offset accuracy vs length")
        files += save_figure(fig, out_dir, f"extension_seeds_{task}")
    return files


def markdown(aggregated: dict, meta: dict, files: list[str]) -> str:
    title = f"# pedsl compare --study extension over seeds {', '.join(map(str, meta['seeds']))}"
    md = [title, "", _intro(meta), ""]
    header, rows = summary(aggregated)
    md += ["## Summary (text)", "", *md_table(header, rows)] + [""]
    md += ["## Findings", ""] + [f"- {x}" for x in findings(aggregated)] + [""]
    md += md_sections(tables(aggregated))
    md += md_images(files)
    md += reproduce_md(meta)
    return "\n".join(md)


def html_page(aggregated: dict, meta: dict, files: list[str]) -> str:
    e = html.escape

    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'><title>pedsl extension study, seeds</title>",
             STYLE + "</head><body>", f"<h1>pedsl compare --study extension over seeds "
             f"{e(', '.join(map(str, meta['seeds'])))}</h1>", f"<p>{e(_intro(meta))}</p>",
             "<h2>Summary (text)</h2>", html_table(*summary(aggregated)), "<h2>Findings</h2><ul>"]
    parts += [f"<li>{e(x)}</li>" for x in findings(aggregated)] + ["</ul>"]
    parts += html_sections(tables(aggregated))
    parts += html_images(files)
    parts += reproduce_html(meta)
    return "\n".join(parts)


def _intro(meta: dict) -> str:
    return (f"The extension study once per training seed ({', '.join(map(str, meta['seeds']))}); each seed's "
            f"own report is in extension/seed<k>/. Methods: {', '.join(meta['methods'])}. This invocation "
            f"took {meta.get('wall_time_s', 0):.0f} s wall, {meta.get('cpu_time_s', 0):.0f} s CPU.")


def run_extension_seeds(out: str | Path, *, seeds: list[int], command: str | None = None,
                        say: Callable[[str], None] = lambda m: None, **kw: Any) -> dict:
    """Every seed's extension study, then the summary over seeds in ``DIR/extension/``; returns
    ``{"results" (aggregated), "per_seed", "meta", "files"}``. ``kw`` goes to :func:`run_extension`."""
    from pedsl.study.study_extension import run_extension

    t0, c0 = time.perf_counter(), time.process_time()
    out = Path(out)
    per_seed: dict[int, dict] = {}
    last_meta: dict = {}
    for i, k in enumerate(seeds):
        say(f"[seed {k}] extension study ({i + 1}/{len(seeds)})")
        res = run_extension(out, seed=k, base_run=out / "runs" / "rope" / f"seed{k}",
                            ext_dir=out / "extension" / f"seed{k}", command=command, say=say, **kw)
        per_seed[k] = res["results"]
        last_meta = res["meta"]
    aggregated = aggregate(per_seed)
    ext = out / "extension"
    try:
        ext.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the study directory '{ext}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    meta = {"command": command or "pedsl compare --study extension --seeds " + ",".join(map(str, seeds)),
            "seeds": list(seeds), "methods": last_meta.get("methods", []),
            **{k: last_meta[k] for k in ("git", "pedsl", "torch", "python", "platform", "cpus", "threads")
               if k in last_meta},
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0}
    files = plots(aggregated, ext)
    write_json(ext / "results.json", {"meta": meta, "results": aggregated,
                                      "per_seed": {str(k): v for k, v in per_seed.items()}})
    write_text(ext / "report.md", markdown(aggregated, meta, files))
    write_text(ext / "report.html", html_page(aggregated, meta, files))
    return {"results": aggregated, "per_seed": per_seed, "meta": meta,
            "files": ["report.md", "report.html", "results.json", *files]}
