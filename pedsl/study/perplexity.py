"""Perplexity past the training length, scored so that longer context can only help.

For a length ``L`` every window holds ``L + 1`` bytes of the validation split; the model reads
the first ``L`` and only the predictions of the **last** ``S = min(L_train, L)`` bytes are
scored. The windows of every length **end at the same places** (ends drawn once, with a fixed
seed, from the validation split), so each length scores exactly the same bytes and differs only
in how much context precedes them: the ratio ``ppl(L) / ppl(L_train)`` measures what the extra
context does (ideally <= 1; a scheme that breaks past its training length goes far above 1).

Memory stays bounded: windows are run in batches of at most ``token_budget`` tokens (one window
at a time at 32x the tiny context), under ``torch.no_grad``.

Shapes: data (N,) uint8; windows (n, L + 1) long; logits (b, L, V).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from pedsl.errors import DataError, EvalError


def window_ends(n_data: int, max_len: int, n: int, seed: int) -> torch.Tensor:
    """``n`` window end positions (exclusive) drawn in ``[max_len + 1, n_data]`` with a fixed seed."""
    if n_data < max_len + 1:
        raise DataError(f"the validation split holds {n_data} bytes, fewer than one window of {max_len + 1}",
                        hint="evaluate shorter --lengths or raise data.max_bytes")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max_len + 1, n_data + 1, (n,), generator=g)


def windows_at(data: torch.Tensor, ends: torch.Tensor, length: int) -> torch.Tensor:
    """(n, length + 1) windows ending at ``ends``: inputs ``w[:, :-1]``, targets ``w[:, 1:]``."""
    idx = ends[:, None] - (length + 1) + torch.arange(length + 1)[None, :]
    return data[idx].long()


@torch.no_grad()
def score_last(model: Callable, windows: torch.Tensor, score_len: int, token_budget: int = 8192,
               device: str | torch.device = "cpu") -> tuple[float, int]:
    """Summed next-byte NLL (nats) of the last ``score_len`` targets of each window, and the count.

    ``model(tokens (b, L)) -> logits (b, L, V)``; batches hold at most ``token_budget`` tokens.
    """
    n, L1 = windows.shape
    L = L1 - 1
    S = min(score_len, L)
    per = max(1, token_budget // L)
    total, count = 0.0, 0
    for s in range(0, n, per):
        w = windows[s : s + per].to(device)
        logits = model(w[:, :-1])[:, -S:]  # (b, S, V)
        tgt = w[:, -S:]  # (b, S)
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1),
                                       reduction="sum"))
        count += tgt.numel()
    return total, count


def perplexity(model: Callable, data: torch.Tensor | None, lengths: list[int], context: int, *, windows: int = 4,
               seed: int = 1234, token_budget: int = 8192, say: Callable[[str], None] = lambda m: None,
               generate: Callable[[int, int], torch.Tensor] | None = None,
               tick: Callable[[int], None] = lambda L: None) -> dict[str, dict]:
    """Perplexity at every length and its ratio to the training length.

    ``data`` is the validation byte stream; ``generate(n, L + 1)`` replaces it for runs trained
    on a generated task (then every length draws its own sequences, and ``data`` may be None). Returns
    ``{str(L): {"nll", "ppl", "bits_per_byte", "ratio", "tokens", "windows"}}``.
    """
    lengths = sorted(set(lengths) | {context})
    draw = generate
    if draw is None:
        if data is None:
            raise ValueError("perplexity needs the validation data or a generator")
        stream, ends = data, window_ends(int(data.numel()), max(lengths), windows, seed)
        draw = lambda n, length: windows_at(stream, ends, length - 1)  # noqa: E731
    out: dict[str, dict] = {}
    for L in lengths:
        w = draw(windows, L + 1)
        total, count = score_last(model, w, context, token_budget)
        nll = total / count
        if not math.isfinite(nll):  # a non-finite result is an error, never a number in a report
            raise EvalError(f"the perplexity at length {L} is not finite (the model's loss is {nll})",
                            hint="the model's outputs overflow or are NaN; evaluate another checkpoint")
        out[str(L)] = {"nll": nll, "ppl": math.exp(min(nll, 700.0)), "bits_per_byte": nll / math.log(2),
                       "tokens": count, "windows": int(w.shape[0])}
        say(f"  ppl @ {L:>6}: {out[str(L)]['ppl']:.3f}")
        tick(L)
    base = out[str(context)]["nll"]
    for rec in out.values():
        rec["ratio"] = math.exp(min(rec["nll"] - base, 700.0))  # ppl(L) / ppl(L_train)
    return out
