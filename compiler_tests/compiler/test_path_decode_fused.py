"""PaTH's fused decode scoring (:mod:`pedsl.ops.path_decode`): two fused attentions merged by their
log-sum-exps equal one softmax over the old keys scored through ``P^T q`` and the recent keys (float64 loops);
it declines what it does not handle; in the general forward's lazy decode rule (``_path_score_one`` tries it
first), decoding equals one forward."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, fast_and_reference
from pedsl.compiler.general import path as G
from pedsl.ops.path_decode import FUSED_FLUSH, fused_path_scores

F64 = torch.float64


def _reference(K, V, q, P, nf):
    """softmax over [K_j . P^T q (j < nf), K_j . q (j >= nf)] / sqrt(D), by loops over heads and keys."""
    B, H, n, D = K.shape
    out = torch.zeros(B, H, 1, D, dtype=F64)
    for b in range(B):
        for h in range(H):
            qo = P[b * H + h].T @ q[b, h] if nf else q[b, h]
            s = torch.stack([K[b, h, j] @ (qo if j < nf else q[b, h]) for j in range(n)]) / D ** 0.5
            out[b, h, 0] = torch.softmax(s, 0) @ V[b, h]
    return out


@pytest.mark.parametrize("nf", [0, 1, 17, 40])
def test_fused_scores_match_loops(nf):
    g = torch.Generator().manual_seed(nf)
    B, H, n, D = 2, 3, 40, 8
    K, V = (torch.randn(B, H, n, D, generator=g, dtype=F64) for _ in range(2))
    q = torch.randn(B, H, D, generator=g, dtype=F64)
    P = torch.eye(D, dtype=F64) + 0.3 * torch.randn(B * H, D, D, generator=g, dtype=F64)
    got = fused_path_scores(K, V, q, P if nf else None, nf)
    torch.testing.assert_close(got, _reference(K, V, q, P, nf), rtol=1e-12, atol=1e-12)


def test_fused_scores_decline_what_they_do_not_handle():
    K = V = torch.zeros(1, 1, 4, 2)
    q = torch.zeros(1, 1, 2)
    assert fused_path_scores(K, V, q, None, 0, mask=torch.ones(1, 1, 1, 4, dtype=torch.bool)) is None
    assert fused_path_scores(K, V, q, None, 0, bias=torch.zeros(1, 1, 1, 4)) is None
    assert fused_path_scores(K, V, q, None, 0, sink=(torch.zeros(1, 1, 1), None)) is None
    assert fused_path_scores(K.half(), V.half(), q.half(), None, 0) is None


@pytest.mark.parametrize("base", ["path", "path_fox"])
def test_decoding_with_fused_scores_equals_one_forward(base, monkeypatch):
    """A prefill, then one token at a time past several flushes; path_fox's forget-gate bias takes the general
    scoring (the fused one declines it)."""
    used = []

    def spy(*a, **kw):
        got = fused_path_scores(*a, **kw)
        used.append(got is not None)
        return got

    monkeypatch.setattr(G, "fused_path_scores", spy)
    monkeypatch.setattr(G, "PATH_FLUSH", 16)  # several flushes in a short test (the module default: FUSED_FLUSH)
    assert FUSED_FLUSH >= 16
    H, D = 2, 8
    fast, _ = fast_and_reference(base, "", H, D)
    g = torch.Generator().manual_seed(2)
    B, L, Pn = 2, 70, 9
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=F64) for _ in range(3))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=F64)
    with torch.no_grad():
        full = fast(q, k, v, x=x)
        cache = fast.new_cache(B)
        outs = [fast(q[:, :, :Pn], k[:, :, :Pn], v[:, :, :Pn], cache=cache, x=x[:, :Pn])]
        for t in range(Pn, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache, x=x[:, s]))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
    assert used and all(used) == (base == "path") and any(used) == (base == "path")
