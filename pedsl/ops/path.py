"""PaTH attention: softmax attention with accumulated Householder-like transports.

Paper: "PaTH Attention: Position Encoding via Accumulating Householder
Transformations" (arXiv 2505.16381, sec. 2-3); reference kernels in
fla-org/flash-linear-attention ``fla/ops/path_attn/``. docs/semantics.md §2b, 5.3, 6.

Shapes: q, k, v, w ``(B, H, L, D)``; beta, log_forget ``(B, H, L)``;
q_scale ``(B|1, H|1, L)``. For a causal pair ``j <= i``::

    H_t      = I - beta_t w_t w_t^T            (w_t unit-norm by the caller; not renormalised)
    P(j->i)  = H_i H_(i-1) ... H_(j+1)         (identity when j = i)
    s(i, j)  = scale * q_scale_i * q_i^T P(j->i) k_j + G_i - G_j,   G_t = sum_{s<=t} log_forget_s
    o_i      = sum_j softmax_j(s(i, .)) v_j

Blockwise algorithm (steps grouped in blocks of C; local indices inside a block):

* UT / WY form of a block's product (checked against explicit products in tests)::

      A   = (I + strictLower(diag(beta) W W^T))^-1 diag(beta)     (C, C), lower triangular
      H_C ... H_1 = I - W^T A W ,   any contiguous sub-range [b..a] uses the sub-block A[b:a, b:a]

  (the diagonal blocks of the inverse of a block-triangular matrix are the inverses of its
  diagonal blocks).
* Queries moved to the start of their block, keys moved to the end of theirs (U = A W)::

      Qt = Q - tril(Q W^T) U                      q_i^T (H_i ... H_1)
      Kt = K - (A tril(W K^T, -1))^T W            (H_C ... H_(j+1)) k_j
      S_diag = Q K^T - tril(Q W^T) A tril(W K^T, -1)   (exact intra-block transports, j <= i)

* Off-diagonal key block m < n: ``s = R Kt_m^T`` with ``R = Qt_n P_(n-1) ... P_(m+1)`` in row
  form, ``P_m = I - W_m^T U_m`` (D, D) = H_C ... H_1 of block m (one D x D matrix per
  block: (L/C) D^2 numbers per head, never (L, D, D)). Key blocks are grouped in superblocks of
  ``superblock`` (k = 4) blocks: query block n scores the earlier blocks of its own superblock
  one at a time (``R <- R P_m``), then each earlier superblock with one (C, D) x (D, k C)
  product against its keys moved to the superblock's end (``R <- R PS_M``, one D x D product
  per superblock). Softmax is online (flash-style running max / sum, base 2).
  :mod:`pedsl.ops.path_scan` has the scan, :mod:`pedsl.ops.path_blocks` the per-block
  quantities above (both custom autograd functions with hand-written backwards).

Cost O(L^2 D + L^2 D^2 / (k C) + L C D + L D^2) time. Per pair of C-blocks in different
superblocks: 2 C^2 D + C D^2 / k forward and 5 C^2 D + 3 C D^2 / k backward (flash attention:
2 + 5 C^2 D), so at C = D = 64, k = 4 about 8/7 of attention's products; pairs inside one
superblock cost 2 + 1 and 5 + 3. The per-block preprocessing is about 32 C^2 D per block
(forward and backward). No (L, L, D) or (L, D, D) tensor is formed: the backward recomputes
the probabilities and each query block's chain of moved queries (flash-style) and keeps
O(L D + L C + L D^2 / C) per head, no L^2 term. Keeping the forward's moved queries instead
would drop one product per pair but costs L^2 D / 2C numbers per head. Measured at L = 2048,
B H = 32, C = D = 64, 1 thread (benchmarks/README.md): one level (k = 1) 2.4-2.7x of causal
SDPA forward + backward, superblocks of 4 and the hand-written block backward 1.7-1.9x;
k = 8 measured as k = 4, k = 2 slower. Double backward is not supported. Half-precision
inputs run the scan in float32.

The forget-gate bias uses per-block offsets: a local cumulative sum inside each block (input
dtype) plus float64 block offsets, so G_i - G_j never cancels two large float32 numbers. log_forget
is clamped below at -1e4 (exp of that is 0 in every float format), so a hard reset (-inf, f = 0)
masks everything before it instead of producing NaN. On CPUs, sharply peaked attention makes
denormals; callers own ``torch.set_flush_denormal(True)`` (docs/semantics.md §6).

Baselines for tests and benchmarks: :func:`path_attention_naive` (float64 loops over explicit
products, O(L^2 D^2)) and :func:`path_attention_materialized` (all L x L transported keys,
O(L^2 D) memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pedsl.errors import ShapeError
from pedsl.ops.path_blocks import ut_A
from pedsl.ops.path_kernels import path_transported_keys, scaled_q

__all__ = [
    "path_attention",
    "path_attention_local",
    "path_attention_naive",
    "path_attention_materialized",
    "householder_product",
    "path_transported_keys",
    "ut_block_product",
]


# --------------------------------------------------------------------------- checks and helpers
def _check(q, k, v, w, beta, log_forget, q_scale) -> None:
    if q.dim() != 4:
        raise ShapeError(f"path_attention: q must be (B, H, L, D), got shape {tuple(q.shape)}; "
                         "reshape the projections to (batch, heads, length, head_dim).")
    for name, t in (("k", k), ("v", v), ("w", w)):
        if tuple(t.shape) != tuple(q.shape):
            raise ShapeError(f"path_attention: {name} has shape {tuple(t.shape)} but q has "
                             f"{tuple(q.shape)}; q, k, v and w must all be (B, H, L, D).")
    for name, t in (("beta", beta), ("log_forget", log_forget)):
        if t is not None and tuple(t.shape) != tuple(q.shape[:3]):
            raise ShapeError(f"path_attention: {name} has shape {tuple(t.shape)}; it must be "
                             f"(B, H, L) = {tuple(q.shape[:3])}, one value per head and position.")
    if q_scale is not None:
        B, H, L, _ = q.shape
        ok = q_scale.dim() == 3 and q_scale.shape[0] in (1, B) and q_scale.shape[1] in (1, H) \
            and q_scale.shape[2] == L
        if not ok:
            raise ShapeError(f"path_attention: q_scale has shape {tuple(q_scale.shape)}; it must "
                             f"be (B|1, H|1, L) with L = {L}, a per-query temperature.")


def ut_block_product(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """H_n ... H_1 = I - W^T A W via the UT representation; w (..., n, D) -> (..., D, D)."""
    A = ut_A(w, beta)
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return eye - w.transpose(-1, -2) @ A @ w


def householder_product(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Explicit H_n ... H_1 (step 1 = row 0 applied first); w (..., n, D) -> (..., D, D)."""
    D = w.shape[-1]
    P = torch.eye(D, dtype=w.dtype, device=w.device).expand(*w.shape[:-2], D, D)
    for t in range(w.shape[-2]):
        wt = w[..., t, :]
        Hm = torch.eye(D, dtype=w.dtype, device=w.device) \
            - beta[..., t, None, None] * wt.unsqueeze(-1) * wt.unsqueeze(-2)
        P = Hm @ P
    return P


# --------------------------------------------------------------------------- public API
def path_attention(q, k, v, w, beta, log_forget=None, scale=None, *, block_size=64, q_scale=None,
                   superblock=4):
    """PaTH attention (causal), blockwise UT/WY algorithm; returns (B, H, L, D) in q's dtype.

    ``block_size`` C steps per block, ``superblock`` blocks per superblock of the scan (1: one
    level); both change the cost, not the result (up to rounding).
    """
    _check(q, k, v, w, beta, log_forget, q_scale)
    from pedsl.ops.path_kernel import path_forward_rows  # the C++ row loops where they build (lazy: no cycle)

    return path_forward_rows(q, k, v, w, beta, log_forget, scale, block_size=block_size, q_scale=q_scale,
                             superblock=superblock)


# --------------------------------------------------------------------------- windows and chunks
def path_attention_local(q, k, v, w, beta, log_forget=None, scale=None, *, reach: int, allowed=None,
                         sink=None, block_size=64):
    """PaTH attention where query i sees at most the keys ``i - reach .. i`` (sliding windows, chunks):
    O(L (reach + C) D) time and O(L D) memory per head beyond one group of query blocks; (B, H, L, D) in
    q's dtype.

    Key j is scored for query i iff ``i - reach <= j <= i`` and ``allowed(i, j)``: a callable of token
    indices ``i (n, C, 1)`` and ``j (n, 1, m)`` (inside 0..L-1) returning a bool tensor ``(B|1, n, C, m)``
    (the window or chunk by positions, documents, padding), or None for all of them. ``log_forget``: the
    per-step log gates, summed in float64 (``G_i - G_j`` added after the scale). ``sink``: ``(logit
    (B|1, H, L), value (1, H, 1, D) or None)``, one more key every query sees with that logit and value
    (zero when None). A query with no key gives zeros.

    The per-block quantities are :func:`path_attention`'s (:func:`path_blocks`: queries moved to the
    start of their block, keys to the end of theirs, the exact intra-block scores, each block's product
    ``P``); query block n then scores key blocks n, n - 1, ..., n - d (``d = ceil(reach / C)``) through
    ``R <- R P_m``: only the steps between a key and a query, which all lie inside the window
    (:mod:`pedsl.ops.path_window`: groups of query blocks, softmax over each block's (C, (d + 1) C)
    scores, a hand-written backward that recomputes each group's scores)."""
    _check(q, k, v, w, beta, log_forget, None)
    from pedsl.ops.path_kernel import path_local_forward_rows  # the C++ inverse where it builds (lazy: no cycle)

    return path_local_forward_rows(q, k, v, w, beta, log_forget, scale, reach=reach, allowed=allowed, sink=sink,
                                   block_size=block_size)


def path_attention_naive(q, k, v, w, beta, log_forget=None, scale=None, *, block_size=64,
                         q_scale=None):
    """Reference: explicit products H_i ... H_(j+1) in float64, loops over i and j, O(L^2 D^2).

    ``block_size`` is accepted for signature compatibility and ignored.
    """
    _check(q, k, v, w, beta, log_forget, q_scale)
    dt = q.dtype
    q, k, v, w, beta = (t.to(torch.float64) for t in (q, k, v, w, beta))
    qs = scaled_q(q, scale, None if q_scale is None else q_scale.to(torch.float64))
    B, H, L, D = q.shape
    G = None if log_forget is None else log_forget.to(torch.float64).cumsum(-1)
    eye = torch.eye(D, dtype=torch.float64, device=q.device)
    outs = []
    for i in range(L):
        P = eye.expand(B, H, D, D)  # P(j -> i), starting at j = i
        scores = []
        for j in range(i, -1, -1):
            if j < i:  # P(j -> i) = P(j+1 -> i) H_(j+1)
                wt = w[:, :, j + 1]
                P = P - beta[:, :, j + 1, None, None] * (P @ wt.unsqueeze(-1)) * wt.unsqueeze(-2)
            s = (qs[:, :, i].unsqueeze(-2) @ P @ k[:, :, j].unsqueeze(-1))[..., 0, 0]
            if G is not None:
                s = s + G[:, :, i] - G[:, :, j]
            scores.append(s)
        a = torch.softmax(torch.stack(scores[::-1], -1), -1)  # (B, H, i + 1)
        outs.append(a.unsqueeze(-2) @ v[:, :, : i + 1])
    return torch.cat(outs, -2).to(dt)


def path_attention_materialized(q, k, v, w, beta, log_forget=None, scale=None, *, block_size=64,
                                q_scale=None):
    """Hand-written baseline: every transported key P(j->i) k_j, a (B, H, L, L, D) tensor.

    ``block_size`` is ignored. Time O(L^2 D), memory O(L^2 D) per head (that is the point).
    """
    _check(q, k, v, w, beta, log_forget, q_scale)
    B, H, L, D = q.shape
    qs = scaled_q(q, scale, q_scale)
    rows, cur = [], k[:, :, :0]
    for i in range(L):  # row i: keys j <= i carried through H_i
        if i > 0:
            wt = w[:, :, i]
            cur = cur - beta[:, :, i, None, None] * (cur @ wt.unsqueeze(-1)) * wt.unsqueeze(-2)
        cur = torch.cat([cur, k[:, :, i : i + 1]], -2)
        rows.append(F.pad(cur, (0, 0, 0, L - i - 1)))
    KT = torch.stack(rows, 2)  # (B, H, L, L, D): KT[i, j] = P(j->i) k_j
    s = (KT @ qs.unsqueeze(-1)).squeeze(-1)  # (B, H, L, L)
    if log_forget is not None:
        G = log_forget.to(torch.float64).cumsum(-1)
        s = s + (G.unsqueeze(-1) - G.unsqueeze(-2)).to(s.dtype)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


