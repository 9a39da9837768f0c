"""Per-block UT/WY preprocessing of PaTH attention (:mod:`pedsl.ops.path`), hand-written backward.

For one block of C steps (rows: local steps; docs/semantics.md §2b, 6), with the scaled queries
Q, keys K, directions W (C, D) and strengths b (C)::

    X   = (I + strictLower(diag(b) W W^T))^-1,  A = X diag(b),  U = A W
    QW  = tril(Q W^T),  KW = tril(W K^T, -1),  Zm = A KW
    Qt  = Q - QW U           queries moved to the start of the block   q_i^T (H_i ... H_1)
    Kt  = K - Zm^T W         keys moved to the end of the block        (H_C ... H_(j+1)) k_j
    Sd  = Q K^T - QW Zm      exact intra-block scores (j <= i; -inf above the diagonal)
    P   = I - W^T U          the block's product H_C ... H_1 (queries as rows: r^T P)

The backward is the chain rule through these lines (21 products per block, nothing recomputed
but ``W W^T``). Both directions run over chunks of about 32 (block, head) pairs, so every
operand of a chunk stays in cache (one pass over all N B H blocks at once streams from memory
and ran at half the speed, with autograd's copies on top).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["ut_A", "path_blocks"]

_CHUNK = 32  # (block, head) pairs per chunk: 32 x (64 x 64) floats = 512 KiB per operand


def ut_A(W: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A = (I + strictLower(diag(beta) W W^T))^-1 diag(beta); W (..., C, D), beta (..., C)."""
    return _ut_X(W, beta)[0] * beta.unsqueeze(-2)


def _ut_X(W, beta):
    G = W @ W.transpose(-1, -2)
    C = W.shape[-2]
    eye = torch.eye(C, dtype=W.dtype, device=W.device)
    low = torch.tril(G * beta.unsqueeze(-1), -1)  # the unit diagonal is implied below
    X = torch.linalg.solve_triangular(low, eye.expand_as(low), upper=False, unitriangular=True)
    return X, G


def _t(x):
    return x.transpose(-1, -2)


class _PathBlocks(torch.autograd.Function):
    """(Q, K, W, b) flattened to (M, C, D) / (M, C) -> (Qt, Kt, Sd, P); M = N B H blocks."""

    @staticmethod
    def forward(ctx, Q, K, W, b):
        M, C, D = Q.shape
        Qt, Kt = torch.empty_like(Q), torch.empty_like(K)
        Sd = Q.new_empty(M, C, C)
        P = Q.new_empty(M, D, D)
        X, QW, KW, Zm = (Q.new_empty(M, C, C) for _ in range(4))
        U = torch.empty_like(Q)
        above = torch.ones(C, C, dtype=torch.bool, device=Q.device).triu(1)
        eye = torch.eye(D, dtype=Q.dtype, device=Q.device)
        for a in range(0, M, _CHUNK):
            sl = slice(a, a + _CHUNK)
            q, k, w, bb = Q[sl], K[sl], W[sl], b[sl]
            x = _ut_X(w, bb)[0]
            X[sl] = x
            A = x * bb.unsqueeze(-2)
            u = torch.bmm(A, w, out=U[sl])
            qw = torch.bmm(q, _t(w), out=QW[sl]).tril_()
            kw = torch.bmm(w, _t(k), out=KW[sl]).tril_(-1)
            zm = torch.bmm(A, kw, out=Zm[sl])
            Qt[sl].copy_(q).baddbmm_(qw, u, alpha=-1)  # (torch.baddbmm with out= copies twice)
            Kt[sl].copy_(k).baddbmm_(_t(zm), w, alpha=-1)
            torch.bmm(q, _t(k), out=Sd[sl]).baddbmm_(qw, zm, alpha=-1)
            P[sl].copy_(eye).baddbmm_(_t(w), u, alpha=-1)
        Sd.masked_fill_(above, float("-inf"))
        ctx.save_for_backward(Q, K, W, b, X, U, QW, KW, Zm)
        return Qt, Kt, Sd, P

    @staticmethod
    @once_differentiable
    def backward(ctx, dQt, dKt, dSd, dP):
        Q, K, W, b, X, U, QW, KW, Zm = ctx.saved_tensors
        M, C, D = Q.shape
        dQt, dKt, dSd, dP = (Q.new_zeros(shape) if g is None else g.contiguous() for g, shape in
                             ((dQt, Q.shape), (dKt, K.shape), (dSd, (M, C, C)), (dP, (M, D, D))))
        dQ, dK, dW, db = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(W), torch.empty_like(b)
        for a in range(0, M, _CHUNK):
            sl = slice(a, a + _CHUNK)
            q, k, w, bb, x, u, qw, kw, zm = (t[sl] for t in (Q, K, W, b, X, U, QW, KW, Zm))
            gqt, gkt, gp = dQt[sl], dKt[sl], dP[sl]
            gsd = dSd[sl].tril()  # nothing flows from the masked entries
            A = x * bb.unsqueeze(-2)
            gq = dQ[sl].copy_(gqt).baddbmm_(gsd, k)
            gk = dK[sl].copy_(gkt).baddbmm_(_t(gsd), q)
            gqw = torch.bmm(gqt, _t(u)).baddbmm_(gsd, _t(zm)).tril_()  # minus dQW
            gu = torch.bmm(_t(qw), gqt).baddbmm_(w, gp)  # minus dU
            gw = torch.bmm(zm, gkt, out=dW[sl]).baddbmm_(u, _t(gp))  # minus dW so far
            gzm = torch.bmm(_t(qw), gsd).baddbmm_(w, _t(gkt))  # minus dZm
            gq.baddbmm_(gqw, w, alpha=-1)
            gw.baddbmm_(_t(gqw), q)  # (minus) + (minus dQW)^T Q
            gw.baddbmm_(_t(A), gu)
            gA = torch.bmm(gu, _t(w)).baddbmm_(gzm, _t(kw))  # minus dA
            gkw = torch.bmm(_t(A), gzm).tril_(-1)  # minus dKW
            gw.baddbmm_(gkw, k)
            gk.baddbmm_(_t(gkw), w, alpha=-1)
            torch.sum(gA * x, -2, out=db[sl]).neg_()
            gX = gA * bb.unsqueeze(-2)  # minus dX
            gT = torch.bmm(_t(x), gX).bmm(_t(x)).tril_(-1)  # dT = -X^T dX X^T: this is dLs
            G = torch.bmm(w, _t(w))
            db[sl] += (gT * G).sum(-1)
            gG = gT * bb.unsqueeze(-1)
            gw.neg_().baddbmm_(gG + _t(gG), w)
        return dQ, dK, dW, db


def path_blocks(Q, K, W, b):
    """(Qt, Kt, Sd, P) for block-major inputs (N, Z, C, D), (N, Z, C); see the module docstring."""
    N, Z, C, D = Q.shape
    outs = _PathBlocks.apply(*(t.reshape(N * Z, *t.shape[2:]) for t in (Q, K, W, b)))
    return tuple(o.reshape(N, Z, *o.shape[1:]) for o in outs)
