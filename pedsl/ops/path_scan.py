"""The blockwise scan of PaTH attention (:mod:`pedsl.ops.path`): online softmax over moved keys.

Two levels of key blocks (docs/semantics.md §2b, 6). Block-major layout, Z = B*H:

* small blocks of C steps: ``Qt`` (N, Z, C, D) queries moved to the start of their block, ``Kt``
  keys moved to the end of theirs, ``P`` (N, Z, D, D) each block's product in row form
  (``R <- R P`` moves a query block through one key block), ``Sd`` (N, Z, C, C) the exact
  intra-block scores (masked above the diagonal);
* superblocks of S = k C steps, made inside the function from Kt and P: ``Ks`` (NK, Z, S, D)
  the keys of a superblock moved to its end, ``PS`` (NK, Z, D, D) the superblock's product
  (``P_(last) ... P_(first)``); their backward is hand-written too (autograd through the
  batched products and their stacking cost ~0.1 s at L = 2048, B H = 32).

Query block n (superblock Mn = n // k, first block f = Mn k) scores its own block (``Sd``), the
earlier blocks of its own superblock one by one (``R <- R P_j``), then every earlier superblock
with one (C, D) x (D, S) product (``R <- R PS_M``). Per pair of C-blocks far apart that is the
2 C^2 D of attention plus C D^2 / k for the transport, instead of C D^2 (k = 4: 25% fewer
FLOPs than one level at C = D = 64, and products 4x wider).

The backward is hand-written (flash-style): it recomputes each query block's probabilities and
its chain of moved queries (one product per pair), then walks the pairs from the farthest key
block back, carrying the gradient of the moved queries (``carry P^T``) and accumulating the
transports' gradients (``dP += R^T carry``). Memory O(L D + L C + L D^2 / C) per head; no L^2
term. Softmax in base 2: the scores are scaled by log2(e) once (``exp2`` is ~2.7x faster than
``exp`` on the CPUs measured). Scores, moved queries and carries go into scratch buffers reused
by every pair (a fresh multi-MiB output page-faults on each call). Float32 or float64 only (the
caller upcasts half precision). Double backward is not supported.

``rows`` (:class:`pedsl.ops.path_blocks.PathTorchRows` or the package's C++ kernel,
:mod:`pedsl.ops.path_kernel`) runs the loops over the pairs of blocks: torch's below batch every
product over all heads; the C++ ones run one head per task (same arithmetic, operands in cache).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from pedsl.ops.path_blocks import PathTorchRows

__all__ = ["path_scan"]

# <embedded>
# ---------------------------------------------------------------------------------------------
# PaTH's blockwise scan (copied verbatim into generated modules of PaTH schemes).
# ---------------------------------------------------------------------------------------------
_LOG2E = 1.4426950408889634  # 1 / ln 2


def _add_bias(s, glq, gbq, glk, gbk, n, j):
    """s += G_i - G_j for query block n and key block j, in place; float64 block offsets."""
    off = (gbq[n] - gbk[j]).to(glq.dtype)  # cast after the difference
    return s.add_((glq[n] + off.unsqueeze(-1)).unsqueeze(-1)).sub_(glk[j].unsqueeze(-2))


def _group(x, NK, k):
    """(N, Z, C, ...) -> (NK, Z, k C, ...): the first NK k blocks grouped into superblocks."""
    N, Z, C = x.shape[:3]
    y = x[: NK * k].reshape(NK, k, Z, C, *x.shape[3:]).transpose(1, 2)
    return y.reshape(NK, Z, k * C, *x.shape[3:])


def _ungroup(y, k):
    """Inverse of :func:`_group`: (NK, Z, k C, ...) -> (NK k, Z, C, ...)."""
    NK, Z, S = y.shape[:3]
    x = y.reshape(NK, Z, k, S // k, *y.shape[3:]).transpose(1, 2)
    return x.reshape(NK * k, Z, S // k, *y.shape[3:])


def _move_keys(Kt, P, NK, k):
    """Keys moved to their superblock's end and the superblocks' products, without autograd.

    Inside a superblock (local blocks r = 0 .. k-1) ``T_r = P_(k-1) ... P_(r+1)`` (``T_(k-1) = I``),
    ``Ks_r = Kt_r T_r^T`` and ``PS = T_0 P_0``: a reverse scan of k - 1 products of (C, D) x (D, D)
    and k of D x D, batched over all superblocks. Returns ``(Ks (NK, Z, k C, D), PS, T)``; T
    (NK, k, Z, D, D) is kept for the backward (:func:`_move_keys_backward`).
    """
    _, Z, C, D = Kt.shape
    K4 = Kt[: NK * k].view(NK, k, Z, C, D)
    P4 = P[: NK * k].view(NK, k, Z, D, D)
    T = P.new_empty(NK, k, Z, D, D)
    T[:, k - 1] = torch.eye(D, dtype=P.dtype, device=P.device)
    Ks = Kt.new_empty(NK, Z, k, C, D)
    Ks[:, :, k - 1] = K4[:, k - 1]
    for r in range(k - 2, -1, -1):
        torch.matmul(T[:, r + 1], P4[:, r + 1], out=T[:, r])
        Ks[:, :, r] = K4[:, r] @ T[:, r].transpose(-1, -2)
    return Ks.view(NK, Z, k * C, D), T[:, 0] @ P4[:, 0], T


def _move_keys_backward(dKs, dPS, Kt, P, T, dK, dP, k):
    """Adds the gradients of (Ks, PS) of :func:`_move_keys` to dK and dP (in place)."""
    NK, Z, _, D = dKs.shape
    C = Kt.shape[2]
    K4, P4 = Kt[: NK * k].view(NK, k, Z, C, D), P[: NK * k].view(NK, k, Z, D, D)
    dK4, dP4 = dK[: NK * k].view(NK, k, Z, C, D), dP[: NK * k].view(NK, k, Z, D, D)
    dKs4 = dKs.view(NK, Z, k, C, D)
    G = dPS  # gradient of T_(r-1) = T_r P_r (T_(-1) = PS)
    for r in range(k):
        dP4[:, r] += T[:, r].transpose(-1, -2) @ G
        if r < k - 1:  # T_(k-1) = I is a constant
            G = G @ P4[:, r].transpose(-1, -2) + dKs4[:, :, r].transpose(-1, -2) @ K4[:, r]
            dK4[:, r] += dKs4[:, :, r] @ T[:, r]
        else:
            dK4[:, r] += dKs4[:, :, r]


def _super_bias(gl, gb, NK, k):
    """Forget-gate terms of the key superblocks (differentiable): local (NK, Z, k C) and the
    float64 offset at each superblock's start (NK, Z)."""
    gbS = gb[0 : NK * k : k]
    rel = (gb[: NK * k].reshape(NK, k, -1) - gbS.unsqueeze(1)).to(gl.dtype)
    return _group(gl[: NK * k] + rel.reshape(NK * k, -1).unsqueeze(-1), NK, k), gbS


def _diagonal(Sd, V):
    """The diagonal blocks' softmax state: running max m, sum l (N, Z, C) and accumulator (N, Z, C, D)."""
    m = Sd.amax(-1)  # the diagonal is never masked
    p = (Sd - m.unsqueeze(-1)).exp2_()
    return m, p.sum(-1), p @ V


def _diagonal_backward(Sd, lse, dO, V, Dl):
    """dV of the diagonal blocks (the start of dV) and dSd."""
    p = (Sd - lse).exp2_()
    return p.transpose(-1, -2) @ dO, (dO @ V.transpose(-1, -2)).sub_(Dl).mul_(p)


def _forward_pairs(ts, k, rows):
    """The forward's loop over the pairs of blocks below the diagonal: updates m, l, acc in place."""
    Qt, KtT, V, P, KsT, VS, PS, m, l, acc, gl, gb, glS, gbS = ts
    N, Z, C, D = Qt.shape
    bias, NK = gl is not None, 0 if KsT is None else KsT.shape[0]
    # scratch reused by every pair (fresh multi-MiB outputs cost page faults on each call)
    sb, sx = Qt.new_empty(Z, C, C), Qt.new_empty(Z, C, k * C) if NK else None
    Rb = Qt.new_empty(2, Z, C, D)
    for n in range(1, N):
        Mn = n // k
        R, mx, ln, a, t = Qt[n], m[n], l[n], acc[n], 0  # the running max and sum updated in place
        for j in range(n - 1, Mn * k - 1, -1):  # earlier blocks of its own superblock
            s = torch.bmm(R, KtT[j], out=sb)
            if bias:
                _add_bias(s, gl, gb, gl, gb, n, j)
            rows.online(s, mx, ln, a)
            a.baddbmm_(s, V[j])
            if j > 0:
                R, t = torch.bmm(R, P[j], out=Rb[t]), 1 - t
        for M in range(Mn - 1, -1, -1):  # earlier superblocks
            s = torch.bmm(R, KsT[M], out=sx)
            if bias:
                _add_bias(s, gl, gb, glS, gbS, n, M)
            rows.online(s, mx, ln, a)
            a.baddbmm_(s, VS[M])
            if M > 0:
                R, t = torch.bmm(R, PS[M], out=Rb[t]), 1 - t


def _backward_pairs(ins, outs, k, rows):
    """The backward's loop over the pairs of blocks below the diagonal: accumulates into ``outs``."""
    Qt, Kt, KtT, V, P, Ks, KsT, VS, PS, dO, Dl, lse, gl, gb, glS, gbS = ins
    dQt, dK, dV, dP, dKs, dVS, dPS, dgl, dgb, dglS, dgbS = outs
    N, Z, C, D = Qt.shape
    bias, NK = gl is not None, 0 if Ks is None else Ks.shape[0]
    sb, sx = Qt.new_empty(2, Z, C, C), Qt.new_empty(2, Z, C, k * C) if NK else None
    Rst = Qt.new_empty(k + NK, Z, C, D)  # one query block's chain of moved queries
    gb2 = Qt.new_empty(2, Z, C, D)

    def pair(n, R, KT, Kk, Vk, glk, gbk, dglk, dgbk, j, dVk, dKk, buf, out):
        """Probabilities recomputed; dV, dK, bias grads accumulated; returns dR (in out)."""
        s = torch.bmm(R, KT[j], out=buf[0])
        if bias:
            _add_bias(s, gl, gb, glk, gbk, n, j)
        rows.probs(s, lse[n])
        p = s
        dVk[j].baddbmm_(p.transpose(-1, -2), dO[n])
        ds = torch.bmm(dO[n], Vk[j].transpose(-1, -2), out=buf[1])
        rows.dscores(ds, p, Dl[n])
        if bias:
            rs = ds.sum(-1)
            dgl[n] += rs
            dglk[j] -= ds.sum(-2)
            tot = rs.sum(-1).to(dgb.dtype)
            dgb[n] += tot
            dgbk[j] -= tot
        dKk[j].baddbmm_(ds.transpose(-1, -2), R)
        return torch.bmm(ds, Kk[j], out=out)

    for n in range(1, N):
        Mn = n // k
        f = Mn * k
        # Rst[n-1-j]: query block n moved to key block j of its superblock (recomputed);
        # then Rst[n-f+Mn-1-M]: moved to the end of superblock M
        Rs = [Qt[n]]
        for j in range(n - 1, f, -1):
            Rs.append(torch.bmm(Rs[-1], P[j], out=Rst[len(Rs)]))
        Rx = []
        if Mn:
            Rx.append(torch.bmm(Rs[-1], P[f], out=Rst[len(Rs)]) if n > f else Qt[n])
            for M in range(Mn - 1, 0, -1):
                Rx.append(torch.bmm(Rx[-1], PS[M], out=Rst[len(Rs) + len(Rx)]))
        carry, t = None, 0  # gradient of the moved queries one key block (superblock) further
        for M in range(Mn):
            R = Rx[Mn - 1 - M]
            g = pair(n, R, KsT, Ks, VS, glS, gbS, dglS, dgbS, M, dVS, dKs, sx, gb2[t])
            if carry is not None:  # R at superblock M-1 = R PS_M
                g.baddbmm_(carry, PS[M].transpose(-1, -2))
                dPS[M].baddbmm_(R.transpose(-1, -2), carry)
            carry, t = g, 1 - t
        for j in range(f, n):
            R = Rs[n - 1 - j]
            g = pair(n, R, KtT, Kt, V, gl, gb, dgl, dgb, j, dV, dK, sb, gb2[t])
            if carry is not None:  # R at key block j-1 = R P_j
                g.baddbmm_(carry, P[j].transpose(-1, -2))
                dP[j].baddbmm_(R.transpose(-1, -2), carry)
            carry, t = g, 1 - t
        if carry is not None:
            dQt[n] = carry


class _PathScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Qt, Kt, V, P, Sd, gl, gb, glS, gbS, k, rows):
        N, Z, C, D = Qt.shape
        NK = (N - 1) // k  # key superblocks (the last query block's superblock is never one)
        Ks = PS = T = None
        if NK:
            Ks, PS, T = _move_keys(Kt, P, NK, k)
        bias = gl is not None
        # base 2 throughout (exp2 is ~2.7x faster than exp on CPU): scores scaled by log2(e)
        Qt, Sd = Qt * _LOG2E, Sd * _LOG2E
        if bias:
            gl, gb = gl * _LOG2E, gb * _LOG2E
            glS, gbS = (None, None) if glS is None else (glS * _LOG2E, gbS * _LOG2E)
        cpp = rows.scan_forward is not None
        m, l, acc = (Sd.new_empty(N, Z, C), Sd.new_empty(N, Z, C), V.new_empty(N, Z, C, D)) if cpp else _diagonal(Sd, V)
        KtT = Kt.transpose(-1, -2).contiguous()  # (N, Z, D, C)
        KsT = Ks.transpose(-1, -2).contiguous() if Ks is not None else None  # (NK, Z, D, S); made when NK
        VS = _group(V, NK, k) if NK else None  # (NK, Z, S, D)
        ts = (Qt, KtT, V, P, KsT, VS, PS, m, l, acc, gl, gb, glS, gbS)
        if cpp:  # the diagonal blocks too (m, l, acc start there)
            rows.scan_forward([Qt.new_empty(0) if x is None else x.contiguous() for x in ts + (Sd,)], k)
        else:
            _forward_pairs(ts, k, rows)
        O = acc.div_(l.unsqueeze(-1))
        lse = m + torch.log2(l)  # base 2, of the scaled scores
        ctx.save_for_backward(Qt, Kt, V, P, Sd, gl, gb, Ks, PS, T, glS, gbS, O, lse, KtT, KsT)
        ctx.k, ctx.bias, ctx.rows = k, bias, rows
        return O

    @staticmethod
    @once_differentiable
    def backward(ctx, dO):
        Qt, Kt, V, P, Sd, gl, gb, Ks, PS, T, glS, gbS, O, lse, KtT, KsT = ctx.saved_tensors
        k, bias, rows = ctx.k, ctx.bias, ctx.rows
        N, Z, C, D = V.shape
        NK = 0 if Ks is None else Ks.shape[0]
        dO = dO.contiguous()
        Dl = (dO * O).sum(-1).unsqueeze(-1)  # (N, Z, C, 1)
        lse = lse.unsqueeze(-1)
        cpp = rows.scan_backward is not None
        dV, dSd = (torch.empty_like(V), torch.empty_like(Sd)) if cpp else _diagonal_backward(Sd, lse, dO, V, Dl)
        dQt, dK, dP = torch.zeros_like(Qt), torch.zeros_like(Kt), torch.zeros_like(P)
        dgl = torch.zeros_like(gl) if bias else None
        dgb = torch.zeros_like(gb) if bias else None
        VS = _group(V, NK, k) if NK else None
        dVS = torch.zeros_like(VS) if VS is not None else None  # made when NK
        dKs = torch.zeros_like(Ks) if NK else None
        dPS = torch.zeros_like(PS) if NK else None
        dglS = torch.zeros_like(glS) if NK and bias else None
        dgbS = torch.zeros_like(gbS) if NK and bias else None

        ins = (Qt, Kt, KtT, V, P, Ks, KsT, VS, PS, dO, Dl, lse, gl, gb, glS, gbS)
        outs = (dQt, dK, dV, dP, dKs, dVS, dPS, dgl, dgb, dglS, dgbS)
        if cpp:  # the diagonal blocks too (they start dV and make dSd)
            rows.scan_backward([Qt.new_empty(0) if x is None else x.contiguous() for x in ins + outs + (Sd, dSd)], k)
        else:
            _backward_pairs(ins, outs, k, rows)
        if NK:
            dV[: NK * k] += _ungroup(dVS, k)
        if NK:
            _move_keys_backward(dKs, dPS, Kt, P, T, dK, dP, k)
        for t in (dK, dP):  # accumulated with the queries scaled by log2(e)
            t.div_(_LOG2E)
        return dQt, dK, dV, dP, dSd, dgl, dgb, dglS, dgbS, None, None


def path_scan(Qt, Kt, V, P, Sd, gl=None, gb=None, *, k: int = 4, rows=PathTorchRows):
    """Output (N, Z, C, D) of the two-level scan; ``k`` blocks per superblock (1: one level); ``rows``: the
    elementwise steps (:class:`PathTorchRows` or the C++ kernel's)."""
    NK = (Qt.shape[0] - 1) // k
    glS, gbS = _super_bias(gl, gb, NK, k) if NK and gl is not None else (None, None)
    return _PathScan.apply(Qt, Kt, V, P, Sd, gl, gb, glS, gbS, k, rows)
# </embedded>
