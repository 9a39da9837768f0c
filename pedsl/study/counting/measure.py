"""What the counting study measures on one trained run (RUN/counting.json).

For every task and every **condition** ``(rows, stretch)``: ``windows`` fresh rows of ``rows x
context + 1`` bytes whose segments are ``stretch`` times as long as in training (the same rows
for every scheme and seed: drawn from ``make_generator(seed, task, rows, stretch)``), run as one
batch. ``(1, 1)`` is the training distribution, ``(4, 1)`` four times as many segments of the same
lengths, ``(s, s)`` segments ``s`` times as long (the k-th last marker ``s`` times as far in tokens,
still ``k`` segments back).

:func:`score` is the scorer: an answer is right when the greedy prediction at the byte before it
is exactly the answer byte; it reports the accuracy over every answer and per ``k``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from pedsl.data import counting
from pedsl.data.stream import make_generator
from pedsl.study.common import open_run

VERSION = 1


def score(predicted: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict:
    """Exact-answer accuracy of ``predicted`` ``(n, length - 1)``: the greedy next byte after each
    position, for the rows of ``batch`` (:func:`pedsl.data.counting.generate`). Returns
    ``{"accuracy", "answers", "right", "by_back": {k: accuracy}}`` (accuracy None without answers)."""
    tokens, answers, back = batch["tokens"], batch["answers"], batch["back"]
    if predicted.shape != (tokens.shape[0], tokens.shape[1] - 1):
        raise ValueError(f"predictions of shape {tuple(predicted.shape)} for rows {tuple(tokens.shape)}")
    hit = predicted == tokens[:, 1:]                    # position p - 1 predicts byte p
    asked = answers[:, 1:]
    ks = back[:, 1:][asked]
    right = hit[asked]
    by_back = {str(k): float(right[ks == k].float().mean()) for k in sorted(set(ks.tolist()))}
    n = int(asked.sum())
    return {"accuracy": float(right.float().mean()) if n else None, "answers": n, "right": int(right.sum()),
            "by_back": by_back}


def label(rows: int, stretch: int) -> str:
    """A condition's key: ``"4x1"`` = rows 4 times the context, segments of the training length."""
    return f"{rows}x{stretch}"


@torch.no_grad()
def measure_counting(run: str | Path, *, tasks: list[str], conditions: list[tuple[int, int]], windows: int,
                     seed: int, say: Callable[[str], None] = lambda m: None, loaded=None) -> dict:
    """Accuracy of ``run`` on every task at every condition (module docstring)."""
    model, cfg, meta = loaded or open_run(run)
    out: dict = {"context": cfg.context, "back": cfg.data.count_back, "tasks": {}}
    for task in tasks:
        per = out["tasks"][task] = {}
        for rows, stretch in conditions:
            b = counting.generate(task, windows, rows * cfg.context + 1, back=cfg.data.count_back, stretch=stretch,
                                  g=make_generator(seed, counting.TASKS.index(task), rows, stretch))
            predicted = model(b["tokens"][:, :-1]).argmax(-1)
            per[label(rows, stretch)] = score(predicted, b)
            acc = per[label(rows, stretch)]["accuracy"]
            say(f"  {task} {label(rows, stretch)}: accuracy {acc if acc is None else round(acc, 3)}")
    out["scheme"] = meta["scheme"].name
    return out
