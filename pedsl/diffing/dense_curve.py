"""A dense rotation's share of the transport curve at initialisation, in numpy float64 (``pedsl diff --numeric``).

On text every axis reads the one position p, so ``R(p) = P^T expm(p T) P`` with ``T = sum_a A_a`` and
``T(j -> j + d) = R(j)^T R(j + d) = P^T expm(d T) P``: its trace share ``tr expm(d T) / D`` depends on d
alone. The generators are drawn at their start (docs/semantics.md §2e: ``M - M^T``, M from N(0, init^2),
the scales at 1, P = I), and ``expm`` is a Taylor series after scaling and squaring (numpy has none).
"""

from __future__ import annotations

import numpy as np

TAYLOR_TERMS = 18  # after scaling to a norm <= 1/2, the series' remainder is below 1e-20


def expm(m: np.ndarray) -> np.ndarray:
    """The matrix exponential of every (..., b, b) matrix: exp(m / 2^s)^(2^s), the inner one by its series."""
    norm = float(np.abs(m).sum(-1).max()) if m.size else 0.0
    s = max(0, int(np.ceil(np.log2(norm / 0.5)))) if norm > 0.5 else 0
    a = m / 2.0 ** s
    eye = np.broadcast_to(np.eye(m.shape[-1]), m.shape)
    out, term = eye.copy(), eye.copy()
    for k in range(1, TAYLOR_TERMS + 1):
        term = term @ a / k
        out = out + term
    for _ in range(s):
        out = out @ out
    return out


def dense_transport_part(t, width: int, heads: int, head_dim: int, lmax: int, seed: int) -> np.ndarray:
    """(tr expm(d T) / D) for d = 0..lmax, averaged over the generator sets (one per head with per = head) of
    the dense rotation ``t`` (a :class:`pedsl.lang.scheme.DenseRotation` of ``width`` channels)."""
    rng = np.random.default_rng(seed)
    G, K = heads if t.per_head else 1, t.axes if t.mode == "independent" else 1
    raw = rng.standard_normal((G, K, width // t.block, t.block, t.block)) * t.init
    gen = raw - np.swapaxes(raw, -1, -2)
    # every axis at p: independent generators add up; shared ones are A times lambda_a = 1; split blocks each
    # belong to one axis, so every block turns once
    total = gen.sum(1) if t.mode == "independent" else gen[:, 0] * (t.axes if t.mode == "shared" else 1)
    d = np.arange(lmax + 1, dtype=np.float64)
    E = expm(d[:, None, None, None, None] * total[None])  # (d, G, blocks, b, b)
    return np.trace(E, axis1=-2, axis2=-1).sum(-1).mean(-1) / head_dim

