"""Per-block UT/WY preprocessing of PaTH attention (:mod:`pedsl.ops.path`), hand-written backward.

For one block of C steps (rows: local steps; docs/semantics.md §2b, 6), with the scaled queries
Q, keys K, directions W (C, D) and strengths b (C)::

    X   = (I + strictLower(diag(b) W W^T))^-1,  A = X diag(b),  U = A W
    QW  = tril(Q W^T),  KW = tril(W K^T, -1),  Zm = A KW
    Qt  = Q - QW U           queries moved to the start of the block   q_i^T (H_i ... H_1)
    Kt  = K - Zm^T W         keys moved to the end of the block        (H_C ... H_(j+1)) k_j
    Sd  = Q K^T - QW Zm      exact intra-block scores (j <= i; -inf above the diagonal)
    P   = I - W^T U          the block's product H_C ... H_1 (queries as rows: r^T P)

The backward is the chain rule through these lines (21 products per block), after making X, U, QW, KW
and Zm again from (Q, K, W, b) (4 products and a triangular solve): the forward keeps only its inputs
(keeping the five would cost 4 C + D numbers per step). Both directions run over chunks of about 32
(block, head) pairs, so every operand of a chunk stays in cache (one pass over all N B H blocks at once
streams from memory and ran at half the speed, with autograd's copies on top).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["ut_A", "path_blocks", "PathTorchRows"]

# <embedded>
# ---------------------------------------------------------------------------------------------
# PaTH's per-block quantities (copied verbatim into generated modules of PaTH schemes).
# ---------------------------------------------------------------------------------------------
_CHUNK = 32  # (block, head) pairs per chunk: 32 x (64 x 64) floats = 512 KiB per operand


class PathTorchRows:
    """The elementwise steps of PaTH's scan and the UT transform's inverse, in torch. The package passes
    :class:`pedsl.ops.path_kernel.PathCppRows` instead (the scan's loops over the pairs of blocks on a C++
    kernel, one head per task, and the inverse by forward substitution); results agree up to rounding. Scores
    in base 2, rows on the last dimension."""

    scan_forward = scan_backward = None  # the scan's loops: pedsl.ops.path_scan's own in torch

    @staticmethod
    def online(s, mx, ln, a):
        """One key block of the online softmax, in place: s (..., m) -> 2^(s - m'), mx -> m' = max(mx, max s),
        ln -> ln 2^(mx - m') + sum 2^(s - m'), a (..., D) *= 2^(mx - m')."""
        mn = torch.maximum(mx, s.amax(-1))
        alpha = (mx - mn).exp2_()
        p = s.sub_(mn.unsqueeze(-1)).exp2_()
        ln.mul_(alpha).add_(p.sum(-1))
        mx.copy_(mn)
        a.mul_(alpha.unsqueeze(-1))

    @staticmethod
    def probs(s, lse):
        """s (..., m) -> 2^(s - lse), lse (..., 1), in place."""
        s.sub_(lse).exp2_()

    @staticmethod
    def dscores(ds, p, delta):
        """ds (..., m) -> p (ds - delta), delta (..., 1), in place."""
        ds.sub_(delta).mul_(p)

    @staticmethod
    def unit_lower_inverse(t):
        """(I + strictLower(t))^-1 of each (C, C) matrix."""
        low = t.tril(-1)
        eye = torch.eye(t.shape[-1], dtype=t.dtype, device=t.device)
        return torch.linalg.solve_triangular(low, eye.expand_as(low), upper=False, unitriangular=True)


def ut_A(W: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A = (I + strictLower(diag(beta) W W^T))^-1 diag(beta); W (..., C, D), beta (..., C)."""
    return _ut_X(W, beta, PathTorchRows)[0] * beta.unsqueeze(-2)


def _ut_X(W, beta, rows):
    G = W @ W.transpose(-1, -2)
    X = rows.unit_lower_inverse(G * beta.unsqueeze(-1))  # the unit diagonal is implied
    return X, G


def _chunk_terms(q, k, w, bb, rows):
    """X, A, U, QW, KW, Zm and W W^T of a chunk of blocks (the module docstring's lines), made by the
    forward and made again by the backward."""
    x, G = _ut_X(w, bb, rows)
    A = x * bb.unsqueeze(-2)
    u = torch.bmm(A, w)
    qw = torch.bmm(q, w.mT).tril_()
    kw = torch.bmm(w, k.mT).tril_(-1)
    return x, A, u, qw, kw, torch.bmm(A, kw), G


class _PathBlocks(torch.autograd.Function):
    """(Q, K, W, b) flattened to (M, C, D) / (M, C) -> (Qt, Kt, Sd, P); M = N B H blocks."""

    @staticmethod
    def forward(ctx, Q, K, W, b, rows):
        M, C, D = Q.shape
        Qt, Kt = torch.empty_like(Q), torch.empty_like(K)
        Sd = Q.new_empty(M, C, C)
        P = Q.new_empty(M, D, D)
        above = torch.ones(C, C, dtype=torch.bool, device=Q.device).triu(1)
        eye = torch.eye(D, dtype=Q.dtype, device=Q.device)
        for a in range(0, M, _CHUNK):
            sl = slice(a, a + _CHUNK)
            q, k, w = Q[sl], K[sl], W[sl]
            _, _, u, qw, _, zm, _ = _chunk_terms(q, k, w, b[sl], rows)
            Qt[sl].copy_(q).baddbmm_(qw, u, alpha=-1)  # (torch.baddbmm with out= copies twice)
            Kt[sl].copy_(k).baddbmm_(zm.mT, w, alpha=-1)
            torch.bmm(q, k.mT, out=Sd[sl]).baddbmm_(qw, zm, alpha=-1)
            P[sl].copy_(eye).baddbmm_(w.mT, u, alpha=-1)
        Sd.masked_fill_(above, float("-inf"))
        ctx.save_for_backward(Q, K, W, b)
        ctx.rows = rows
        return Qt, Kt, Sd, P

    @staticmethod
    @once_differentiable
    def backward(ctx, dQt, dKt, dSd, dP):
        Q, K, W, b = ctx.saved_tensors
        M, C, D = Q.shape
        dQt, dKt, dSd, dP = (Q.new_zeros(shape) if g is None else g.contiguous() for g, shape in
                             ((dQt, Q.shape), (dKt, K.shape), (dSd, (M, C, C)), (dP, (M, D, D))))
        dQ, dK, dW, db = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(W), torch.empty_like(b)
        for a in range(0, M, _CHUNK):
            sl = slice(a, a + _CHUNK)
            q, k, w, bb = Q[sl], K[sl], W[sl], b[sl]
            x, A, u, qw, kw, zm, G = _chunk_terms(q, k, w, bb, ctx.rows)
            gqt, gkt, gp = dQt[sl], dKt[sl], dP[sl]
            gsd = dSd[sl].tril()  # nothing flows from the masked entries
            gq = dQ[sl].copy_(gqt).baddbmm_(gsd, k)
            gk = dK[sl].copy_(gkt).baddbmm_(gsd.mT, q)
            gqw = torch.bmm(gqt, u.mT).baddbmm_(gsd, zm.mT).tril_()  # minus dQW
            gu = torch.bmm(qw.mT, gqt).baddbmm_(w, gp)  # minus dU
            gw = torch.bmm(zm, gkt, out=dW[sl]).baddbmm_(u, gp.mT)  # minus dW so far
            gzm = torch.bmm(qw.mT, gsd).baddbmm_(w, gkt.mT)  # minus dZm
            gq.baddbmm_(gqw, w, alpha=-1)
            gw.baddbmm_(gqw.mT, q)  # (minus) + (minus dQW)^T Q
            gw.baddbmm_(A.mT, gu)
            gA = torch.bmm(gu, w.mT).baddbmm_(gzm, kw.mT)  # minus dA
            gkw = torch.bmm(A.mT, gzm).tril_(-1)  # minus dKW
            gw.baddbmm_(gkw, k)
            gk.baddbmm_(gkw.mT, w, alpha=-1)
            torch.sum(gA * x, -2, out=db[sl]).neg_()
            gX = gA * bb.unsqueeze(-2)  # minus dX
            gT = torch.bmm(x.mT, gX).bmm(x.mT).tril_(-1)  # dT = -X^T dX X^T: this is dLs
            db[sl] += (gT * G).sum(-1)
            gG = gT * bb.unsqueeze(-1)
            gw.neg_().baddbmm_(gG + gG.mT, w)
        return dQ, dK, dW, db, None


def path_blocks(Q, K, W, b, rows=PathTorchRows):
    """(Qt, Kt, Sd, P) for block-major inputs (N, Z, C, D), (N, Z, C); see the module docstring. ``rows``: the
    UT transform's inverse (:class:`PathTorchRows` or the C++ kernel's)."""
    N, Z, C, D = Q.shape
    outs = _PathBlocks.apply(*(t.reshape(N * Z, *t.shape[2:]) for t in (Q, K, W, b)), rows)
    return tuple(o.reshape(N, Z, *o.shape[1:]) for o in outs)
# </embedded>
