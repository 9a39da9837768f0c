"""``pedsl compare --study retrieval``: retrieval that is learned, past the training length.

Every scheme (default: the default study's six plus ``fox`` and ``path_fox``) is trained once per
seed with the study's recipe: a **mixture** (``MIXTURE``) of the RULER-style tasks of
:mod:`pedsl.data.tasks` (generated on the fly at the training length, needle at a random depth)
and ``copy`` rows, the loss on the answers weighted up, the answer lengths varied and a short
causal convolution over queries and keys (``TRAIN``; ``--steps``, ``--data`` and ``--set``
override both), then:

- **retrieval** (:func:`evaluate_retrieval` -> ``RUN/retrieval.json``): passkey, multi-key
  needle and key-value lookup at every length (1x..16x the training length) and needle depth
  (0, 0.25, 0.5, 0.75, 1), ``samples`` sequences each; ``accuracy`` = every answer digit right
  under greedy argmax (chance 1e-5), ``digit_accuracy`` (chance 0.1), ``answer_nll``;
- **perplexity** vs length (``RUN/eval.json``, as ``pedsl eval``): on passkey rows, or on the text
  corpus when ``--data`` mixes one in;
- the papers' **instruments** on the same runs (``RUN/analysis.json``: far mass, sink mass,
  sigma_1 and stable rank of the keys).

The study is driven by :func:`pedsl.study.compare_seeds.run_seeded` (runs in
``DIR/runs/<scheme>/seed<k>``, reused when their settings match). The report (``DIR/report.md``, ``report.html``) gives every number as the mean over seeds with
its min-max range, every curve with a min-max band, flags differences within the spread as not
significant (n.s., against RoPE), and draws the needle-in-a-haystack heatmaps (length x depth,
one panel per scheme), accuracy vs length and vs depth, and a loss curve per run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.study.common import write_json
from pedsl.data.tasks import TASKS, generate, min_length

SCHEMES = ("rope", "rope_id", "alibi", "acc_random_qk", "acc_random_qkv", "path", "fox", "path_fox")
# The recipe (issue 16; README, "Retrieval, several seeds"): the three tasks plus copy rows (induction
# bait), the loss on the answers weighted up, answer lengths varied in training, and a width-8 causal
# convolution over queries and keys (model.qk_conv, docs/semantics.md §10): without it the tiny
# preset's induction heads formed in some seeds and not others within 2500 steps (passkey 0.00-0.80);
# width 4 copies the passkey (1.00 over 3 seeds) but not the multi-key needle, whose 3-letter name
# sits 7 bytes before the answer (0.32-0.47); width 8 reads the name too (probe: 0.97 at 1500 steps).
MIXTURE = "passkey:0.4,multikey:0.2,kv:0.2,copy:0.2"
TRAIN = {"steps": 1500, "answer_weight": 1.0, "train_digits": [2, 10], "qk_conv": 8}  # under --steps and --set
MULTIPLIERS = (1, 2, 4, 8, 16)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
SAMPLES = 8
QUICK = {"multipliers": (1, 2, 4), "depths": (0.0, 0.5, 1.0), "samples": 2, "windows": 2, "analyze_max": 256}
VERSION = 1


# ---------------------------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def evaluate_retrieval(model: Callable, lengths: list[int], *, depths: tuple[float, ...] = DEPTHS,
                       samples: int = SAMPLES, digits: int = 5, keys: int = 3, seed: int = 1234,
                       tasks: tuple[str, ...] = TASKS, token_budget: int = 8192,
                       say: Callable[[str], None] = lambda m: None) -> dict:
    """Accuracy per task, length and depth::

        {"settings": {...}, "tasks": {task: {"<L>": {"accuracy", "digit_accuracy", "answer_nll",
                                                     "depths": {"<d>": {same keys}}}}},
         "overall": {"<L>": {"accuracy", "digit_accuracy", "answer_nll"}}}   (mean over tasks)

    A length shorter than a task needs is skipped for that task."""
    from pedsl.data.stream import make_generator
    from pedsl.study.retrieval import score_answers

    out: dict[str, Any] = {"settings": {"version": VERSION, "lengths": sorted(set(lengths)), "depths": list(depths),
                                        "samples": samples, "digits": digits, "keys": keys, "seed": seed,
                                        "tasks": list(tasks)},
                           "tasks": {}, "overall": {}}
    for ti, task in enumerate(tasks):
        per_len: dict[str, Any] = {}
        for L in sorted(set(lengths)):
            if L < min_length(task, digits, keys):
                continue
            cells = {}
            for di, d in enumerate(depths):
                b = generate(task, samples, L, depth=d, digits=digits, keys=keys, g=make_generator(seed, ti, L, di))
                ok, nll = score_answers(model, b["tokens"], b["answer_positions"], token_budget)
                cells[f"{d:g}"] = {"accuracy": float(ok.all(-1).float().mean()),
                                   "digit_accuracy": float(ok.float().mean()), "answer_nll": float(nll.mean())}
            per_len[str(L)] = {k: sum(c[k] for c in cells.values()) / len(cells)
                               for k in ("accuracy", "digit_accuracy", "answer_nll")}
            per_len[str(L)]["depths"] = cells
            say(f"  {task:>8} @ {L:>6}: accuracy {per_len[str(L)]['accuracy']:.2f} "
                f"(digits {per_len[str(L)]['digit_accuracy']:.2f})")
        out["tasks"][task] = per_len
    for L in sorted(set(lengths)):
        recs = [out["tasks"][t][str(L)] for t in tasks if str(L) in out["tasks"][t]]
        if recs:
            out["overall"][str(L)] = {k: sum(r[k] for r in recs) / len(recs)
                                      for k in ("accuracy", "digit_accuracy", "answer_nll")}
    return out


def retrieval_run(run: Path, lengths: list[int], *, depths, samples: int, say, loaded=None) -> dict:
    """Score one run (reusing RUN/retrieval.json when its settings, step and scheme match)."""
    from pedsl.study.common import open_run

    model, cfg, meta = loaded or open_run(run)
    t0 = time.perf_counter()
    res = evaluate_retrieval(model, lengths, depths=tuple(depths), samples=samples, digits=cfg.data.passkey_digits,
                             keys=cfg.data.multikey_keys, say=say)
    res.update({"run": str(run), "scheme": meta["scheme"].name, "scheme_hash": meta["scheme_hash"],
                "step": meta["step"], "context": cfg.context, "wall_time_s": time.perf_counter() - t0})
    write_json(run / "retrieval.json", res)
    return res
