"""The study's report: DIR/report.md and DIR/report.html from the runs' JSON results.

Tables (one row per scheme): perplexity ratio at each length (and the training-length
perplexity), retrieval accuracy at each length, the instruments (far mass, sink mass, key stable
rank per analysis length; log-mean rotary frequency), the training runs. Then the plots, a
check of the papers' expected direction, and how to reproduce (command, git commit, versions,
date). The HTML page is self-contained apart from the PNG files next to it.
"""

from __future__ import annotations

import html
import math
from typing import Any

Results = dict[str, dict[str, Any]]


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def _lengths(results: Results, part: str, key: str) -> list[int]:
    return sorted({int(k) for r in results.values() for k in ((r.get(part) or {}).get(key) or {})})


def tables(results: Results, context: int) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, note) for every table of the report."""
    out = []
    lens = _lengths(results, "eval", "ppl")
    if lens:
        header = ["scheme", f"ppl @ {context}"] + [f"{L} ({L / context:g}x)" for L in lens]
        rows = []
        for name, r in results.items():
            ppl = (r.get("eval") or {}).get("ppl") or {}
            base = (ppl.get(str(context)) or {}).get("ppl")
            rows.append([name, _fmt(base)] + [_fmt((ppl.get(str(L)) or {}).get("ratio")) for L in lens])
        out.append(("Perplexity ratio ppl(L) / ppl(L_train)", header, rows,
                    "Each length scores the same last L_train bytes of the same validation windows; "
                    "values near 1 (or below) mean the extra context does not hurt."))
    for task, key, chance, title in (("passkey", "digit_accuracy", 0.1, "Passkey retrieval: fraction of answer digits right"),
                                     ("blocks", "accuracy", 1 / 26, "Block task: fraction of block ends right")):
        tl = _lengths(results, "eval", task)
        if not tl:
            continue
        header = ["scheme"] + [f"{L} ({L / context:g}x)" for L in tl] + ["answer NLL @ max"]
        rows = []
        for name, r in results.items():
            d = (r.get("eval") or {}).get(task) or {}
            last = d.get(str(tl[-1])) or {}
            rows.append([name] + [_fmt((d.get(str(L)) or {}).get(key), ".2f") for L in tl]
                        + [_fmt(last.get("answer_nll"), ".2f")])
        out.append((title, header, rows, f"Chance is {chance:.2f}. The models were trained on the text corpus, "
                    "not on this task: accuracy near chance is expected at this scale; the answer loss "
                    "(nats per answer byte) still shows whether longer context hurts."))
    al = _lengths(results, "analysis", "lengths") or sorted(
        {int(L) for r in results.values() for L in ((r.get("analysis") or {}).get("lengths") or [])})
    if al:
        W = next((r["analysis"].get("far_window") for r in results.values() if r.get("analysis")), None)
        header = (["scheme"] + [f"far mass @ {L}" for L in al] + [f"sink @ {al[-1]}", f"k stable rank @ {al[-1]}",
                                                                   "log-mean freq (period)"])
        rows = []
        for name, r in results.items():
            s = (r.get("analysis") or {}).get("summary") or {}
            fe = s.get("frequency_energy") or []
            lmf = "; ".join(f"{f['log_mean_freq']:.2f} ({2 * math.pi / math.exp(f['log_mean_freq']):.0f} tok)"
                            for f in fe if f.get("log_mean_freq") is not None) or "-"
            rows.append([name] + [_fmt((s.get("far_mass") or {}).get(str(L))) for L in al]
                        + [_fmt((s.get("sink_mass") or {}).get(str(al[-1]))),
                           _fmt((s.get("k_stable_rank") or {}).get(str(al[-1])), ".2f"), lmf])
        out.append(("Instruments (mean over layers and heads)", header, rows,
                    f"Far mass: attention beyond W = {W} tokens, averaged over all queries (uniform attention "
                    "gives (1/L) sum_i max(0, i - W)/(i + 1)). Sink: attention on the first token. Stable rank "
                    "||K||_F^2 / sigma_1^2 of post-transport keys. Log-mean frequency: sum_k E_k ln w_k over "
                    "position-indexed rotary pairs (period 2 pi / exp of it)."))
    header = ["scheme", "steps", "val loss (nats/byte)", "unigram baseline", "parameters", "train time (s)",
              "eval time (s)", "analysis time (s)", "run"]
    rows = []
    for name, r in results.items():
        t = r.get("train") or {}
        rows.append([name, str(t.get("steps", "-")), _fmt(t.get("val_loss")), _fmt(t.get("unigram_baseline")),
                     f"{t['n_params']:,}" if t.get("n_params") else "-", _fmt(t.get("wall_time_s"), ".0f"),
                     _fmt((r.get("eval") or {}).get("wall_time_s"), ".0f"),
                     _fmt((r.get("analysis") or {}).get("wall_time_s"), ".0f"), str(r.get("run_dir", "-"))])
    out.append(("Training runs", header, rows, "Same data, seed and budget for every scheme."))
    return out


def findings(results: Results, context: int) -> list[str]:
    """The papers' expected direction, checked on the measured ratios at 8x and 16x."""
    lines = []

    def ratio(name: str, mult: int) -> float | None:
        r = results.get(name) or {}
        return ((r.get("eval") or {}).get("ppl") or {}).get(str(context * mult), {}).get("ratio")

    acc = [n for n in results if n.startswith("acc_") or n == "path"]
    for mult in (8, 16):
        rope, alibi = ratio("rope", mult), ratio("alibi", mult)
        if rope is None or alibi is None:
            continue
        parts = [f"At {mult}x ({context * mult} tokens): RoPE {rope:.2f}, ALiBi {alibi:.2f}"]
        parts += [f"{n} {ratio(n, mult):.2f}" for n in acc if ratio(n, mult) is not None]
        others = [n for n in results if n not in acc and n not in ("rope", "alibi") and ratio(n, mult) is not None]
        if others:
            parts.append("not part of the check: " + ", ".join(f"{n} {ratio(n, mult):.2f}" for n in others))
        checks = [("RoPE far above ALiBi", rope > 2 * alibi), ("ALiBi near 1", abs(alibi - 1) < 0.15)]
        between = [n for n in acc if ratio(n, mult) is not None and alibi - 0.05 <= ratio(n, mult) <= rope]
        if acc:
            checks.append((f"accumulated schemes between ({len(between)}/{len([n for n in acc if ratio(n, mult) is not None])})",
                           len(between) == len([n for n in acc if ratio(n, mult) is not None])))
        lines.append(", ".join(parts) + ". " + "; ".join(f"{c}: {'yes' if ok else 'NO'}" for c, ok in checks) + ".")
    return lines


def markdown(results: Results, meta: dict, plots: dict[str, list[str]]) -> str:
    ctx = meta["context"]
    md = [f"# pedsl compare: {len(results)} schemes past the training length", "",
          f"Preset `{meta.get('preset')}`, {meta.get('steps')} steps, training length {ctx} bytes, data: "
          f"{meta.get('data')}, seed {meta.get('seed')}. This invocation took {meta.get('wall_time_s', 0):.0f} s ({meta.get('cpu_time_s', 0):.0f} s CPU); training + evaluation + analysis of all runs "
          f"took {meta.get('compute_time_s', 0):.0f} s in total (runs reused from an earlier invocation count too).", ""]
    md += md_sections(tables(results, ctx))
    f = findings(results, ctx)
    if f:
        md += ["## Expected direction (papers: RoPE >> accumulated > ALiBi ~ 1 past the training length)", ""]
        md += [f"- {line}" for line in f] + [""]
    md += ["## Plots", ""]
    captions = {"ppl_ratio": "Perplexity ratio vs length", "far_mass": "Far attention mass vs length",
                "freq_energy": "Frequency energy spectra",
                "decoherence": "Score decoherence (raw scores vs distance)", "retrieval": "Retrieval accuracy vs length",
                "loss_curves": "Training and validation loss per run"}
    for key, files in plots.items():
        png = [x for x in files if x.endswith(".png")]
        svg = [x for x in files if x.endswith(".svg")]
        if png:
            md += [f"### {captions.get(key, key)}", "", f"![{captions.get(key, key)}]({png[0]})", "",
                   f"(vector: [{svg[0]}]({svg[0]}))" if svg else "", ""]
    md += reproduce_md(meta)
    return "\n".join(md)



def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table as lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def md_sections(tables: list[tuple[str, list[str], list[list[str]], str]]) -> list[str]:
    """Markdown lines of ``(title, header, rows, note)`` tables, one section each."""
    out: list[str] = []
    for title, header, rows, note in tables:
        out += [f"## {title}", "", *md_table(header, rows), "", note, ""]
    return out


def html_sections(tables: list[tuple[str, list[str], list[list[str]], str]]) -> list[str]:
    """The same tables as HTML parts."""
    e = html.escape
    return [p for title, header, rows, note in tables
            for p in (f"<h2>{e(title)}</h2>", html_table(header, rows), f"<p class='note'>{e(note)}</p>")]


def md_images(files: list[str]) -> list[str]:
    """The report's "Plots" section: every PNG of ``files`` (Markdown lines)."""
    return ["## Plots", ""] + [f"![{x}]({x})" for x in files if x.endswith(".png")] + [""]


def html_images(files: list[str]) -> list[str]:
    e = html.escape
    return ["<h2>Plots</h2>"] + [f"<figure><img src='{e(x)}' alt='{e(x)}'></figure>" for x in files
                                 if x.endswith(".png")]


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table, every cell escaped."""
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")

def reproduce_md(meta: dict) -> list[str]:
    """The report's "Reproduce" section: command, git commit, versions, date (Markdown lines)."""
    return ["## Reproduce", "", "```", meta.get("command", ""), "```", "",
            f"- git commit: {meta.get('git') or 'unknown'}",
            f"- pedsl {meta.get('pedsl')}, torch {meta.get('torch')}, python {meta.get('python')}, "
            f"{meta.get('platform')}, {meta.get('cpus')} CPUs, torch threads {meta.get('threads')}",
            f"- date: {meta.get('date')}", ""]


STYLE = ("<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
         "line-height:1.45;color:#222}table{border-collapse:collapse;margin:.5em 0 1em}"
         "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;font-variant-numeric:tabular-nums}"
         "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
         "img{max-width:100%;border:1px solid #eee}.note{color:#555;font-size:.92em}"
         "pre{background:#f6f6f6;padding:.6em;overflow-x:auto}</style>")


def reproduce_html(meta: dict) -> list[str]:
    """The "Reproduce" section as HTML, closing the page."""
    e = html.escape
    return ["<h2>Reproduce</h2>", f"<pre>{e(meta.get('command', ''))}</pre><ul>",
            f"<li>git commit: {e(str(meta.get('git') or 'unknown'))}</li>",
            f"<li>pedsl {e(str(meta.get('pedsl')))}, torch {e(str(meta.get('torch')))}, python "
            f"{e(str(meta.get('python')))}, {e(str(meta.get('platform')))}, {e(str(meta.get('cpus')))} CPUs, "
            f"torch threads {e(str(meta.get('threads')))}</li>",
            f"<li>date: {e(str(meta.get('date')))}</li></ul></body></html>"]


def to_html(results: Results, meta: dict, plots: dict[str, list[str]]) -> str:
    ctx = meta["context"]
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
             f"<title>pedsl compare: {len(results)} schemes</title>",
             STYLE + "</head><body>",
             f"<h1>pedsl compare: {len(results)} schemes past the training length</h1>",
             f"<p>Preset <code>{e(str(meta.get('preset')))}</code>, {e(str(meta.get('steps')))} steps, training "
             f"length {ctx} bytes, data: {e(str(meta.get('data')))}, seed {e(str(meta.get('seed')))}. "
             f"This invocation took {meta.get('wall_time_s', 0):.0f} s ({meta.get('cpu_time_s', 0):.0f} s CPU); training + evaluation + analysis of all runs took "
             f"{meta.get('compute_time_s', 0):.0f} s in total.</p>"]
    parts += html_sections(tables(results, ctx))
    f = findings(results, ctx)
    if f:
        parts.append("<h2>Expected direction (papers: RoPE &gt;&gt; accumulated &gt; ALiBi ~ 1)</h2><ul>")
        parts += [f"<li>{e(x)}</li>" for x in f]
        parts.append("</ul>")
    parts.append("<h2>Plots</h2>")
    for key, files in plots.items():
        png = [x for x in files if x.endswith(".png")]
        svg = [x for x in files if x.endswith(".svg")]
        if png:
            parts.append(f"<figure><img src='{e(png[0])}' alt='{e(key)}'><figcaption class='note'>{e(key)}"
                         + (f" (<a href='{e(svg[0])}'>SVG</a>)" if svg else "") + "</figcaption></figure>")
    parts += reproduce_html(meta)
    return "\n".join(parts)
