"""Retrieval accuracy by task, length and needle depth (``RUN/retrieval.json``, ``pedsl eval --tasks
retrieval``): passkey, multi-key needle and key-value lookup of :mod:`pedsl.data.tasks`;
``accuracy`` = every answer digit right under greedy argmax (chance 1e-5), ``digit_accuracy``
(chance 0.1), ``answer_nll``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from pedsl.data.stream import make_generator
from pedsl.data.tasks import TASKS, generate, min_length
from pedsl.study.answers import score_answers
from pedsl.study.common import open_run, write_json

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle depths: 0 opens the haystack, 1 stands right before the question
SAMPLES = 8  # sequences per task, length and depth
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
    """Score one run into RUN/retrieval.json (:func:`pedsl.study.driver.measure` reuses it when its
    settings, step and scheme match)."""
    model, cfg, meta = loaded or open_run(run)
    t0 = time.perf_counter()
    res = evaluate_retrieval(model, lengths, depths=tuple(depths), samples=samples, digits=cfg.data.passkey_digits,
                             keys=cfg.data.multikey_keys, say=say)
    res.update({"run": str(run), "scheme": meta["scheme"].name, "scheme_hash": meta["scheme_hash"],
                "step": meta["step"], "context": cfg.context, "wall_time_s": time.perf_counter() - t0})
    write_json(run / "retrieval.json", res)
    return res
