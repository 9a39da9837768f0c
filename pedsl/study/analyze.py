"""``pedsl analyze RUN``: the papers' instruments per layer and head -> RUN/analysis.json.

For each analysis length L the model reads validation windows of L bytes once
(:meth:`TransformerLM.capture` gives every layer's q, k, v, x, tokens); each layer's compiled
scheme module then gives the attention matrix (``probs``), the raw scores (``raw_scores``), the
post-transport q and k (``transform_qkv``) and its rotary groups. The (B, H, L, L) matrices are
materialised, so default lengths are capped (``max_length``, default 1024) and the batch is small;
past ``DENSE_MAX`` (2048) tokens far mass and sink mass are streamed over key blocks instead
(:mod:`pedsl.study.streaming`, the same numbers without the L x L matrix) and the score
decoherence (which needs every pair) is skipped, so 128x the training length can be analyzed.
Definitions: :mod:`pedsl.study.instruments`. PaTH's Householder steps are not absolute
transforms: its "post-transport" q and k are the pre-transforms only (none), noted in the output.

analysis.json::

    {"run", "scheme", "step", "context", "far_window", "lengths", "settings",
     "layers": [{"layer", "far_mass": {"<L>": [H]}, "sink_mass": {"<L>": [H]}, "learned_sink_mass": {"<L>": [H]},
                 "decoherence": {"<L>": {"bins", "mean": [H][bins], "std": [H][bins], "count"}},
                 "geometry": {"<L>": {"k_sigma1": [H], "k_stable_rank": [H], "q_sigma1", "q_stable_rank"}},
                 "frequency_energy": [{"group", "freqs": [P], "energy": [H][P], "log_mean_freq": [H]}]}],
     "summary": {"far_mass" | "sink_mass" | "learned_sink_mass" | "k_stable_rank" | "q_stable_rank":
                 {"<L>": mean over layers, heads},
                 "frequency_energy": [{"group", "freqs", "energy": [P] (mean), "log_mean_freq"}]},
     "notes": [...], "wall_time_s"}
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.compiler.plan import HOUSEHOLDER
from pedsl.data.stream import make_generator, task_windows
from pedsl.errors import EvalError
from pedsl.formulas import channel_pairs
from pedsl.limits import check_tensor
from pedsl.study import instruments as ins
from pedsl.study.common import eval_config, open_run, write_json
from pedsl.study.eval_run import output_name, swap_line, validation_data
from pedsl.study.perplexity import window_ends, windows_at
from pedsl.study.progress import Eta
from pedsl.study.streaming import streamed_far_sink

MAX_LENGTH = 1024
DENSE_MAX = 2048  # longer analysis lengths stream far / sink mass over key blocks


def default_lengths(context: int, max_length: int = MAX_LENGTH) -> list[int]:
    lens = [context * m for m in (1, 2, 4, 8, 16, 32) if context * m <= max_length]
    return lens or [min(context, max_length)]


def _inputs(cfg, data, L: int, n: int, seed: int) -> torch.Tensor:
    if data is None:
        return task_windows(cfg.data, n, L, make_generator(seed, L))
    ends = window_ends(int(data.numel()), L, n, seed)
    return windows_at(data, ends, L - 1)  # (n, L)


@torch.no_grad()
def _stream_block(samples: int, heads: int, L: int) -> int:
    """Key columns per block when far and sink mass are streamed (about 2^23 scores a block)."""
    return max(32, 2**23 // (samples * heads * L))


def _matrix_elements(samples: int, heads: int, L: int, head_dim: int) -> int:
    """The score-sized tensors the analysis of length ``L`` holds: the dense (samples, H, L, L)
    probabilities up to ``DENSE_MAX``; past it, one streamed block of key columns plus the
    transformed queries and keys in float64."""
    if L <= DENSE_MAX:
        return samples * heads * L * L
    return samples * heads * L * (min(L, _stream_block(samples, heads, L)) + 2 * head_dim)


def analyze_run(run_dir: str | Path, *, lengths: list[int] | None = None, window: int | None = None,
                samples: int = 1, max_length: int = MAX_LENGTH, out: str | Path | None = None,
                say: Callable[[str], None] = lambda m: None, loaded=None) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    model, cfg, meta = loaded or open_run(run_dir)
    ecfg = eval_config(cfg, meta["scheme"], {"far_window": window})
    W = ecfg.far_window
    lens = sorted(set(lengths)) if lengths else default_lengths(cfg.context, max_length)
    H = cfg.model.n_heads
    Dh = cfg.model.head_dim

    def size(L: int) -> int:
        return _matrix_elements(samples, H, L, Dh) * (4 if L <= DENSE_MAX else 8)

    worst = max(lens, key=size)
    cols = worst if worst <= DENSE_MAX else f"({_stream_block(samples, H, worst)} + 2 x {Dh})"
    too_big = check_tensor("analyze", _matrix_elements(samples, H, worst, Dh), 4 if worst <= DENSE_MAX else 8,
                           f"{samples} samples x {H} heads x {worst} x {cols} "
                           f"{'attention probabilities, float32' if worst <= DENSE_MAX else 'streamed scores and q/k, float64'}")
    if too_big:
        raise EvalError(too_big, hint="lower --samples or the lengths (--lengths, --max-length)")
    data = validation_data(cfg)
    notes = []
    if any(t.kind == HOUSEHOLDER for blk in model.blocks for t in getattr(blk.attn.pe, "transforms", [])):
        notes.append("Householder (PaTH) steps are not absolute transforms: the geometry uses q and k before "
                     "them; far mass, sink mass and scores include them.")
    say(f"analyze {meta['scheme'].name}: lengths {lens}, far window W = {W}")
    eta = Eta(sum(L * L for L in lens), say, "analyze")  # the (B, H, L, L) matrices dominate
    layers: list[dict[str, Any]] = [{"layer": i, "far_mass": {}, "sink_mass": {}, "learned_sink_mass": {},
                                     "decoherence": {}, "geometry": {}, "frequency_energy": []}
                                    for i in range(len(model.blocks))]
    for L in lens:
        tokens = _inputs(cfg, data, L, samples, ecfg.seed)
        captured = model.capture(tokens)
        for li, (blk, cap) in enumerate(zip(model.blocks, captured)):
            mod = blk.attn.pe
            kw = {}
            if getattr(mod, "needs_x", False):
                kw["x"] = cap["x"]
            if getattr(mod, "needs_tokens", False):
                kw["tokens"] = cap["tokens"]
            q, k, v = cap["q"], cap["k"], cap["v"]
            rec = layers[li]
            if L > DENSE_MAX:
                fs = streamed_far_sink(mod, q, k, W, block=_stream_block(q.shape[0], q.shape[1], L), **kw)
                rec["far_mass"][str(L)] = fs["far_mass"].tolist()
                rec["sink_mass"][str(L)] = fs["sink_mass"].tolist()
                rec["learned_sink_mass"][str(L)] = fs["learned_sink_mass"].tolist()
            else:
                a = mod.probs(q, k, **kw)  # (B, H, L, L)
                rec["far_mass"][str(L)] = ins.far_mass(a, W).tolist()
                rec["sink_mass"][str(L)] = ins.sink_mass(a).tolist()
                rec["learned_sink_mass"][str(L)] = ins.learned_sink_mass(a, mod.sink_logits(q) is not None).tolist()
                del a
                rec["decoherence"][str(L)] = ins.score_decoherence(mod.raw_scores(q, k, **kw))
            qt, kt, _, _ = mod.transform_qkv(q, k, v, kw.get("x"), kw.get("tokens"))
            gk, gq = ins.geometry(kt), ins.geometry(qt)
            rec["geometry"][str(L)] = {"k_sigma1": gk["sigma1"], "k_stable_rank": gk["stable_rank"],
                                       "q_sigma1": gq["sigma1"], "q_stable_rank": gq["stable_rank"]}
            if L == lens[0] and hasattr(mod, "rotary_groups"):
                for g in mod.rotary_groups():
                    pairs = channel_pairs(g["channels"], g["layout"])
                    e = ins.frequency_energy(q, k, pairs)  # (H, P)
                    rec["frequency_energy"].append({
                        "group": g["group"], "freqs": list(g["freqs"]), "energy": e.tolist(),
                        "log_mean_freq": ins.log_mean_frequency(e, g["freqs"]).tolist(), "length": L})
        say(f"  L = {L:>5}: far mass {_mean([r['far_mass'][str(L)] for r in layers]):.3f}, "
            f"sink {_mean([r['sink_mass'][str(L)] for r in layers]):.3f}")
        eta.done(L * L, f"{L} tokens")
    result = {"run": str(run_dir), "scheme": meta["scheme"].name, "scheme_hash": meta["scheme_hash"],
              "step": meta["step"], "context": cfg.context, "far_window": W, "lengths": lens,
              "settings": {"lengths": lens, "far_window": W, "samples": samples, "seed": ecfg.seed},
              "layers": layers, "summary": summarize(layers, lens), "notes": notes,
              "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0}
    if meta.get("swap"):  # analysed under another scheme than the run's (pedsl.train.swap)
        result["swap"] = meta["swap"]
    write_json(out or Path(run_dir) / output_name("analysis", meta), result)
    return result


def _mean(rows: list[list[float]]) -> float:
    vals = [x for r in rows for x in r]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(layers: list[dict], lens: list[int]) -> dict:
    out: dict[str, Any] = {}
    for key in ("far_mass", "sink_mass", "learned_sink_mass"):
        out[key] = {str(L): _mean([r[key][str(L)] for r in layers if key in r]) for L in lens}
    for key in ("k_stable_rank", "q_stable_rank", "k_sigma1", "q_sigma1"):
        out[key] = {str(L): _mean([r["geometry"][str(L)][key] for r in layers]) for L in lens}
    # a group's layers are averaged when they rotate at the same frequencies (the layers of a `layers`
    # scheme may give one group name other frequencies: those are summarised apart, named by their layers)
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for i, r in enumerate(layers):
        for fe in r["frequency_energy"]:
            groups.setdefault((fe["group"], tuple(fe["freqs"])), []).append((i, fe))
    names = Counter(g for g, _ in groups)
    out["frequency_energy"] = []
    for (g, freqs), found in groups.items():
        recs = [fe for _, fe in found]
        energy = [_mean([[row[p] for row in fe["energy"]] for fe in recs]) for p in range(len(freqs))]
        label = g if names[g] == 1 else f"{g} (layers {', '.join(str(i) for i, _ in found)})"
        out["frequency_energy"].append({"group": label, "freqs": list(freqs), "energy": energy,
                                        "log_mean_freq": _mean([fe["log_mean_freq"] for fe in recs])})
    return out


def analysis_table(result: dict) -> str:
    s = result["summary"]
    head = f"{'length':>8} {'far mass':>9} {'sink':>7} {'k srank':>8} {'q srank':>8}"
    rows = [f"{result['scheme']} (far window W = {result['far_window']}; mean over layers and heads)"]
    if result.get("swap"):
        rows.append(swap_line(result["swap"]))
    rows += [head, "-" * len(head)]
    for L in result["lengths"]:
        k = str(L)
        rows.append(f"{L:>8} {s['far_mass'][k]:>9.3f} {s['sink_mass'][k]:>7.3f} {s['k_stable_rank'][k]:>8.2f} "
                    f"{s['q_stable_rank'][k]:>8.2f}")
    for fe in s["frequency_energy"]:
        rows.append(f"frequency energy, group {fe['group']}: log-mean frequency {fe['log_mean_freq']:.3f} "
                    f"(period {2 * math.pi / math.exp(fe['log_mean_freq']):.1f} tokens)")
    rows += result.get("notes", [])
    return "\n".join(rows)
