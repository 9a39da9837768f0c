"""PaTH's kernels without input checks: the blockwise forward (:func:`path_forward`), PaTH inside a
window (:func:`path_local_forward`) and the keys a decoding cache holds after a prefill
(:func:`path_transported_keys`). :mod:`pedsl.ops.path` documents the algorithm and checks the inputs
of its public calls; the general forward calls these through its kernels.

Torch only: codegen copies the text after the ``# ----`` banner verbatim into every generated module
of a PaTH scheme (after :mod:`pedsl.ops.path_blocks`', :mod:`pedsl.ops.path_scan`'s and
:mod:`pedsl.ops.path_window`'s), so a compiled module runs the same kernels as the package.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pedsl.ops.path_blocks import PathTorchRows, path_blocks, ut_A
from pedsl.ops.path_scan import path_scan
from pedsl.ops.path_window import path_window_scan

__all__ = ["path_forward", "path_local_forward", "path_transported_keys"]

# <embedded>
# ---------------------------------------------------------------------------------------------
# PaTH's entry points (copied verbatim into generated modules of PaTH schemes).
# ---------------------------------------------------------------------------------------------
def scaled_q(q, scale, q_scale):
    """q times the scale (1 / sqrt(D) when None) and the per-query temperature ``q_scale (B|1, H|1, L)``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qs = q * scale
    if q_scale is not None:
        qs = qs * q_scale.to(q.dtype).unsqueeze(-1)
    return qs


def _blocks(x: torch.Tensor, C: int) -> torch.Tensor:
    """(B, H, L, E) -> (N, Z, C, E) or (B, H, L) -> (N, Z, C), block-major (one copy); the tail padded
    with zeros to N C steps."""
    B, H, L = x.shape[:3]
    N = -(-L // C)
    pad = N * C - L
    flat = x.dim() == 3
    x = x.unsqueeze(-1) if flat else x
    x = (F.pad(x, (0, 0, 0, pad)) if pad else x).reshape(B * H, N, C, x.shape[-1]).transpose(0, 1).contiguous()
    return x.squeeze(-1) if flat else x


_LOG_FORGET_MIN = -1e4  # exp(-1e4) is 0 in every float format: "forget everything before"


def path_forward(q, k, v, w, beta, log_forget=None, scale=None, *, block_size=64, q_scale=None, superblock=4,
                 rows=PathTorchRows):
    """:func:`pedsl.ops.path.path_attention` on inputs of the right shapes (unchecked); ``rows``: the elementwise
    steps (:class:`PathTorchRows`, or the package's C++ kernel)."""
    B, H, L, D = q.shape
    if L == 0:
        return torch.zeros_like(v)
    out_dtype = q.dtype
    if q.dtype in (torch.float16, torch.bfloat16):  # the scan runs in float32 (softmax statistics)
        q, k, v, w = (t.float() for t in (q, k, v, w))
    C = max(1, min(int(block_size), L))
    N = -(-L // C)  # the padded steps sit after every real token: H = I, bias 0, never attended to
    qs = scaled_q(q, scale, q_scale)
    Q, K, Vb, W = (_blocks(t, C) for t in (qs, k, v, w))
    bt = _blocks(beta.to(q.dtype), C)  # (N, Z, C)
    Qt, Kt, Sd, P = path_blocks(Q, K, W, bt, rows)
    gl = gb = None
    if log_forget is not None:
        lf = log_forget.to(torch.float64).clamp_min(_LOG_FORGET_MIN)  # no -inf - -inf = NaN
        lf = _blocks(lf, C)  # (N, Z, C)
        loc = lf.cumsum(-1)  # local cumulative sums, float64
        gb = F.pad(loc[..., -1].cumsum(0)[:-1], (0, 0, 1, 0))  # (N, Z) exclusive block offsets
        gl = loc.to(q.dtype)
        Sd = Sd + gl.unsqueeze(-1) - gl.unsqueeze(-2)
    O = path_scan(Qt, Kt, Vb, P, Sd, gl, gb, k=max(1, int(superblock)), rows=rows)
    return O.transpose(0, 1).reshape(B, H, N * C, D)[:, :, :L].to(out_dtype)


def path_local_forward(q, k, v, w, beta, log_forget=None, scale=None, *, reach: int, allowed=None, sink=None,
                       block_size=64, rows=PathTorchRows):
    """:func:`pedsl.ops.path.path_attention_local` on inputs of the right shapes (unchecked); ``rows``: the UT
    transform's inverse (:class:`PathTorchRows`, or the package's C++ kernel)."""
    B, H, L, D = q.shape
    if L == 0:
        return torch.zeros_like(v)
    out_dtype = q.dtype
    if q.dtype in (torch.float16, torch.bfloat16):  # scores and softmax in float32
        q, k, v, w = (t.float() for t in (q, k, v, w))
    C = max(1, min(int(block_size), L))
    N = -(-L // C)
    nd = min(N, 1 + -(-max(0, int(reach)) // C))  # key blocks a query block reads, its own included
    Q, K, Vb, W = (_blocks(t, C) for t in (scaled_q(q, scale, None), k, v, w))
    Qt, Kt, Sd, P = path_blocks(Q, K, W, _blocks(beta.to(q.dtype), C), rows)
    G = None if log_forget is None else _blocks(
        log_forget.to(torch.float64).clamp_min(_LOG_FORGET_MIN).cumsum(-1), C)  # (N, Z, C) float64
    logit = None if sink is None else _blocks(sink[0].to(q.dtype).expand(B, H, L), C)
    value = None if sink is None or sink[1] is None else sink[1].to(q.dtype).expand(B, H, 1, D).reshape(B * H, D)
    hidden = _hidden_pairs(L, C, nd, int(reach), allowed, q.device)
    O = path_window_scan(Qt, Kt, Vb, P, Sd, G, logit, value, hidden, B=B, nd=nd)
    return O.transpose(0, 1).reshape(B, H, N * C, D)[:, :, :L].to(out_dtype)


def _hidden_pairs(L: int, C: int, nd: int, reach: int, allowed, device):
    """The pairs a group of query blocks n0 .. n1 - 1 does not score, per key-block offset d: a bool
    (n, B|1, 1, C, C) for key block n - d, or None where it scores every pair (window, documents,
    padding; keys past L and after the query)."""
    idx = torch.arange(-(-L // C) * C, device=device).view(-1, C)

    def hidden(n0: int, n1: int) -> list:
        i = idx[n0:n1].unsqueeze(-1)  # (n, C, 1)
        j = torch.cat([idx[n0:n1] - d * C for d in range(nd)], -1).unsqueeze(1)  # (n, 1, nd C)
        ok = ((j >= 0) & (j <= i) & (i - j <= reach) & (j < L)).unsqueeze(0)
        if allowed is not None:
            ok = ok & allowed(i.clamp(max=L - 1), j.clamp(0, L - 1))
        n = n1 - n0
        hid = ~ok.view(ok.shape[0], n, C, nd, C).permute(3, 1, 0, 2, 4).unsqueeze(3)  # (nd, n, B|1, 1, C, C)
        return [h if bool(h.any()) else None for h in hid.unbind(0)]

    return hidden


def path_transported_keys(k, w, beta, *, block_size: int = 64):
    """Every key moved to the last position: ``Kt_j = H_(L-1) ... H_(j+1) k_j``, (B, H, L, D).

    What a decoding cache holds after a prefill (the PaTH decode rule then applies each new
    token's step to all of them: ``Kt <- Kt - beta (Kt w) w^T``, O(L D) per token and head).
    Blockwise: keys moved to the end of their block with the UT form, then through the explicit
    products of the later blocks by a reverse scan (``L/C`` D x D products per head).
    """
    B, H, L, D = k.shape
    if L == 0:
        return k
    dt = k.dtype
    if dt in (torch.float16, torch.bfloat16):
        k, w = k.float(), w.float()
    C = max(1, min(int(block_size), L))
    N = -(-L // C)
    pad = N * C - L

    def blocks(x):
        return F.pad(x, (0, 0, 0, pad)).reshape(B * H, N, C, x.shape[-1]).transpose(0, 1)

    K, W = blocks(k), blocks(w)
    bt = blocks(beta.to(k.dtype).unsqueeze(-1)).squeeze(-1)
    A = ut_A(W, bt)
    Kt = K - (A @ torch.tril(W @ K.transpose(-1, -2), -1)).transpose(-1, -2) @ W  # to the end of the block
    eye = torch.eye(D, dtype=K.dtype, device=K.device)
    PT = (eye - W.transpose(-1, -2) @ A @ W).transpose(-1, -2)  # (H_C ... H_1)^T per block (N, Z, D, D)
    outs: list[torch.Tensor] = []  # block N - 1 first: each goes in front
    M = None  # (P_(m+1) ... P_(N-1))^T in row form
    for m in range(N - 1, -1, -1):
        outs.insert(0, Kt[m] if M is None else Kt[m] @ M)
        M = PT[m] if M is None else PT[m] @ M
    out = torch.stack(outs, 0).transpose(0, 1).reshape(B, H, N * C, D)[:, :, :L]
    return out.to(dt)
# </embedded>
