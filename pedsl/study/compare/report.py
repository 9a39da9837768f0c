"""The default study's report: DIR/report.md and DIR/report.html from the runs' JSON results.

Tables (one row per scheme): perplexity ratio at each length (and the training-length
perplexity), retrieval accuracy at each length, the instruments (far mass, sink mass, key stable
rank per analysis length; log-mean rotary frequency), the training runs. Then the plots, a
check of the papers' expected direction, and how to reproduce (command, git commit, versions,
date). The HTML page is self-contained apart from the PNG files next to it.
"""

from __future__ import annotations

import math
from typing import Any

from pedsl.study.page import Bullets, Page, Table, figures, fmt

Results = dict[str, dict[str, Any]]


def _lengths(results: Results, part: str, key: str) -> list[int]:
    return sorted({int(k) for r in results.values() for k in ((r.get(part) or {}).get(key) or {})})


def tables(results: Results, meta: dict) -> list[Table]:
    """Every table of the report."""
    context = meta["context"]
    out = []
    lens = _lengths(results, "eval", "ppl")
    if lens:
        header = ["scheme", f"ppl @ {context}"] + [f"{L} ({L / context:g}x)" for L in lens]
        rows = []
        for name, r in results.items():
            ppl = (r.get("eval") or {}).get("ppl") or {}
            base = (ppl.get(str(context)) or {}).get("ppl")
            rows.append([name, fmt(base)] + [fmt((ppl.get(str(L)) or {}).get("ratio")) for L in lens])
        out.append(Table("Perplexity ratio ppl(L) / ppl(L_train)", header, rows,
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
            rows.append([name] + [fmt((d.get(str(L)) or {}).get(key), ".2f") for L in tl]
                        + [fmt(last.get("answer_nll"), ".2f")])
        out.append(Table(title, header, rows, f"Chance is {chance:.2f}. The models were trained on the text corpus, "
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
            rows.append([name] + [fmt((s.get("far_mass") or {}).get(str(L))) for L in al]
                        + [fmt((s.get("sink_mass") or {}).get(str(al[-1]))),
                           fmt((s.get("k_stable_rank") or {}).get(str(al[-1])), ".2f"), lmf])
        out.append(Table("Instruments (mean over layers and heads)", header, rows,
                    f"Far mass: attention beyond W = {W} tokens, averaged over all queries (uniform attention "
                    "gives (1/L) sum_i max(0, i - W)/(i + 1)). Sink: attention on the first token. Stable rank "
                    "||K||_F^2 / sigma_1^2 of post-transport keys. Log-mean frequency: sum_k E_k ln w_k over "
                    "position-indexed rotary pairs (period 2 pi / exp of it)."))
    header = ["scheme", "steps", "val loss (nats/byte)", "unigram baseline", "parameters", "train time (s)",
              "eval time (s)", "analysis time (s)", "run"]
    rows = []
    for name, r in results.items():
        t = r.get("train") or {}
        rows.append([name, str(t.get("steps", "-")), fmt(t.get("val_loss")), fmt(t.get("unigram_baseline")),
                     f"{t['n_params']:,}" if t.get("n_params") else "-", fmt(t.get("wall_time_s"), ".0f"),
                     fmt((r.get("eval") or {}).get("wall_time_s"), ".0f"),
                     fmt((r.get("analysis") or {}).get("wall_time_s"), ".0f"), str(r.get("run_dir", "-"))])
    out.append(Table("Training runs", header, rows, "Same data, seed and budget for every scheme."))
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
        between = [n for n in acc if (r := ratio(n, mult)) is not None and alibi - 0.05 <= r <= rope]
        if acc:
            checks.append((f"accumulated schemes between ({len(between)}/{len([n for n in acc if ratio(n, mult) is not None])})",
                           len(between) == len([n for n in acc if ratio(n, mult) is not None])))
        lines.append(", ".join(parts) + ". " + "; ".join(f"{c}: {'yes' if ok else 'NO'}" for c, ok in checks) + ".")
    return lines


CAPTIONS = {"ppl_ratio": "Perplexity ratio vs length", "far_mass": "Far attention mass vs length",
            "freq_energy": "Frequency energy spectra", "decoherence": "Score decoherence (raw scores vs distance)",
            "retrieval": "Retrieval accuracy vs length", "loss_curves": "Training and validation loss per run"}


def intro(meta: dict) -> str:
    return (f"Preset `{meta.get('preset')}`, {meta.get('steps')} steps, training length {meta['context']} bytes, "
            f"data: {meta.get('data')}, seed {meta.get('seed')}. This invocation took {meta.get('wall_time_s', 0):.0f} s "
            f"({meta.get('cpu_time_s', 0):.0f} s CPU); training + evaluation + analysis of all runs took "
            f"{meta.get('compute_time_s', 0):.0f} s in total (runs reused from an earlier invocation count too).")


def page(results: Results, meta: dict, plots: dict[str, list[str]]) -> Page:
    blocks: list = list(tables(results, meta))
    blocks.append(Bullets("Expected direction (papers: RoPE >> accumulated > ALiBi ~ 1 past the training length)",
                          findings(results, meta["context"])))
    blocks.append(figures(plots, CAPTIONS, svg=True))
    return Page(f"pedsl compare: {len(results)} schemes past the training length", intro(meta), blocks, meta,
                html_title=f"pedsl compare: {len(results)} schemes")


__all__ = ["CAPTIONS", "findings", "page", "tables"]
