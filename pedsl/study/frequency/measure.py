"""The measure of the frequency study (see :mod:`pedsl.study.frequency`): the positional energy of each
rotary pair in a trained run, and the energy-weighted log-mean frequency."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from pedsl.data.stream import make_generator
from pedsl.data.synthetic import block_batch, lag_batch, topic_batch
from pedsl.errors import ConfigError
from pedsl.formulas import channel_pairs
from pedsl.study import instruments as ins
from pedsl.study.common import open_run

PROBE_SAMPLES = 8


def positional_energy(q, k, pairs: list[tuple[int, int]], freqs):
    """Per head and pair, the variance over causal (i, j) of the content-averaged score part of pair k:
    q, k (B, H, L, D) before rotation -> (H, P), not normalised (see the module docstring)."""
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


def measure_run(run: Path, width: int, task: str = "lag", *, samples: int = PROBE_SAMPLES, seed: int = 1234) -> dict:
    """Positional and all-channel log-mean frequency of a finished run, and how well it copies:
    ``copy_accuracy`` is the share of predictions equal to the token W back (lag: every position
    from W on; blocks: the block ends), ``answer_nll`` the loss there (nats; chance ln 26)."""
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
    for blk, cap in zip(model.layers(), captured):
        for g in blk.attn.pe.rotary_groups():
            pairs = channel_pairs(g["channels"], g["layout"])
            f = np.asarray(g["freqs"], dtype=np.float64)
            e_pos = positional_energy(cap["q"], cap["k"], pairs, f).sum(0).numpy()  # (P,), summed over heads
            e_all = ins.frequency_energy(cap["q"], cap["k"], pairs).mean(0).numpy()
            pe_tot = e_pos if pe_tot is None else pe_tot + e_pos
            all_tot = e_all if all_tot is None else all_tot + e_all
            freqs = f
    if freqs is None or pe_tot is None or all_tot is None:  # all three set together, by one group
        raise ConfigError(f"run '{run}' has no position-indexed rotary group to measure",
                          hint="the frequency study trains rope.pe")
    return {"task": task, "block_len": width, "W": dist, "freqs": freqs.tolist(),
            "positional_energy": (pe_tot / pe_tot.sum()).tolist(),
            "all_channel_energy": (all_tot / all_tot.sum()).tolist(),
            "log_freq": log_mean_frequency(pe_tot, freqs),
            "peak_log_freq": float(np.log(freqs[int(np.argmax(pe_tot))])),
            "all_channel_log_freq": log_mean_frequency(all_tot, freqs),
            "copy_accuracy": acc, "answer_nll": nll, "chance_nll": math.log(26)}
