"""The seeded studies' report (``--seeds``, ``--study retrieval``): tables with mean [min, max] over seeds, n.s. flags, plots.

Plots (PNG + SVG, every axis labelled, legends only where there are lines):

- ``acc_vs_length``: whole-answer accuracy vs evaluation length, one panel per task and one for
  the mean over tasks; a line per scheme with its min-max band over seeds; chance marked.
- ``acc_vs_depth``: accuracy vs needle depth at the training length, same layout.
- ``niah_<task>`` and ``niah_all``: the needle-in-a-haystack heatmap, one panel per scheme,
  length (x) by depth (y), colour = accuracy (mean over seeds).
- ``ppl_ratio``: perplexity ratio vs length on the text corpus, with bands.
- ``loss_curves``: training (and validation) loss vs step, one panel per scheme, a line per seed.
"""

from __future__ import annotations

import html as _html
import math
from pathlib import Path

from pedsl.study import seeds as sd
from pedsl.study.plots import MARKERS, band_plot, far_mass_figure, length_axis, loss_curves, mark_train, plt, save_figure
from pedsl.study.report import html_sections, md_sections
from pedsl.data.tasks import TASKS

TASK_TITLES = {"passkey": "passkey (single needle)", "multikey": "multi-key needle with distractors",
               "kv": "key-value lookup", "all": "mean over the three tasks"}


def _acc_points(r: dict, task: str, metric: str = "accuracy") -> tuple[list[int], list[dict]]:
    """(lengths, spreads) of a scheme's accuracy vs length for a task ('all' = overall)."""
    sp = (r.get("spread") or {}).get("retrieval") or {}
    node = sp.get("overall") if task == "all" else (sp.get("tasks") or {}).get(task)
    pts = sorted((int(L), v[metric]) for L, v in (node or {}).items() if isinstance(v, dict) and v.get(metric))
    return [p[0] for p in pts], [p[1] for p in pts]


def _depth_points(r: dict, task: str, L: int, metric: str = "accuracy") -> tuple[list[float], list[dict]]:
    sp = (r.get("spread") or {}).get("retrieval") or {}
    tasks = list(TASKS) if task == "all" else [task]
    by_depth: dict[float, list[dict]] = {}
    for t in tasks:
        cells = (((sp.get("tasks") or {}).get(t) or {}).get(str(L)) or {}).get("depths") or {}
        for d, v in cells.items():
            if isinstance(v, dict) and v.get(metric):
                by_depth.setdefault(float(d), []).append(v[metric])
    pts = sorted(by_depth.items())
    avg = [{k: sum(s[k] for s in ss) / len(ss) for k in ("mean", "min", "max")} | {"n": ss[0]["n"]} for _, ss in pts]
    return [p[0] for p in pts], avg


def plots(results: dict, per_seed: dict, out_dir: Path, meta: dict) -> dict[str, list[str]]:
    out_dir = Path(out_dir)
    ctx = meta["context"]
    files: dict[str, list[str]] = {}
    panels = list(TASKS) + ["all"]
    # accuracy vs length
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True)
    any_ = False
    for ax, task in zip(axes, panels):
        lengths: set[int] = set()
        for n, (name, r) in enumerate(results.items()):
            x, s = _acc_points(r, task)
            if x:
                band_plot(ax, x, s, label=name, marker=MARKERS[n % len(MARKERS)])
                lengths |= set(x)
                any_ = True
        if lengths:
            length_axis(ax, sorted(lengths))
            mark_train(ax, ctx)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(TASK_TITLES[task], fontsize=9)
    axes[0].set_ylabel("accuracy (whole answer right)")
    _legend(axes[-1])
    files["acc_vs_length"] = save_figure(fig, out_dir, "acc_vs_length") if any_ else _close(fig)
    # accuracy vs depth at the training length
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True)
    any_ = False
    for ax, task in zip(axes, panels):
        for n, (name, r) in enumerate(results.items()):
            x, s = _depth_points(r, task, ctx)
            if x:
                band_plot(ax, x, s, label=name, marker=MARKERS[n % len(MARKERS)])
                any_ = True
        ax.set_xlabel("needle depth (0 = start of the haystack, 1 = just before the question)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{TASK_TITLES[task]} @ {ctx}", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("accuracy (whole answer right)")
    _legend(axes[-1])
    files["acc_vs_depth"] = save_figure(fig, out_dir, "acc_vs_depth") if any_ else _close(fig)
    for task in panels:
        files[f"niah_{task}"] = heatmap(results, out_dir, task, ctx)
    files["ppl_ratio"] = ppl_ratio(results, out_dir, ctx, ppl_source(meta))
    files["far_mass"] = far_mass(results, out_dir, ctx)
    files["loss_curves"] = loss_curves({name: {s: Path(out_dir) / r["run_dir"] for s, r in runs.items()}
                                        for name, runs in per_seed.items()}, out_dir)
    return {k: v for k, v in files.items() if v}


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _close(fig) -> list[str]:
    plt.close(fig)
    return []


def heatmap(results: dict, out_dir: Path, task: str, ctx: int) -> list[str]:
    """One panel per scheme: accuracy (mean over seeds) by length (x) and depth (y)."""
    grids = {}
    for name, r in results.items():
        m = (r.get("mean") or {}).get("retrieval") or {}
        tasks = list(TASKS) if task == "all" else [task]
        cells: dict[tuple[int, float], list[float]] = {}
        for t in tasks:
            for L, rec in ((m.get("tasks") or {}).get(t) or {}).items():
                for d, v in (rec.get("depths") or {}).items():
                    if v.get("accuracy") is not None:
                        cells.setdefault((int(L), float(d)), []).append(v["accuracy"])
        if cells:
            grids[name] = {k: sum(v) / len(v) for k, v in cells.items()}
    if not grids:
        return []
    lengths = sorted({L for g in grids.values() for L, _ in g})
    depths = sorted({d for g in grids.values() for _, d in g})
    n = len(grids)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    fig.subplots_adjust(wspace=0.45, hspace=0.55)
    im = None
    for ax, (name, g) in zip(axes.flat, grids.items()):
        z = [[g.get((L, d), float("nan")) for L in lengths] for d in depths]
        im = ax.imshow(z, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="RdYlGn")
        ax.set_xticks(range(len(lengths)))
        ax.set_xticklabels([f"{L / ctx:g}x" for L in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)))
        ax.set_yticklabels([f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel(f"length (x training length {ctx})", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(name, fontsize=9)
        for i, d in enumerate(depths):
            for j, L in enumerate(lengths):
                v = g.get((L, d))
                if v is not None:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"Needle in a haystack: {TASK_TITLES[task]} (accuracy, mean over seeds)", fontsize=10)
    fig.colorbar(im, ax=list(axes.flat), shrink=0.8, label="accuracy")
    return save_figure(fig, out_dir, f"niah_{task}")


def ppl_source(meta: dict) -> str:
    """What the perplexity was measured on: the mixture's text corpus, or its first task's rows."""
    from pedsl.data.stream import TASK_SOURCES, parse_mixture

    data = meta.get("data") or "stdlib"
    mix = parse_mixture(data) or [(data, 1.0)]
    if any(n not in TASK_SOURCES for n, _ in mix):
        return "the text corpus"
    return f"{mix[0][0]} rows (the mixture has no text)"


def ppl_ratio(results: dict, out_dir: Path, ctx: int, on: str = "the text corpus") -> list[str]:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths: set[int] = set()
    for n, (name, r) in enumerate(results.items()):
        sp = ((r.get("spread") or {}).get("eval") or {}).get("ppl") or {}
        pts = sorted((int(L), v["ratio"]) for L, v in sp.items() if isinstance(v, dict) and v.get("ratio"))
        if pts:
            band_plot(ax, [p[0] for p in pts], [p[1] for p in pts], label=name, marker=MARKERS[n % len(MARKERS)])
            lengths |= {p[0] for p in pts}
    if not lengths:
        return _close(fig)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    length_axis(ax, sorted(lengths))
    mark_train(ax, ctx)
    ax.set_ylabel("perplexity ratio ppl(L) / ppl(L_train) (log scale)")
    ax.set_title(f"Perplexity on {on} (band: min-max over seeds)")
    _legend(ax)
    return save_figure(fig, out_dir, "ppl_ratio")


def far_mass(results: dict, out_dir: Path, ctx: int) -> list[str]:
    series, W = {}, None
    for name, r in results.items():
        an = (r.get("spread") or {}).get("analysis") or {}
        fm = (an.get("summary") or {}).get("far_mass") or {}
        pts = sorted((int(L), v) for L, v in fm.items() if isinstance(v, dict))
        if pts:
            series[name] = pts
            W = ((r.get("mean") or {}).get("analysis") or {}).get("far_window", W)
    return far_mass_figure(series, W, ctx, out_dir, "Far attention mass vs length (band: min-max over seeds)",
                           legend_size=7)


# ---------------------------------------------------------------------------------------------
# Tables


def _cell(r: dict, part: str, *path: str) -> dict | None:
    return sd.spread_at((r.get("spread") or {}).get(part), *path)


def tables(results: dict, meta: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    ctx = meta["context"]
    out = []
    ref = "rope" if "rope" in results else next(iter(results), None)
    several = len(meta.get("seeds") or []) > 1
    flag_note = (f" (n.s.) marks a difference from {ref} within the spread (min-max ranges overlap): not "
                 "significant." if several else " One seed: no spread, no significance claimed.")
    for task in ["all"] + list(TASKS):
        lens = sorted({L for r in results.values() for L in _acc_points(r, task)[0]})
        if not lens:
            continue
        header = ["scheme"] + [f"{L} ({L / ctx:g}x)" for L in lens]
        rows = []
        for name, r in results.items():
            row = [name]
            for L in lens:
                path = ("overall", str(L), "accuracy") if task == "all" else ("tasks", task, str(L), "accuracy")
                s = _cell(r, "retrieval", *path)
                mark = "" if name == ref else sd.flag(s, _cell(results[ref], "retrieval", *path))
                row.append(sd.fmt(s, ".2f") + mark)
            rows.append(row)
        out.append((f"Retrieval accuracy vs length: {TASK_TITLES[task]}", header, rows,
                    "Whole answer right (5 digits, greedy); mean [min, max] over seeds "
                    f"{meta.get('seeds')}, {meta.get('samples')} samples per length and depth, depths "
                    f"{meta.get('depths')} averaged. Chance is 1e-5 (a digit: 0.1)." + flag_note))
    depths = sorted({d for r in results.values() for d in _depth_points(r, "all", ctx)[0]})
    if depths:
        header = ["scheme"] + [f"depth {d:g}" for d in depths]
        rows = []
        for name, r in results.items():
            x, s = _depth_points(r, "all", ctx)
            by = dict(zip(x, s))
            rows.append([name] + [sd.fmt(by.get(d), ".2f") for d in depths])
        out.append((f"Accuracy vs needle depth at the training length {ctx} (mean over tasks)", header, rows,
                    "0 = the needle opens the haystack, 1 = it stands right before the question."))
    lens = sorted({int(L) for r in results.values() for L in (((r.get("mean") or {}).get("eval") or {}).get("ppl") or {})})
    if lens:
        header = ["scheme", f"ppl @ {ctx}"] + [f"{L} ({L / ctx:g}x)" for L in lens if L != ctx]
        rows = []
        for name, r in results.items():
            row = [name, sd.fmt(_cell(r, "eval", "ppl", str(ctx), "ppl"), ".3f")]
            for L in lens:
                if L == ctx:
                    continue
                s = _cell(r, "eval", "ppl", str(L), "ratio")
                mark = "" if name == ref else sd.flag(s, _cell(results[ref], "eval", "ppl", str(L), "ratio"))
                row.append(sd.fmt(s, ".2f") + mark)
            rows.append(row)
        out.append((f"Perplexity ratio ppl(L) / ppl(L_train) on {ppl_source(meta)}", header, rows,
                    "The last L_train bytes of the same validation windows at every length." + flag_note))
    al = sorted({int(L) for r in results.values() for L in ((((r.get("mean") or {}).get("analysis") or {})
                                                              .get("summary") or {}).get("far_mass") or {})})
    if al:
        header = (["scheme"] + [f"far mass @ {L}" for L in al]
                  + [f"sink @ {al[-1]}", f"k sigma_1 @ {al[-1]}", f"k stable rank @ {al[-1]}"])
        rows = []
        for name, r in results.items():
            rows.append([name] + [sd.fmt(_cell(r, "analysis", "summary", "far_mass", str(L)), ".3f") for L in al]
                        + [sd.fmt(_cell(r, "analysis", "summary", key, str(al[-1])), spec)
                           for key, spec in (("sink_mass", ".3f"), ("k_sigma1", ".1f"), ("k_stable_rank", ".2f"))])
        W = next((((r.get("mean") or {}).get("analysis") or {}).get("far_window") for r in results.values()), None)
        out.append(("Instruments on the same runs (mean over layers and heads)", header, rows,
                    f"Far mass: attention beyond W = {W:g} tokens; sink: attention on the first token; sigma_1 and "
                    "stable rank ||K||_F^2 / sigma_1^2 of the post-transport keys."))
    header = ["scheme", "seeds", "steps", "val loss (nats/byte)", "train time (s)", "eval + retrieval + analysis (s)"]
    rows = []
    for name, r in results.items():
        t = (r.get("mean") or {}).get("train") or {}
        other = sum(((r.get("mean") or {}).get(k) or {}).get("wall_time_s") or 0 for k in ("eval", "retrieval", "analysis"))
        steps = t.get("steps")
        rows.append([name, ",".join(str(s) for s in r.get("seeds", [])), f"{steps:.0f}" if steps else "-",
                     sd.fmt(_cell(r, "train", "val_loss"), ".3f"), f"{t.get('wall_time_s') or 0:.0f}", f"{other:.0f}"])
    mixed = ":" in str(meta.get("data") or "")
    out.append(("Training runs (times: mean per seed)", header, rows,
                f"Data: {meta.get('data')}" + (" (the validation loss is on the mixture)." if mixed else ".")))
    return out


CAPTIONS = {"acc_vs_length": "Accuracy vs length (band: min-max over seeds)",
            "acc_vs_depth": "Accuracy vs needle depth at the training length",
            "niah_all": "Needle in a haystack, mean over tasks", "niah_passkey": "Needle in a haystack: passkey",
            "niah_multikey": "Needle in a haystack: multi-key", "niah_kv": "Needle in a haystack: key-value",
            "ppl_ratio": "Perplexity ratio vs length", "far_mass": "Far attention mass vs length", "loss_curves": "Loss curves, one panel per scheme, a line per run"}


def _title(meta: dict, n: int) -> str:
    study = meta.get("study")
    return (f"pedsl compare --study {study}" if study and study != "default" else "pedsl compare") + \
        f": {n} schemes, seeds {meta.get('seeds')}"


def _intro(meta: dict, n: int) -> str:
    return (f"Preset `{meta.get('preset')}`, {meta.get('steps')} steps, training length {meta['context']} bytes, "
            f"seeds {meta.get('seeds')}, data: `{meta.get('data')}`. This invocation took "
            f"{meta.get('wall_time_s', 0):.0f} s ({meta.get('cpu_time_s', 0):.0f} s CPU); all runs' training, "
            f"evaluation and analysis took {meta.get('compute_time_s', 0):.0f} s in total.")


def markdown(results: dict, meta: dict, plots: dict[str, list[str]]) -> str:
    md = [f"# {_title(meta, len(results))}", "", _intro(meta, len(results)), ""]
    md += md_sections(tables(results, meta))
    md += ["## Plots", ""]
    for key, files in plots.items():
        png = [f for f in files if f.endswith(".png")]
        if png:
            md += [f"### {CAPTIONS.get(key, key)}", "", f"![{CAPTIONS.get(key, key)}]({png[0]})", ""]
    md += ["## Reproduce", "", "```", meta.get("command", ""), "```", "", f"- git commit: {meta.get('git') or 'unknown'}",
           f"- pedsl {meta.get('pedsl')}, torch {meta.get('torch')}, python {meta.get('python')}, "
           f"{meta.get('platform')}, {meta.get('cpus')} CPUs, torch threads {meta.get('threads')}",
           f"- date: {meta.get('date')}", ""]
    return "\n".join(md)


def html_page(results: dict, meta: dict, plots: dict[str, list[str]]) -> str:
    e = _html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
             f"<title>{e(_title(meta, len(results)))}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;"
             "line-height:1.45;color:#222}table{border-collapse:collapse;margin:.5em 0 1em}"
             "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;font-variant-numeric:tabular-nums}"
             "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
             "img{max-width:100%;border:1px solid #eee}.note{color:#555;font-size:.92em}</style></head><body>",
             f"<h1>{e(_title(meta, len(results)))}</h1>", f"<p>{e(_intro(meta, len(results)))}</p>"]
    parts += html_sections(tables(results, meta))
    parts.append("<h2>Plots</h2>")
    for key, files in plots.items():
        png = [f for f in files if f.endswith(".png")]
        if png:
            parts.append(f"<figure><img src='{e(png[0])}' alt='{e(key)}'><figcaption class='note'>"
                         f"{e(CAPTIONS.get(key, key))}</figcaption></figure>")
    parts += ["<h2>Reproduce</h2>", f"<pre>{e(meta.get('command', ''))}</pre><ul>",
              f"<li>git commit: {e(str(meta.get('git') or 'unknown'))}</li>",
              f"<li>date: {e(str(meta.get('date')))}</li></ul></body></html>"]
    return "\n".join(parts)

