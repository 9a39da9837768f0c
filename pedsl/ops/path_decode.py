"""PaTH's one-query decode scores over its cache on torch's fused CPU attention, for the lazy decode rule of the
general forward (``path_decode_inplace``: the keys cached before the last flush are stored moved to the flush
point, the steps since then wait as one D x D product ``P`` per head, the keys cached since are moved eagerly).

A query scores the old keys through ``P^T q`` and the recent ones directly: two attentions with one softmax. Each
runs on torch's fused flash kernel with its log-sum-exp (one pass over K and V, as SDPA decode), and the two are
merged by their log-sum-exps. The unfused way (``K (P^T q)`` as a batched matrix-vector product, then softmax, then
``p V``) read the cache at a third of the bandwidth: a (heads, N, D) x (heads, D, 1) product runs at ~3 GB/s on
the CPUs measured, the fused kernel at ~15 GB/s.

:func:`fused_path_scores` takes the plain case (no per-key bias, no mask, no sink, CPU float32 / float64); it
answers None elsewhere and the caller keeps its general scoring. The general forward's ``_path_score_one`` tries it
first (its ``PATH_FLUSH`` is ``FUSED_FLUSH``).
"""

from __future__ import annotations

import torch
from torch import Tensor

# <embedded>
# ---------------------------------------------------------------------------------------------
# PaTH's fused decode scoring (torch only: a generated module can carry it after the general forward).
# ---------------------------------------------------------------------------------------------
#: Flush interval the fused scoring is measured with: the flush (``K <- K P^T``, a D x D product per cached key) is
#: the one cost per token that grows with the cache besides the attention itself, ~1 / PATH_FLUSH of the cache's
#: D x D products per token; the eager moves of the recent keys cost 4 D per recent key and token.
FUSED_FLUSH = 128

_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def fused_path_scores(K: Tensor, V: Tensor, q: Tensor, P: Tensor | None, nf: int, *, mask=None, bias=None,
                      sink=None) -> Tensor | None:
    """Attention of one query per head over ``n`` cached keys, the first ``nf`` of them scored through ``P^T q``.

    K, V (B, H, n, D) (views of the cache, moved keys), q (B, H, D), P (B H, D, D) or None (no old keys); the
    scale is 1 / sqrt(D). Returns (B, H, 1, D), or None where it does not apply (a mask, a bias, a sink, no fused
    kernel, another device or dtype)."""
    if mask is not None or bias is not None or sink is not None or _flash is None or q.device.type != "cpu" \
            or q.dtype not in (torch.float32, torch.float64):
        return None
    B, H, n, D = K.shape
    scale = D ** -0.5
    q1 = q.unsqueeze(2)  # (B, H, 1, D)
    if not nf or P is None:
        return _flash(q1, K, V, scale=scale)[0]
    q_old = torch.bmm(P.transpose(1, 2), q.reshape(B * H, D, 1)).view(B, H, 1, D)
    o_old, l_old = _flash(q_old, K[:, :, :nf], V[:, :, :nf], scale=scale)
    if nf == n:
        return o_old
    o_new, l_new = _flash(q1, K[:, :, nf:], V[:, :, nf:], scale=scale)
    top = torch.maximum(l_old, l_new)
    w_old, w_new = (l_old - top).exp_(), (l_new - top).exp_()  # (B, H, 1)
    tot = w_old + w_new
    return (o_old * (w_old / tot).unsqueeze(-1)).add_(o_new * (w_new / tot).unsqueeze(-1))
# </embedded>
