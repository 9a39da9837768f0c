"""What the grid study measures on one trained run (RUN/grid.json).

For every grid side ``S``: ``windows`` fresh grids of ``S x S`` cells of the run's task (the same
grids for every scheme and seed: drawn from ``make_generator(seed, S)``), run one at a time with
their (h, w) positions (:func:`pedsl.data.grids.grid_positions`; a one-axis scheme reads the raster
index, :func:`pedsl.model.layer_positions`):

- ``accuracy``: greedy prediction right, over the cells a rule determines (the task's answers:
  above and left in the same region for ``grid_image``, the copies for ``grid_copy``);
- ``ppl``: exp of the mean next-token loss over every cell (nats), ``nll`` that mean.

**Attention maps** (at the training side and the largest): the attention of one query, the cell
at the grid's centre ``(S // 2, S // 2)``, over every earlier cell, per layer and head, read from
the scheme module's own forward (values one-hot over a block of keys at a time: ``o = sum_j a_j
v_j`` then is the row of attention weights), so every scheme, bias and temperature is drawn as it
attends. Stored as ``maps[S][layer][head]`` = ``S * S`` weights in raster order (null after the
query), and ``start`` the weight on the start token.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from pedsl.data import grids
from pedsl.data.stream import make_generator
from pedsl.model import Captured, TransformerLM, layer_positions
from pedsl.study.common import open_run

VERSION = 1


@torch.no_grad()
def measure_grid(run: str | Path, *, sizes: list[int], windows: int, seed: int, map_sizes: list[int],
                 say: Callable[[str], None] = lambda m: None, loaded=None) -> dict:
    """Accuracy, perplexity and attention maps of ``run`` at every side in ``sizes`` (module
    docstring; the study writes them to RUN/grid.json)."""
    model, cfg, meta = loaded or open_run(run)
    task, offset = cfg.data.source, cfg.data.grid_offset
    out = {"task": task, "sizes": {}, "maps": {}, "start": {}}
    for S in sizes:
        b = grids.generate(task, windows, S, S, offset=offset, g=make_generator(seed, S))
        pos = grids.grid_positions(S, S)[:, None, :]                         # (2, 1, L + 1)
        nll_sum = right = answers = 0.0
        for i in range(windows):  # one grid at a time: the (H, L, L) scores of a 64 x 64 grid stay small
            tok = b["tokens"][i:i + 1]
            logits = model(tok[:, :-1], pos[..., :-1]).float()[0]             # (L, V)
            nll = F.cross_entropy(logits, tok[0, 1:], reduction="none")
            scored = b["answers"][i, 1:]
            nll_sum += float(nll.sum())
            right += float((logits.argmax(-1) == tok[0, 1:])[scored].sum())
            answers += float(scored.sum())
        n = windows * S * S
        out["sizes"][str(S)] = {"accuracy": right / answers if answers else None, "nll": nll_sum / n,
                                "ppl": math.exp(nll_sum / n), "answers": int(answers)}
        say(f"  {S}x{S}: accuracy {out['sizes'][str(S)]['accuracy']:.3f}, ppl {out['sizes'][str(S)]['ppl']:.3f}")
    for S in map_sizes:
        b = grids.generate(task, 1, S, S, offset=offset, g=make_generator(seed, S, 1))
        maps, start = attention_maps(model, b["tokens"], grids.grid_positions(S, S)[:, None, :], S)
        out["maps"][str(S)], out["start"][str(S)] = maps, start
    out["scheme"] = meta["scheme"].name
    return out


def query_index(S: int) -> int:
    """The token index of the query the maps draw: the cell at the centre of an S x S grid."""
    return 1 + (S // 2) * S + S // 2


@torch.no_grad()
def attention_maps(model: TransformerLM, tokens: torch.Tensor, positions: torch.Tensor,
                   S: int) -> tuple[list[list[list[float | None]]], list[list[float]]]:
    """Per layer and head: the centre query's attention over the S x S cells (raster order, None
    after the query) and its weight on the start token. ``tokens`` (1, 1 + S*S), ``positions``
    (2, 1, 1 + S*S)."""
    t = query_index(S)
    toks, pos = tokens[:, : t + 1], positions[..., : t + 1]
    captured = model.capture(toks, pos)
    maps, start = [], []
    for blk, cap in zip(model.layers(), captured):
        row = query_row(blk.attn.pe, cap, layer_positions(blk.attn.pe, pos))[0]   # (H, t + 1)
        cells = torch.full((row.shape[0], S * S), float("nan"), dtype=torch.float64)
        cells[:, :t] = row[:, 1:]
        maps.append([[None if math.isnan(v) else round(v, 6) for v in h.tolist()] for h in cells])
        start.append([round(float(v), 6) for v in row[:, 0]])
    return maps, start


def query_row(pe: torch.nn.Module, cap: Captured, positions: torch.Tensor | None) -> torch.Tensor:
    """The last token's attention row ``(B, H, L)`` over the L tokens of a captured layer input, from
    the module's forward (one query, the last; values one-hot over ``D`` keys at a time)."""
    q, k = cap["q"][:, :, -1:], cap["k"]
    B, Hk, L, D = k.shape
    kw = {}
    if getattr(pe, "needs_x", False):
        kw["x"] = cap["x"]
    if getattr(pe, "needs_tokens", False):
        kw["tokens"] = cap["tokens"]
    if positions is not None:
        kw["positions"] = positions
    row = torch.zeros(B, q.shape[1], L, dtype=torch.float64)
    for j0 in range(0, L, D):
        j1 = min(L, j0 + D)
        v = torch.zeros(B, Hk, L, D, dtype=k.dtype)
        v[:, :, j0:j1, : j1 - j0] = torch.eye(j1 - j0, dtype=k.dtype)
        o = pe(q, k, v, **kw)                                                # (B, H, 1, D)
        row[:, :, j0:j1] = o[:, :, 0, : j1 - j0].double()
    return row
