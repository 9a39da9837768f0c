"""The frequency study's report, ``DIR/frequency.md``: the fits and every run's measure."""

from __future__ import annotations

import math


def report(res: dict) -> str:
    f, fa, fl, meta = res["fit"], res["fit_all_channel"], res["fit_learned"], res["meta"]
    fp = res.get("fit_peak")

    def line(name, fit):
        return (f"| {name} | {fit['slope']:.3f} +- {fit['slope_se']:.3f} | [{fit['slope_ci95'][0]:.3f}, "
                f"{fit['slope_ci95'][1]:.3f}] | {fit['c']:.3g} [{fit['c_ci95'][0]:.3g}, {fit['c_ci95'][1]:.3g}] | "
                f"{fit['r2']:.3f} | {fit['runs']} |")

    rows = ["# Frequency law: RoPE frequency use vs dependency width", "",
            f"`{meta['command']}` ({meta['wall_time_s']:.0f} s; git {meta['git']}; torch {meta['torch']}).",
            f"Task {meta['task']}, widths {meta['widths']} (lag: W = width; blocks: W = B - 1), "
            f"seeds {meta['seeds']}; training: "
            + ", ".join(f"{k} {v}" for k, v in meta["training"].items() if k != "params") + ".", "",
            "| measure | slope (+- s.e.) | slope 95% (bootstrap) | c = geo-mean(theta W) [95%] | R^2 | runs |",
            "|---|---|---|---|---|---|", line("positional energy", f), line("all-channel energy", fa)]
    if fp:
        rows.append(line("peak of the positional energy", fp))
    if fl:
        rows.append(line("positional, runs with copy accuracy >= 0.5", fl))
    rows += ["", "The law predicts slope -1 and c near pi (3.14).", "",
             "| width | seed | theta (positional) | period | pi / W | theta (all-channel) | copy acc. | answer nll |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        th = math.exp(r["log_freq"])
        rows.append(f"| {r['block_len']} | {r['seed']} | {th:.4g} | {2 * math.pi / th:.1f} | {math.pi / r['W']:.4g} | "
                    f"{math.exp(r['all_channel_log_freq']):.4g} | {r['copy_accuracy']:.2f} | {r['answer_nll']:.2f} |")
    rows += ["", "![frequency law](frequency.png)", ""]
    return "\n".join(rows)
