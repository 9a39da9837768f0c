"""The windowed scan of PaTH attention (:func:`pedsl.ops.path.path_attention_local`), hand-written backward.

Block-major layout, Z = B*H, the per-block quantities of :func:`pedsl.ops.path_blocks.path_blocks`:
``Qt`` (N, Z, C, D) queries moved to the start of their block, ``Kt`` keys moved to the end of theirs,
``P`` (N, Z, D, D) each block's product in row form, ``Sd`` (N, Z, C, C) the exact intra-block scores.
Query block n scores key blocks n - d for d = 0 .. nd - 1 (d = 0: ``Sd``)::

    R_1 = Qt_n,   R_(d+1) = R_d P_(n-d),   s_d = R_d Kt_(n-d)^T   (d >= 1)

so only the steps between a key and a query are composed, all inside the window. The caller's mask
(window or chunk by position, documents, padding) decides each pair; ``G`` (float64 cumulative log
gates) adds ``G_i - G_j``, formed in float64 and cast once; an optional sink (a logit per query and a
value per head) joins every softmax.

Query blocks go in groups, every block of a group at once per offset d: the scores of a group are one
(nd, n, Z, C, C) buffer, softmax over (d, key) in base 2 (``exp2`` is ~2.7x faster than ``exp`` on the
CPUs measured; the moved queries and the gates are scaled by log2(e) once). The forward keeps only the
output and each query's log-sum-exp beyond its inputs; the backward recomputes each group's chain of
moved queries and its probabilities (flash-style) and walks the offsets from the farthest back,
carrying the moved queries' gradient through ``P^T`` and accumulating ``dP += R^T carry``. Per pair of
blocks 3 products forward and 8 backward (flash attention: 2 and 5). Memory beyond the inputs and
their gradients: O(L D) for the output and log-sum-exp, plus one group's scores and moved queries at a
time; nothing grows with the window but that group. Float32 or float64 (the caller upcasts half
precision). Double backward is not supported.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.autograd.function import once_differentiable

from pedsl.ops.path_scan import _LOG2E

__all__ = ["path_window_scan"]

# <embedded>
# ---------------------------------------------------------------------------------------------
# PaTH inside a window (copied verbatim into generated modules of PaTH schemes).
# ---------------------------------------------------------------------------------------------
GROUP_SCORES = 1 << 21  # scores per group of query blocks (8 MiB in float32): the working set of a group

Hidden = Callable[[int, int], list]  # (n0, n1) -> per offset d: bool (n, B|1, 1, C, C) of pairs not scored, or None


def _b(x: torch.Tensor) -> torch.Tensor:
    """(..., r, c) -> (batch, r, c): a view for the block-major slices used here."""
    return x.reshape(-1, *x.shape[-2:])


def _first(d: int, n0: int) -> int:
    """The first query block of a group starting at n0 with a key block at offset d (n - d >= 0), local."""
    return max(0, d - n0)


def _scores(Qt, Kt, P, Sd, G2, hidden: Optional[list], n0: int, n1: int, S, Rs, B: int):
    """Base-2 scores of query blocks n0 .. n1 - 1 into ``S`` (nd, n, Z, C, C), masked with -inf (no key
    block, or ``hidden``); ``Rs[(d - 1) % len(Rs)]`` holds the moved queries R_d (log2(e) scaled) of the
    valid query blocks (len(Rs) = 2 cycles two buffers, nd - 1 keeps them all)."""
    nd, n, Z, C = S.shape[:4]
    if G2 is None:
        torch.mul(Sd[n0:n1], _LOG2E, out=S[0])
    else:
        g = G2[n0:n1]
        torch.sub(g.unsqueeze(-1), g.unsqueeze(-2), out=S[0]).add_(Sd[n0:n1], alpha=_LOG2E)
    if nd > 1:
        torch.mul(Qt[n0:n1], _LOG2E, out=Rs[0])
    for d in range(1, nd):
        lo = _first(d, n0)
        if lo >= n:
            S[d].fill_(float("-inf"))
            continue
        S[d, :lo].fill_(float("-inf"))
        R, out, keys = Rs[(d - 1) % len(Rs)][lo:], S[d, lo:], Kt[n0 + lo - d: n1 - d]
        if G2 is None:
            torch.bmm(_b(R), _b(keys).mT, out=_b(out))
        else:
            torch.sub(G2[n0 + lo: n1].unsqueeze(-1), G2[n0 + lo - d: n1 - d].unsqueeze(-2), out=out)
            _b(out).baddbmm_(_b(R), _b(keys).mT)
        if d < nd - 1:  # the queries moved through key block n - d
            up = _first(d + 1, n0)
            nxt = Rs[d % len(Rs)][up:]
            torch.bmm(_b(Rs[(d - 1) % len(Rs)][up:]), _b(P[n0 + up - d: n1 - d]), out=_b(nxt))
    if hidden is not None:
        for d, h in enumerate(hidden):
            if h is not None:
                S[d].view(n, B, Z // B, C, C).masked_fill_(h, float("-inf"))
    return S


class _PathWindow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Qt, Kt, V, P, Sd, G, logit, value, hidden: Hidden, B: int, nd: int, step: int):
        N, Z, C, D = Qt.shape
        G2 = None if G is None else G * _LOG2E
        lg2 = None if logit is None else logit * _LOG2E
        O, lse = torch.empty_like(Qt), Qt.new_empty(N, Z, C)
        S = Qt.new_empty(nd, min(step, N), Z, C, C)
        Rs = Qt.new_empty(2, min(step, N), Z, C, D)
        for n0 in range(0, N, step):
            n1 = min(N, n0 + step)
            n = n1 - n0
            s = _scores(Qt, Kt, P, Sd, G2, hidden(n0, n1), n0, n1, S[:, :n], Rs[:, :n], B)
            _softmax_rows(s, V, lg2, value, n0, n1, O[n0:n1], lse[n0:n1])
        ctx.save_for_backward(Qt, Kt, V, P, Sd, G, logit, value, O, lse)
        ctx.hidden, ctx.B, ctx.nd, ctx.step = hidden, B, nd, step
        return O

    @staticmethod
    @once_differentiable
    def backward(ctx, dO):
        Qt, Kt, V, P, Sd, G, logit, value, O, lse = ctx.saved_tensors
        B, nd, step = ctx.B, ctx.nd, ctx.step
        N, Z, C, D = Qt.shape
        dO = dO.contiguous()
        G2 = None if G is None else G * _LOG2E
        grads = _Grads(Qt, Kt, V, P, Sd, G, logit, value)
        S = Qt.new_empty(nd, min(step, N), Z, C, C)
        Rs = Qt.new_empty(max(1, nd - 1), min(step, N), Z, C, D)
        work = (Qt.new_empty(2, min(step, N), Z, C, D), Qt.new_empty(min(step, N), Z, C, C))
        Dl = (dO * O).sum(-1)  # (N, Z, C)
        for n0 in range(0, N, step):
            n1 = min(N, n0 + step)
            n = n1 - n0
            s = _scores(Qt, Kt, P, Sd, G2, ctx.hidden(n0, n1), n0, n1, S[:, :n], Rs[:, :n], B)
            p = s.sub_(lse[n0:n1].unsqueeze(-1)).exp2_()  # rows with no key have lse = +inf: p = 0
            grads.group(p, Rs[:, :n], (work[0][:, :n], work[1][:n]), dO, Dl, lse, n0, n1)
        return (*grads.result(), None, None, None, None)


def _softmax_rows(S, V, lg2, value, n0: int, n1: int, O, lse) -> None:
    """Softmax of a group's scores S (consumed) over every offset and key, plus the sink; writes the
    outputs O (n, Z, C, D) and the base-2 log-sum-exp (+inf for a query with no key: its output is 0)."""
    nd, n = S.shape[:2]
    m = S.amax(-1).amax(0)  # (n, Z, C)
    if lg2 is not None:
        m = torch.maximum(m, lg2[n0:n1])
    m = m.masked_fill_(m == float("-inf"), 0.0)
    p = S.sub_(m.unsqueeze(-1)).exp2_()
    l = p.sum(-1).sum(0)
    O.zero_()
    for d in range(nd):
        lo = _first(d, n0)
        if lo < n:
            _b(O[lo:]).baddbmm_(_b(p[d, lo:]), _b(V[n0 + lo - d: n1 - d]))
    if lg2 is not None:
        ps = (lg2[n0:n1] - m).exp2_()
        l.add_(ps)
        if value is not None:
            O.addcmul_(ps.unsqueeze(-1), value.unsqueeze(-2))
    empty = l == 0
    O.div_(l.masked_fill(empty, 1.0).unsqueeze(-1))
    torch.add(m, l.log2(), out=lse).masked_fill_(empty, float("inf"))


class _Grads:
    """The backward's accumulators and its per-group step."""

    def __init__(self, Qt, Kt, V, P, Sd, G, logit, value):
        self.Kt, self.V, self.P, self.logit, self.value = Kt, V, P, logit, value
        self.dQt, self.dKt, self.dV, self.dP = (torch.zeros_like(t) for t in (Qt, Kt, V, P))
        self.dSd = torch.empty_like(Sd)
        self.dG = None if G is None else torch.zeros_like(G)
        self.dlogit = None if logit is None else torch.empty_like(logit)
        self.dvalue = None if value is None else torch.zeros_like(value)

    def result(self):
        return self.dQt, self.dKt, self.dV, self.dP, self.dSd, self.dG, self.dlogit, self.dvalue

    def group(self, p, Rs, work, dO, Dl, lse, n0: int, n1: int) -> None:
        """Gradients from the probabilities ``p`` (nd, n, Z, C, C) of query blocks n0 .. n1 - 1 (consumed:
        they become the scores' gradients) and their moved queries ``Rs`` (R_d at d - 1)."""
        Kt, V, P = self.Kt, self.V, self.P
        nd, n = p.shape[:2]
        go, dl = dO[n0:n1], Dl[n0:n1].unsqueeze(-1)
        (carry, spare), dp = work[0].zero_().unbind(0), work[1]  # rows a query block never reaches stay 0
        if self.logit is not None:
            self._sink(go, Dl[n0:n1], lse[n0:n1], n0, n1)
        for d in range(nd - 1, -1, -1):
            lo = _first(d, n0)
            if lo >= n:
                continue
            kb = slice(n0 + lo - d, n1 - d)  # key blocks n - d of the valid query blocks
            pd, g = p[d, lo:], go[lo:]
            _b(self.dV[kb]).baddbmm_(_b(pd).mT, _b(g))
            torch.bmm(_b(g), _b(V[kb]).mT, out=_b(dp[lo:]))
            ds = pd.mul_(dp[lo:].sub_(dl[lo:]))  # the natural scores' gradient
            if self.dG is not None:
                self.dG[n0 + lo: n1] += ds.sum(-1)
                self.dG[kb] -= ds.sum(-2)
            if d == 0:
                self.dSd[n0:n1] = ds
                continue
            R = Rs[d - 1, lo:]
            _b(self.dKt[kb]).baddbmm_(_b(ds).mT, _b(R), alpha=1 / _LOG2E)
            c, nxt = carry[lo:], spare[lo:]
            if d < nd - 1:  # R_(d+1) = R_d P_(n-d): the carry goes back through P^T
                _b(self.dP[kb]).baddbmm_(_b(R).mT, _b(c), alpha=1 / _LOG2E)
                torch.bmm(_b(c), _b(P[kb]).mT, out=_b(nxt))
                _b(nxt).baddbmm_(_b(ds), _b(Kt[kb]))
            else:
                torch.bmm(_b(ds), _b(Kt[kb]), out=_b(nxt))
            carry, spare = spare, carry
        if nd > 1:
            self.dQt[n0 + _first(1, n0): n1] = carry[_first(1, n0):]

    def _sink(self, go, Dl, lse, n0: int, n1: int) -> None:
        assert self.dlogit is not None  # made with the logit this is called for
        ps = (self.logit[n0:n1] * _LOG2E - lse).exp2_()
        dps = -Dl if self.value is None else (go * self.value.unsqueeze(-2)).sum(-1).sub_(Dl)
        self.dlogit[n0:n1] = ps * dps
        if self.value is not None:
            self.dvalue += (ps.unsqueeze(-1) * go).sum((0, 2))


def path_window_scan(Qt, Kt, V, P, Sd, G, logit, value, hidden: Hidden, *, B: int, nd: int):
    """Outputs (N, Z, C, D) of the windowed scan; ``nd`` key blocks per query block (its own included),
    ``hidden(n0, n1)`` the pairs each group does not score, ``G`` (N, Z, C) float64 cumulative log gates
    or None, ``logit`` (N, Z, C) and ``value`` (Z, D) the sink or None."""
    N, Z, C, _ = Qt.shape
    step = max(1, GROUP_SCORES // (Z * C * C * nd))
    return _PathWindow.apply(Qt, Kt, V, P, Sd, G, logit, value, hidden, B, nd, step)
# </embedded>
