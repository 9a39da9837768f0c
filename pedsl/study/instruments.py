"""The papers' instruments as pure tensor functions (docs/semantics.md §7).

Notation: B batch, H heads, L length, D head dimension; ``a`` is an attention matrix
(B, H, L, L) with rows summing to 1 over ``j <= i``; ``s`` raw scores ``<q_i, T(j->i) k_j>``
(B, H, L, L) with -inf above the diagonal. Every function returns per-head numbers (H,)
averaged over the batch, so a test can check them against a case with a known answer.

Exact definitions (our choices where the papers leave room):

- far mass (paper "Why do accumulated transformations extrapolate"):
  ``rho_W(i) = sum_{j : i - j > W} a(i, j)``, and ``far_mass = mean over all queries i in [0, L)``
  (queries with ``i <= W`` contribute 0). Uniform causal attention ``a(i, j) = 1/(i + 1)`` gives
  ``rho_W(i) = max(0, i - W) / (i + 1)``: the last query ``(L - 1 - W) / L``, and the mean
  ``(1/L) sum_{i > W} (i - W)/(i + 1)`` (see :func:`uniform_far_mass`), which tends to 1 as L grows.
- sink mass (paper "Frayed RoPE"): ``mean over queries of a(i, 0)``.
- score decoherence: mean and standard deviation of ``s(i, j)`` over pairs whose distance
  ``d = i - j`` falls in a log-spaced bin ``[0], [1], [2, 3], [4, 7], ...`` (bin ``b >= 1`` holds
  ``2^(b-1) <= d < 2^b``).
- frequency energy (paper "How data shapes RoPE frequency usage", our reading): for rotary pair
  ``k`` with channels ``(c1, c2)``, ``E_k = mean_{j <= i} |q_i^(k)|^2 |k_j^(k)|^2`` with
  ``|q^(k)|^2 = q_c1^2 + q_c2^2`` (a rotation does not change it, so pre-transport q and k give
  the same number), normalised to sum 1 over the pairs of a head; its log-mean frequency is
  ``sum_k E_k ln w_k``.
- geometry: first singular value ``sigma_1`` and stable rank ``||X||_F^2 / sigma_1^2`` of the
  (L, D) matrix of one head's post-transport keys (or queries).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

F64 = torch.float64


def far_mass_per_query(a: Tensor, window: int) -> Tensor:
    """rho_W(i) = sum_{j : i - j > W} a(i, j): (B, H, L, L) -> (B, H, L)."""
    L = a.shape[-1]
    i = torch.arange(L, device=a.device)
    far = (i[:, None] - i[None, :]) > window  # (L, L)
    return (a.to(F64) * far).sum(-1)


def far_mass(a: Tensor, window: int) -> Tensor:
    """Far mass averaged over every query and the batch, per head: (B, H, L, L) -> (H,)."""
    return far_mass_per_query(a, window).mean(dim=(0, 2))


def uniform_far_mass(L: int, window: int) -> float:
    """The exact far mass of uniform causal attention (the reference the tests use)."""
    return sum(max(0, i - window) / (i + 1) for i in range(L)) / L


def sink_mass(a: Tensor) -> Tensor:
    """Attention on the first token, mean over queries and batch, per head: (B, H, L, L) -> (H,)."""
    return a[..., 0].to(F64).mean(dim=(0, 2))


def learned_sink_mass(a: Tensor, has_sink: bool) -> Tensor:
    """The share of attention a learned sink (``sink = logit`` / ``token``) takes, mean over queries and
    batch, per head: what the rows of ``a`` (the attention over the tokens) leave of one. Zero without
    a sink (a row of stick-breaking weights also sums to less than one: that rest is no sink's)."""
    if not has_sink:
        return torch.zeros(a.shape[1], dtype=F64, device=a.device)
    return (1.0 - a.to(F64).sum(-1)).mean(dim=(0, 2))


def distance_bins(L: int) -> list[tuple[int, int]]:
    """Log-spaced distance bins [lo, hi] (inclusive) covering 0 .. L - 1."""
    bins = [(0, 0)]
    lo = 1
    while lo < L:
        bins.append((lo, min(2 * lo - 1, L - 1)))
        lo *= 2
    return bins


def score_decoherence(s: Tensor) -> dict:
    """Mean and spread of raw scores per log-spaced distance bin: (B, H, L, L) -> per head and bin.

    Returns ``{"bins": [[lo, hi], ...], "mean": (H, nbins) list, "std": (H, nbins) list,
    "count": [pairs per bin and batch element]}``.
    """
    B, H, L, _ = s.shape
    i = torch.arange(L, device=s.device)
    d = i[:, None] - i[None, :]  # (L, L)
    valid = d >= 0
    b = torch.zeros_like(d)
    pos = d > 0
    b[pos] = torch.floor(torch.log2(d[pos].double())).long() + 1
    nb = len(distance_bins(L))
    idx = b[valid]  # (P,)
    vals = s.to(F64)[:, :, valid].transpose(0, 1).reshape(H, -1)  # (H, B * P)
    idx = idx.repeat(B)
    cnt = torch.bincount(idx, minlength=nb).to(F64)  # (nbins,), over the batch
    sums = torch.zeros(H, nb, dtype=F64, device=s.device).index_add_(1, idx, vals)
    sq = torch.zeros(H, nb, dtype=F64, device=s.device).index_add_(1, idx, vals * vals)
    mean = sums / cnt.clamp(min=1)
    var = (sq / cnt.clamp(min=1) - mean * mean).clamp(min=0)
    return {"bins": [list(x) for x in distance_bins(L)], "mean": mean.tolist(), "std": var.sqrt().tolist(),
            "count": (cnt / B).tolist()}


def frequency_energy(q: Tensor, k: Tensor, pairs: list[tuple[int, int]]) -> Tensor:
    """E_k per head, normalised to sum 1: q, k (B, H, L, D) -> (H, P).

    ``E_k = mean_{j <= i} |q_i^(k)|^2 |k_j^(k)|^2``, computed with a cumulative sum over keys.
    """
    c1 = torch.tensor([p[0] for p in pairs], device=q.device)
    c2 = torch.tensor([p[1] for p in pairs], device=q.device)
    q2 = q.to(F64)[..., c1] ** 2 + q.to(F64)[..., c2] ** 2  # (B, H, L, P)
    k2 = k.to(F64)[..., c1] ** 2 + k.to(F64)[..., c2] ** 2
    L = q.shape[2]
    causal_k = torch.cumsum(k2, dim=2)  # sum_{j <= i} |k_j|^2
    e = (q2 * causal_k).sum(dim=2) / (L * (L + 1) / 2)  # (B, H, P)
    e = e.mean(0)
    return e / e.sum(-1, keepdim=True).clamp(min=1e-300)


def log_mean_frequency(energy: Tensor, freqs: list[float] | tuple[float, ...]) -> Tensor:
    """sum_k E_k ln w_k per head: (H, P) -> (H,); pairs with w_k = 0 are left out (renormalised)."""
    w = torch.tensor(list(freqs), dtype=F64, device=energy.device)
    ok = w > 0
    e = energy[:, ok]
    e = e / e.sum(-1, keepdim=True).clamp(min=1e-300)
    return (e * torch.log(w[ok])).sum(-1)


def geometry(x: Tensor) -> dict[str, list[float]]:
    """First singular value and stable rank per head of (B, H, L, D) rows, averaged over the batch."""
    xs = x.to(F64)
    sv = torch.linalg.svdvals(xs)  # (B, H, min(L, D))
    s1 = sv[..., 0]
    fro2 = (xs * xs).sum(dim=(-1, -2))
    stable = fro2 / (s1 * s1).clamp(min=1e-300)
    return {"sigma1": s1.mean(0).tolist(), "stable_rank": stable.mean(0).tolist()}


def finite(x: float) -> float | None:
    """JSON-safe float (NaN / inf -> None)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
