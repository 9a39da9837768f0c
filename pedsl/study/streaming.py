"""Far mass and sink mass at extreme lengths, without the (B, H, L, L) attention matrix.

:mod:`pedsl.study.analyze` materialises the attention matrix, which at L = 16384 (128x the
tiny training length) would take gigabytes per layer. Here the same two instruments
(:func:`pedsl.study.instruments.far_mass`, :func:`~pedsl.study.instruments.sink_mass`, the
same definitions) are accumulated **over blocks of key columns** with an online softmax: for
every query, a running maximum ``m``, the running sum ``S`` of ``exp(s - m)`` over the keys seen
so far and the part ``F`` of it over far keys (``i - j > W``). Memory is O(B H L block).

Scores are those of the scheme's module: ``<q_i, T(j->i) k_j> / sqrt(D)``, times the query
temperature, plus the bias columns (``bias_table(cols=...)``), soft-capped: the modifiers of the one
score pipeline (:func:`pedsl.compiler.scores.modified_scores`); the normaliser is an online softmax, the
learned sink's logit the module's (``sink_logits``), softmax plus one's the pinned logit 0; differential
attention's pairs combine their softmaxes' masses by the learned lambda. Sigmoid weights
have no normaliser: the blocks' weights just add. Stick-breaking weights are products over the keys nearer
than each key: not streamed (refused). Absolute-factorable transports
use the pre-transformed q and k; Householder (PaTH) steps move every query through the steps
one key position at a time (as :func:`pedsl.compiler.reference.transported_scores`), O(L^2 D)
time, O(B H L D) memory.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pedsl.compiler.scores import differential_lambda, modified_scores
from pedsl.compiler.plan import DIFFERENTIAL, HOUSEHOLDER, SIGMOID, SOFTMAX1, STICK_BREAKING
from pedsl.errors import EvalError

F64 = torch.float64


@torch.no_grad()
def streamed_far_sink(mod, q: Tensor, k: Tensor, window: int, *, x=None, tokens=None,
                      block: int = 512) -> dict[str, Tensor]:
    """``{"far_mass": (H,), "sink_mass": (H,), "learned_sink_mass": (H,)}`` (mean over queries and
    batch), as ``far_mass(mod.probs(q, k), window)``, ``sink_mass(...)`` and ``learned_sink_mass(...)``
    would give."""
    B, H, L, D = q.shape
    if mod.plan.normalize == STICK_BREAKING:
        raise EvalError("streamed far and sink mass need weights that add over blocks of keys: stick-breaking's "
                         "are products over the nearer keys", hint="analyze at lengths the (B, H, L, L) matrix "
                         "fits (mod.probs)")
    if mod.plan.relative is not None:
        raise EvalError("streamed far and sink mass read the scores q . k plus the bias columns: the content-position "
                         "terms of relative = ... are not streamed", hint="analyze at lengths the (B, H, L, L) matrix "
                         "fits (mod.probs)")
    sigmoid = mod.plan.normalize == SIGMOID
    qt, kt, _, _ = mod.transform_qkv(q, k, k, x, tokens)
    qt, kt = qt.to(F64), kt.to(F64)
    tau = mod.query_scale(L, q.device)                       # (1, H|1, L) or None
    scale = torch.full((1, 1, L), 1 / math.sqrt(D), dtype=F64) if tau is None else tau / math.sqrt(D)
    scale = scale.unsqueeze(-1)                               # (1, H|1, L, 1)
    i = torch.arange(L, device=q.device)
    m = torch.full((B, H, L), -math.inf, dtype=F64)
    S = torch.zeros(B, H, L, dtype=F64)
    Fs = torch.zeros(B, H, L, dtype=F64)
    s0: Tensor | None = None  # the scores of key 0, set by the block that holds it

    def absorb(s: Tensor, j0: int) -> None:
        """Fold raw scores of key columns [j0, j0 + n) (B, H, L, n) into the running sums."""
        nonlocal m, S, Fs, s0
        n = s.shape[-1]
        cols = slice(j0, j0 + n)
        j = i[cols]
        bias = mod.bias_table(L, x, tokens, q.device, cols=cols)
        s = modified_scores(s, scale=scale, bias=None if bias is None else bias.to(F64), cap=mod.plan.softcap)
        s = mod.window_mask(s.masked_fill(j[None, :] > i[:, None], -math.inf), cols)
        if j0 == 0:
            s0 = s[..., 0].clone()
        if sigmoid:  # weights need no running maximum or denominator: each block's just add
            w = torch.sigmoid(s + mod.plan.sigmoid_bias)
            S, Fs = S + w.sum(-1), Fs + (w * ((i[:, None] - j[None, :]) > window)).sum(-1)
            return
        new_m = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isfinite(new_m), new_m, torch.zeros_like(new_m))
        decay = torch.exp(m - safe).nan_to_num(0.0)
        e = torch.exp(s - safe.unsqueeze(-1))
        far = (i[:, None] - j[None, :]) > window
        S = S * decay + e.sum(-1)
        Fs = Fs * decay + (e * far).sum(-1)
        m = new_m

    for scores, j0 in _key_blocks(mod, qt, kt, x, tokens, q, block):
        absorb(scores, j0)
    assert s0 is not None  # every key block was absorbed, key 0's too (L >= 1)
    if sigmoid:
        zero = torch.zeros(H, dtype=F64)
        return {"far_mass": Fs.mean(dim=(0, 2)), "sink_mass": torch.sigmoid(s0 + mod.plan.sigmoid_bias).mean(dim=(0, 2)),
                "learned_sink_mass": zero}
    learned = mod.sink_logits(q)  # a learned sink joins the normaliser (its own share is neither far nor first)
    share = torch.zeros_like(S)
    if learned is not None:
        share = torch.exp(learned.to(F64) - m)
        S = S + share
    if mod.plan.normalize == SOFTMAX1:  # the pinned logit 0 of the denominator (no learned sink's share)
        S = S + torch.exp(-m)
    lse_m = m
    sink, far = torch.exp(s0 - lse_m) / S, Fs / S
    if mod.plan.normalize == DIFFERENTIAL:  # masses are sums of weights: a pair's are its softmaxes' combined
        sink, far = _paired(mod, sink), _paired(mod, far)
    return {"far_mass": far.mean(dim=(0, 2)), "sink_mass": sink.mean(dim=(0, 2)),
            "learned_sink_mass": (share / S).mean(dim=(0, 2))}


def _key_blocks(mod, qt: Tensor, kt: Tensor, x, tokens, q: Tensor, block: int):
    """(raw scores (B, H, L, n) of key columns [j0, j0 + n), j0) for every block of keys: q . k, or for a
    Householder transport each query moved back through the steps between it and the key."""
    B, H, L, _ = q.shape
    if not any(t.kind == HOUSEHOLDER for t in mod.transforms):
        for j0 in range(0, L, block):
            yield qt @ kt[:, :, j0: j0 + block].transpose(-1, -2), j0
        return
    w, beta, _ = mod.householder_inputs(B, L, x, tokens, q.device, q.dtype)
    w, beta = w.to(F64), beta.to(F64)
    cur = qt.clone()          # cur[i] = query i transported back to the current key position
    pending: list[Tensor] = []
    for j in range(L - 1, -1, -1):
        pending.append((cur * kt[:, :, j: j + 1]).sum(-1))           # (B, H, L)
        if j > 0:             # apply H_j to the queries i >= j before moving to key j - 1
            wj, bj = w[:, :, j], beta[:, :, j]
            proj = (cur[:, :, j:] * wj[:, :, None]).sum(-1, keepdim=True)
            cur[:, :, j:] = cur[:, :, j:] - bj[:, :, None, None] * proj * wj[:, :, None]
        if len(pending) == block or j == 0:
            yield torch.stack(pending[::-1], dim=-1), j
            pending = []


def _paired(mod, mass: Tensor) -> Tensor:
    """Per-head masses (B, H, L) of softmax weights as differential attention's pairs weigh (the weights
    ``a_h - lambda a_{h + H/2}`` of both heads of a pair)."""
    half = mass.shape[1] // 2
    lam = differential_lambda(mod.differential_lambda.detach(), mod.plan.lambda_init).to(mass.dtype)
    return (mass[:, :half] - lam * mass[:, half:]).repeat(1, 2, 1)
