"""``pedsl compare --study frequency``: does the data's dependency width set the RoPE frequency used?

The law under test (the frequency-usage paper): with dependencies of width W the frequencies a
model uses concentrate near ``theta* = c / W`` (the paper fits c = 3.02, close to pi). The study
trains RoPE on a task with a single dependency distance W for a sweep of widths and seeds,
measures the energy-weighted log-mean frequency of each run, and fits ``ln theta = a + s ln W``
(the law: slope ``s = -1``, ``c = exp(a)``).

**The measure: positional energy.** The per-pair energy ``|q^(k)|^2 |k^(k)|^2`` of
:func:`pedsl.study.instruments.frequency_energy` counts every use of a pair, and content
channels (which match letters, not distances) dominate it: a probe with it gave a slope of only
-0.17 per ln B. Here each pair's contribution to the raw score is split into its part that depends
on the distance alone. With ``z_q = q_c1 + i q_c2`` and ``z_k`` likewise (before rotation), pair k
adds ``Re(z_q(i) conj(z_k(j)) e^{i w_k d})`` to the score of ``(i, j)``, ``d = i - j``. Averaged over
content - the batch and every query at distance d - that is ``m_k(d) = Re(G_k(d) e^{i w_k d})``
with ``G_k(d) = mean_{b, i} z_q(i) conj(z_k(i - d))`` (one FFT cross-correlation). The **positional
energy** of pair k is the variance of ``m_k(d)`` over the causal pairs (weights ``L - d``): the
energy of the distance-dependent part of the scores. Content matching between unrelated tokens averages out of ``G``
(random letters have no preferred phase); a constant bias (``w_k d`` ~ 0 over the window) has no
variance. Energies are summed over layers and heads (heads that use position dominate, idle ones
add little), normalised over pairs, and ``ln theta_run = sum_k E_k ln w_k``. The all-channel
energy is kept beside it (``all_channel_log_freq``) so the two can be compared.

**The tasks.** Default ``topic`` (:func:`pedsl.data.synthetic.topic_batch`), closest to the paper's latent
blocks: blocks of W tokens drawn from a per-block random set of 4 letters, so a token is best
predicted from the letters of the recent ~W tokens - a smooth, box-shaped kernel of width W (its
"copy accuracy" is the share of predictions that are a letter already seen in the block). The
letters carry no content beyond the block they belong to. ``--set task=lag``
(:func:`pedsl.data.synthetic.lag_batch`) is a *sharp* kernel: every letter repeats the letter W
back with probability 1/2, else it is a fresh random letter. Letters carry no content beyond the
copy, and every position can use the dependency, so the only thing to learn is "look W back": a
purely positional attention pattern with a dense training signal. ``--set task=blocks`` uses the
block task instead (:func:`pedsl.data.synthetic.block_batch`: the last letter of each unmarked block of B
copies its first, ``W = B - 1``); there the signal is one position in B and the block phase must be
inferred, and measured here a 1-layer model stayed at chance (copy accuracy 0.00-0.04 for B = 8,
32, 128 after 200 steps), so it has nothing to measure at this budget. The copy accuracy (the share
of predictions equal to the token W back) and the loss there are recorded per run, and the law is
also fitted on the runs that learned the copy (accuracy >= 0.5).

Measured here (README): the smooth kernel follows the law (peak slope -1.04 +- 0.12), the sharp
lag does not (-0.16): "exactly W back" is best told apart from W +- 1 by the fastest pairs,
whatever W is.

Layout: ``DIR/runs/<task><width>_s<seed>/`` (pedsl.train runs, reused when finished),
``DIR/frequency.json``, ``DIR/frequency.png|svg``, ``DIR/frequency.md``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pedsl.errors import ConfigError, UsageError
from pedsl.formulas import channel_pairs

WIDTHS = (8, 16, 32, 64)  # W: the block length (topic), the lag (lag), B - 1 (blocks)
SEEDS = (0, 1, 2)
# One small model for every width: 1 layer, 2 heads of 32 channels (16 rotary pairs), context 128
# (two blocks of the longest width). Measured here: a lag of 32 is learned in 600 steps at context
# 256, a lag of 128 is not (loss still ln 26 after 600 steps); so widths stop at 64.
DEFAULTS: dict[str, Any] = {"n_layers": 1, "d_model": 64, "n_heads": 2, "head_dim": 32, "context": 128,
                            "steps": 500, "batch_size": 16, "lr": 3e-3, "min_lr": 3e-4, "warmup": 30,
                            "eval_every": 100, "checkpoint_every": 500}
QUICK = {"widths": (8, 32, 64), "seeds": (0,), "steps": 300}
PROBE_SAMPLES = 8
STUDY_KEYS = ("task", "widths", "seeds", "probe_samples")  # --set keys of the study itself
# --set keys the study decides for each run itself (its DEFAULTS also cover every field of a preset)
RUN_KEYS = ("data", "source", "data.source", "block_len", "data.block_len", "seed", "preset")
MEASURE_VERSION = 2  # bump when measure_run changes: the study then re-measures (not retrains) its runs


# ------------------------------------------------------------------ the measure


def positional_energy(q, k, pairs: list[tuple[int, int]], freqs):
    """Per head and pair, the variance over causal (i, j) of the content-averaged score part of pair k:
    q, k (B, H, L, D) before rotation -> (H, P), not normalised (see the module docstring)."""
    import torch

    F64, C128 = torch.float64, torch.complex128
    c1 = torch.tensor([p[0] for p in pairs])
    c2 = torch.tensor([p[1] for p in pairs])
    zq = torch.complex(q.to(F64)[..., c1], q.to(F64)[..., c2])  # (B, H, L, P)
    zk = torch.complex(k.to(F64)[..., c1], k.to(F64)[..., c2])
    B, H, L, P = zq.shape
    n = 2 * L
    corr = torch.fft.ifft(torch.fft.fft(zq, n=n, dim=2) * torch.fft.fft(zk, n=n, dim=2).conj(), dim=2)[:, :, :L]
    d = torch.arange(L, dtype=F64)
    count = (L - d)  # pairs (i, i - d) per row
    G = corr.sum(0) / (B * count)[None, :, None]  # (H, L, P): mean_{b, i} z_q(i) conj(z_k(i - d))
    w = torch.as_tensor(list(freqs), dtype=F64)
    m = (G * torch.exp(1j * d[:, None] * w[None, :]).to(C128)[None]).real  # (H, L, P)
    wt = (count / count.sum())[None, :, None]
    mean = (m * wt).sum(1, keepdim=True)
    return ((m - mean) ** 2 * wt).sum(1)  # (H, P)


def positional_energy_reference(q, k, pairs, freqs):
    """The same by explicit loops over (b, h, i, j) in float64: the obviously-correct reference."""
    import torch

    B, H, L, _ = q.shape
    out = torch.zeros(H, len(pairs), dtype=torch.float64)
    for h in range(H):
        for p, (a, b2) in enumerate(pairs):
            w = float(freqs[p])
            sums = [0.0] * L
            for bb in range(B):
                for i in range(L):
                    for j in range(i + 1):
                        d = i - j
                        # the score of pair p between the rotated q_i and k_j
                        ci, si = math.cos(w * i), math.sin(w * i)
                        cj, sj = math.cos(w * j), math.sin(w * j)
                        qa, qb = float(q[bb, h, i, a]), float(q[bb, h, i, b2])
                        ka, kb = float(k[bb, h, j, a]), float(k[bb, h, j, b2])
                        rq = (qa * ci - qb * si, qa * si + qb * ci)
                        rk = (ka * cj - kb * sj, ka * sj + kb * cj)
                        sums[d] += rq[0] * rk[0] + rq[1] * rk[1]
            m = [sums[d] / (B * (L - d)) for d in range(L)]
            wts = [(L - d) for d in range(L)]
            tot = sum(wts)
            mean = sum(x * y for x, y in zip(m, wts)) / tot
            out[h, p] = sum(y * (x - mean) ** 2 for x, y in zip(m, wts)) / tot
    return out


def log_mean_frequency(energy: np.ndarray, freqs: np.ndarray) -> float:
    """``sum_k E_k ln w_k`` with E normalised over the pairs with ``w_k > 0``."""
    ok = freqs > 0
    e = energy[ok] / energy[ok].sum()
    return float((e * np.log(freqs[ok])).sum())


# ------------------------------------------------------------------ the fit


def fit_law(W: np.ndarray, theta: np.ndarray, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """OLS of ``ln theta`` on ``ln W`` and the constant ``c`` of ``theta = c / W``.

    Returns the slope with its standard error and a bootstrap 95% interval (resampling runs), the
    intercept, ``c_free = exp(intercept)``, and ``c`` = the geometric mean of ``theta * W`` (the law's
    slope -1 imposed) with its bootstrap 95% interval, and ``r2``.
    """
    x, y = np.log(np.asarray(W, float)), np.log(np.asarray(theta, float))
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        raise ConfigError("the frequency law needs at least 3 runs over at least 2 widths",
                          hint="run more widths or seeds")
    slope, icpt = np.polyfit(x, y, 1)
    res = y - (icpt + slope * x)
    se = math.sqrt(float(res @ res) / (n - 2) / float(((x - x.mean()) ** 2).sum())) if n > 2 else float("nan")
    r2 = 1 - float(res @ res) / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) > 0 else float("nan")
    rng = np.random.default_rng(seed)
    slopes, cs = [], []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        cs.append(math.exp(float((y[i] + x[i]).mean())))
        if np.ptp(x[i]) > 0:
            slopes.append(float(np.polyfit(x[i], y[i], 1)[0]))
    ci = lambda v: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]  # noqa: E731
    return {"slope": float(slope), "slope_se": se, "slope_ci95": ci(slopes), "intercept": float(icpt),
            "c_free": math.exp(float(icpt)), "c": math.exp(float((y + x).mean())), "c_ci95": ci(cs),
            "r2": r2, "runs": n}


# ------------------------------------------------------------------ one run


def measure_run(run: Path, width: int, task: str = "lag", *, samples: int = PROBE_SAMPLES, seed: int = 1234) -> dict:
    """Positional and all-channel log-mean frequency of a finished run, and how well it copies:
    ``copy_accuracy`` is the share of predictions equal to the token W back (lag: every position
    from W on; blocks: the block ends), ``answer_nll`` the loss there (nats; chance ln 26)."""
    import torch

    from pedsl.data.stream import make_generator
    from pedsl.data.synthetic import block_batch, lag_batch, topic_batch
    from pedsl.study import instruments as ins
    from pedsl.study.common import open_run

    model, cfg, meta = open_run(run)
    L = cfg.context
    g = make_generator(seed, width, L)
    if task == "blocks":
        tokens = block_batch(samples, L + 1, block_len=width, g=g)["tokens"]
        pos = torch.arange(width - 1, L + 1, width)
        pos = pos[pos >= width]
        dist = width - 1
    elif task == "topic":
        tokens = topic_batch(samples, L + 1, block_len=width, g=g)
        pos = torch.arange(1, L + 1)
        pos = pos[pos % width != 0]  # every token but a block's first has its block's letters before it
        dist = width
    else:
        tokens = lag_batch(samples, L + 1, lag=width, g=g)
        pos = torch.arange(width, L + 1)
        dist = width
    with torch.no_grad():
        captured = model.capture(tokens[:, :-1])
        logits = model(tokens[:, :-1])
    pred = logits[:, pos - 1].argmax(-1)  # the byte at p is predicted from the logits at p - 1
    if task == "topic":  # the prediction is one of the letters already seen in the block
        start = (pos // width) * width
        seen = torch.stack([(tokens[:, s:p] == pred[:, n:n + 1]).any(1) for n, (s, p) in
                            enumerate(zip(start.tolist(), pos.tolist()))], 1)
        acc = float(seen.float().mean())
    else:
        acc = float((pred == tokens[:, pos - dist]).float().mean())
    nll = float(torch.nn.functional.cross_entropy(logits[:, pos - 1].reshape(-1, logits.shape[-1]),
                                                  tokens[:, pos].reshape(-1)))
    pe_tot, all_tot, freqs = None, None, None
    for blk, cap in zip(model.blocks, captured):
        for g in blk.attn.pe.rotary_groups():
            pairs = channel_pairs(g["channels"], g["layout"])
            f = np.asarray(g["freqs"], dtype=np.float64)
            e_pos = positional_energy(cap["q"], cap["k"], pairs, f).sum(0).numpy()  # (P,), summed over heads
            e_all = ins.frequency_energy(cap["q"], cap["k"], pairs).mean(0).numpy()
            pe_tot = e_pos if pe_tot is None else pe_tot + e_pos
            all_tot = e_all if all_tot is None else all_tot + e_all
            freqs = f
    if freqs is None:
        raise ConfigError(f"run '{run}' has no position-indexed rotary group to measure",
                          hint="the frequency study trains rope.pe")
    return {"task": task, "block_len": width, "W": dist, "freqs": freqs.tolist(),
            "positional_energy": (pe_tot / pe_tot.sum()).tolist(),
            "all_channel_energy": (all_tot / all_tot.sum()).tolist(),
            "log_freq": log_mean_frequency(pe_tot, freqs),
            "peak_log_freq": float(np.log(freqs[int(np.argmax(pe_tot))])),
            "all_channel_log_freq": log_mean_frequency(all_tot, freqs),
            "copy_accuracy": acc, "answer_nll": nll, "chance_nll": math.log(26)}


# ------------------------------------------------------------------ the study


def run_frequency_study(out: str | Path, *, steps: int | None = None, quick: bool = False,
                        sets: dict | None = None, command: str | None = None, quiet: bool = True,
                        say: Callable[[str], None] = lambda m: None) -> dict:
    """Train RoPE over widths x seeds, measure, fit, plot and write the report."""
    from pedsl.study.common import read_json, write_json, write_text
    from pedsl.study.compare import _git_commit, _train_one, _versions
    from pedsl.lang.library import library_dir

    t0 = time.perf_counter()
    sets = dict(sets or {})
    widths = tuple(int(b) for b in listish(sets.pop("widths", QUICK["widths"] if quick else WIDTHS)))
    seeds = tuple(int(s) for s in listish(sets.pop("seeds", QUICK["seeds"] if quick else SEEDS)))
    samples = int(sets.pop("probe_samples", PROBE_SAMPLES))
    task = str(sets.pop("task", "topic"))
    if task not in ("lag", "blocks", "topic"):
        raise ConfigError(f"unknown frequency-study task '{task}'", hint="--set task=topic (default), lag or blocks")
    if not widths or min(widths) < 3 or not seeds:
        raise ConfigError("--set widths= needs block lengths >= 3 and --set seeds= at least one seed")
    if set(sets) & set(RUN_KEYS) or ("context" in sets and int(sets["context"]) < 2 * max(widths)):
        bad = ", ".join(k for k in sets if k in RUN_KEYS) or f"context={sets['context']}"
        raise UsageError(f"--set {bad}: the frequency study sets the task, its width, the seed, the model and a "
                         f"context of at least two blocks ({2 * max(widths)} here) for each run itself",
                         hint="choose them with --set task=, widths=, seeds= (or --seeds) and a longer context")
    overrides = {**DEFAULTS, **({"steps": QUICK["steps"]} if quick else {}), **sets}
    if steps is not None:
        overrides["steps"] = steps
    overrides["context"] = max(int(overrides["context"]), 2 * max(widths))
    rope = library_dir() / "rope.pe"
    out = Path(out)
    runs = []
    n_all = len(widths) * len(seeds)
    for n, (B, s) in enumerate(((B, s) for B in widths for s in seeds), 1):
        name = f"{task}{B}_s{s}"
        run = out / "runs" / name
        Wd = B - 1 if task == "blocks" else B
        say(f"[{n}/{n_all}] {name}: RoPE on the {task} task, W = {Wd}")
        ov = {**overrides, "data": task, "block_len": B, "seed": s}
        done = _train_one(name, rope, run, ov, say, quiet)
        m = read_json(run / "frequency.json")
        if not (m and m.get("step") == done.get("steps") and m.get("samples") == samples
                and m.get("scheme_hash") == done.get("scheme_hash") and m.get("task") == task
                and m.get("version") == MEASURE_VERSION):
            m = {**measure_run(run, B, task, samples=samples), "step": done.get("steps"), "samples": samples,
                 "scheme_hash": done.get("scheme_hash"), "seed": s, "val_loss": done.get("val_loss"),
                 "version": MEASURE_VERSION}
            write_json(run / "frequency.json", m)
        say(f"  theta = {math.exp(m['log_freq']):.4g} (period {2 * math.pi / math.exp(m['log_freq']):.1f}; "
            f"pi / W = {math.pi / Wd:.4g}), all-channel {math.exp(m['all_channel_log_freq']):.4g}, "
            f"copy accuracy {m['copy_accuracy']:.2f}")
        runs.append(m)
    W = np.array([r["W"] for r in runs], float)
    fit = fit_law(W, np.exp([r["log_freq"] for r in runs]))
    fit_all = fit_law(W, np.exp([r["all_channel_log_freq"] for r in runs]))
    fit_peak = fit_law(W, np.exp([r["peak_log_freq"] for r in runs]))
    learned = [r for r in runs if r["copy_accuracy"] >= 0.5]
    fit_learned = None
    if len(learned) >= 3 and len({r["W"] for r in learned}) >= 2:
        fit_learned = fit_law(np.array([r["W"] for r in learned], float), np.exp([r["log_freq"] for r in learned]))
    meta = {"command": command or "pedsl compare --study frequency", "git": _git_commit(), **_versions(),
            "task": task, "widths": list(widths), "seeds": list(seeds), "training": dict(overrides),
            "wall_time_s": time.perf_counter() - t0}
    result = {"meta": meta, "runs": runs, "fit": fit, "fit_all_channel": fit_all, "fit_peak": fit_peak,
              "fit_learned": fit_learned}
    files = plot_law(runs, fit, out) + ["frequency.json", "frequency.md"]
    write_json(out / "frequency.json", result)
    write_text(out / "frequency.md", report(result))
    result["files"] = files
    return result


def run_study_cli(echo, schemes, out, **kw) -> None:
    """``pedsl compare --study frequency``: run the study, print what it ran (task, widths, seeds)
    and the fit table."""
    if schemes:
        raise UsageError("--study frequency trains rope.pe itself and takes no SCHEMES",
                         hint="drop the scheme names, or drop --study")
    res = run_frequency_study(out, **kw)
    text = report(res).split("\n")
    meta = res["meta"]
    echo(f"frequency study: task {meta['task']}, widths {meta['widths']}, seeds {meta['seeds']}")
    echo("\n".join(text[5:9 + bool(res["fit_learned"]) + bool(res.get("fit_peak"))]))
    echo(f"report: {Path(out) / 'frequency.md'} ({res['meta']['wall_time_s']:.0f} s)")


def listish(v) -> list:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        return [x for x in v.replace(",", " ").split() if x]
    return [v]


def plot_law(runs: list[dict], fit: dict, out: Path) -> list[str]:
    """Mean +- sd of theta per width (positional and all-channel), the fit, and theta = pi / W."""
    from pedsl.study.plots import save_figure, plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    Ws = sorted({r["W"] for r in runs})
    for key, label, col, mk in (("log_freq", "positional energy", "C0", "o"),
                                ("all_channel_log_freq", "all-channel energy", "C7", "s")):
        mean = [np.mean([r[key] for r in runs if r["W"] == w]) for w in Ws]
        sd = [np.std([r[key] for r in runs if r["W"] == w]) for w in Ws]
        y = np.exp(mean)
        ax.errorbar(Ws, y, yerr=[y - np.exp(np.subtract(mean, sd)), np.exp(np.add(mean, sd)) - y], fmt=mk,
                    color=col, capsize=3, label=f"{label} (mean +- sd over seeds)")
    bad = [r for r in runs if r["copy_accuracy"] < 0.5]
    if bad:
        ax.plot([r["W"] for r in bad], [math.exp(r["log_freq"]) for r in bad], "x", color="C3", ms=8,
                label="run that did not learn the copy (accuracy < 0.5)")
    x = np.array([min(Ws) * 0.8, max(Ws) * 1.25])
    ax.plot(x, math.exp(fit["intercept"]) * x ** fit["slope"], "-", color="C0",
            label=f"fit: slope {fit['slope']:.2f} +- {fit['slope_se']:.2f}")
    ax.plot(x, math.pi / x, "--", color="k", lw=1, label="theta = pi / W")
    ax.set(xscale="log", yscale="log", xlabel="dependency width W (tokens)",
           ylabel="energy-weighted log-mean frequency (rad/token)", title="RoPE frequency use vs dependency width")
    import matplotlib.ticker as mt

    ax.xaxis.set_minor_formatter(mt.NullFormatter())
    ax.set_xticks(Ws)
    ax.set_xticklabels([str(int(w)) for w in Ws])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, "frequency")


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
