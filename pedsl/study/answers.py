"""Retrieval accuracy vs length: passkey and the block-structured task (docs/semantics.md §7).

- passkey (:func:`pedsl.data.synthetic.passkey_batch`): a 5-digit key hidden at a random place in filler
  text, asked for at the end. Scored on the answer digits: ``accuracy`` (every digit right under
  greedy argmax), ``digit_accuracy`` (chance 0.1) and ``answer_nll`` (mean nats per answer byte).
- blocks (:func:`pedsl.data.synthetic.block_batch`): latent blocks of ``block_len`` random letters whose last
  letter repeats the one at ``offset``; scored at the block ends inside the last ``L_train``
  positions (the same positions relative to the end at every length, like perplexity):
  ``accuracy`` (chance 1/26) and ``answer_nll``. The sequences of every length are suffixes of
  the same long ones (when the length difference is a multiple of ``block_len``, which keeps the
  block alignment), so every length scores the same letters and differs only in context.

A model trained on the text corpus never saw these tasks: accuracy near chance is an honest
result; the answer loss still shows whether longer context hurts.

Shapes: tokens (n, L) long; answer_positions (n, A); logits (b, L, V).
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch
import torch.nn.functional as F

from pedsl.data.synthetic import block_batch, passkey_batch

CHANCE = {"passkey": 0.1, "blocks": 1 / 26}


def _gen(seed: int, task: str, length: int) -> torch.Generator:
    h = hashlib.sha256(f"{seed}:{task}:{length}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "big") & (2**63 - 1))


@torch.no_grad()
def score_answers(model: Callable, tokens: torch.Tensor, answers: torch.Tensor, token_budget: int = 8192,
                  device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Per answer position: (correct (n, A) bool, nll (n, A) float). The byte at ``p`` is predicted
    from the logits at ``p - 1``."""
    n, L = tokens.shape
    per = max(1, token_budget // L)
    correct, nll = [], []
    for s in range(0, n, per):
        t = tokens[s : s + per].to(device)
        a = answers[s : s + per].to(device)
        logits = model(t)  # (b, L, V)
        pred = logits.gather(1, (a - 1)[..., None].expand(-1, -1, logits.shape[-1])).float()  # (b, A, V)
        tgt = t.gather(1, a)  # (b, A)
        correct.append(pred.argmax(-1) == tgt)
        nll.append(F.cross_entropy(pred.transpose(1, 2), tgt, reduction="none"))
    return torch.cat(correct), torch.cat(nll)


def passkey(model: Callable, lengths: list[int], *, samples: int = 4, digits: int = 5, seed: int = 1234,
            token_budget: int = 8192, say: Callable[[str], None] = lambda m: None,
            tick: Callable[[int], None] = lambda L: None) -> dict[str, dict]:
    out = {}
    for L in lengths:
        try:
            batch = passkey_batch(samples, L, digits=digits, g=_gen(seed, "passkey", L))
        except Exception:  # noqa: BLE001 - too short for the needle: skip this length
            continue
        ok, nll = score_answers(model, batch["tokens"], batch["answer_positions"], token_budget)
        out[str(L)] = {"accuracy": float(ok.all(-1).float().mean()), "digit_accuracy": float(ok.float().mean()),
                       "answer_nll": float(nll.mean()), "samples": samples, "chance": CHANCE["passkey"]}
        say(f"  passkey @ {L:>6}: {out[str(L)]['digit_accuracy']:.2f} of digits")
        tick(L)
    return out


def blocks(model: Callable, lengths: list[int], context: int, *, samples: int = 4, block_len: int = 16,
           offset: int = 0, seed: int = 1234, token_budget: int = 8192,
           say: Callable[[str], None] = lambda m: None, tick: Callable[[int], None] = lambda L: None) -> dict[str, dict]:
    out = {}
    longest = max(lengths, default=0)
    full = block_batch(samples, longest, block_len=block_len, offset=offset, g=_gen(seed, "blocks", longest)) \
        if longest >= 2 * block_len else None
    for L in lengths:
        if L < 2 * block_len:
            continue
        if (longest - L) % block_len == 0:  # a suffix keeps the block alignment: the same scored letters
            assert full is not None  # made whenever longest >= L >= 2 * block_len
            tokens = full["tokens"][:, longest - L:]
        else:
            tokens = block_batch(samples, L, block_len=block_len, offset=offset, g=_gen(seed, "blocks", L))["tokens"]
        last = torch.arange(block_len - 1, L, block_len)
        last = last[last >= L - context]  # the block ends inside the last L_train positions
        if last.numel() == 0:
            continue
        pos = last.expand(samples, -1)
        ok, nll = score_answers(model, tokens, pos, token_budget)
        out[str(L)] = {"accuracy": float(ok.float().mean()), "answer_nll": float(nll.mean()),
                       "answers": int(ok.numel()), "samples": samples, "chance": CHANCE["blocks"]}
        say(f"  blocks  @ {L:>6}: {out[str(L)]['accuracy']:.2f}")
        tick(L)
    return out
