"""Remapped positions on the general path: a rotation whose positions depend on the pair's distance regime.

A scheme with ``remap { ... }`` (docs/semantics.md §2d: ReRoPE, Leaky ReRoPE, Self-Extend, Dual Chunk
Attention) rotates, for the pair (i, j) in regime r, the query at ``query_r(p_i)`` and the key at
``key_r(p_j)``. Within a regime that is an ordinary rotated score, so a block of queries costs one rotated
score block per regime and a select by the distance ``p_i - p_j`` (or, with ``remap(chunk = c)``, the chunk
difference): memory O(rows x keys) per block, never (B, H, L, L). No fused kernel declares
the feature (:mod:`pedsl.compiler.kernel_support`), so every call comes here, through the general
forward's blocks of queries. The cache keeps the keys unrotated (the general forward transports nothing
for such a scheme), so every cached key is rotated again per regime at each call: prefill plus decoding
equals one full forward.

What the scheme supplies (``ModuleScheme`` in :mod:`pedsl.compiler.module_values`): ``remap_bounds`` (each
regime's ``(low, high)``, high None: no end) and ``remap_rotate(x, positions, regime, role, n)`` (x rotated
at the regime's ``query`` or ``key`` positions of the tokens at ``positions``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint
from torch import Tensor

from pedsl.compiler.scores import modified_scores, normalised

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.protocols import SchemeSide

# <embedded>
# ---------------------------------------------------------------------------------------------
# Remapped positions (pedsl.compiler.general.remap, copied verbatim): one rotated score block per regime
# of the distance, selected pair by pair.
# ---------------------------------------------------------------------------------------------


def regime_measure(qpos: Tensor, kpos: Tensor, chunk: int | None) -> Tensor:
    """What a regime's bounds read for the pairs (qpos, kpos): the distance p_i - p_j, or with chunk = c the chunk
    difference floor(p_i / c) - floor(p_j / c) (Dual Chunk Attention)."""
    if chunk is None:
        return qpos - kpos
    return torch.div(qpos, chunk, rounding_mode="floor") - torch.div(kpos, chunk, rounding_mode="floor")


class RemappedKeys:
    """Every key of a call (the cache's and this call's, unrotated) rotated at each regime's key positions,
    and the attention of a block of queries over a span of them."""

    def __init__(self, scheme: SchemeSide, K: Tensor, kpos: Tensor, n: int):
        rotate = scheme.remap_rotate
        if rotate is None:
            raise ValueError("a scheme with remapped positions rotates them (remap_rotate)")
        self.scheme, self.rotate, self.kpos, self.n = scheme, rotate, kpos, n
        self.keys = [rotate(K, kpos, r, "key", n) for r in range(len(scheme.remap_bounds))]

    def rows(self, q: Tensor, qpos: Tensor, k0: int, k1: int, V: Tensor, ok, bias, sink, cap) -> Tensor:
        """Attention of the queries ``q (B, Hq, rows, D)`` at ``qpos (B, rows)`` (temperature applied, not
        rotated) over the keys k0..k1 that ``ok`` allows, through the one score pipeline; with gradients
        the block is recomputed in the backward pass."""
        qs = [self.rotate(q, qpos, r, "query", self.n) for r in range(len(self.scheme.remap_bounds))]
        ks = [k[:, :, k0:k1] for k in self.keys]
        dist = regime_measure(qpos[:, :, None], self.kpos[:, None, k0:k1], self.scheme.remap_chunk)  # (B, rows, Lk)
        col, vs = (None, None) if sink is None else sink
        args = (dist, ok, bias, col, vs, cap, V, *qs, *ks)
        if torch.is_grad_enabled() and any(t.requires_grad for t in args if isinstance(t, Tensor)):
            return torch.utils.checkpoint.checkpoint(self._block, *args, use_reentrant=False).to(q.dtype)
        return self._block(*args).to(q.dtype)

    def _block(self, dist, ok, bias, col, vs, cap, V, *rotated) -> Tensor:
        half = len(rotated) // 2
        qs, ks = rotated[:half], rotated[half:]
        Hq, D = qs[0].shape[1], qs[0].shape[3]
        dt = torch.promote_types(qs[0].dtype, torch.float32)
        s = None
        for (low, high), qr, kr in zip(self.scheme.remap_bounds, qs, ks):
            if kr.shape[1] != Hq:  # GQA: query head h reads key head h // (Hq / Hkv)
                kr = kr.repeat_interleave(Hq // kr.shape[1], dim=1)
            sr = qr.to(dt) @ kr.to(dt).transpose(-1, -2)
            inside = dist >= low if high is None else (dist >= low) & (dist < high)
            s = sr if s is None else torch.where(inside[:, None], sr, s)
        if s is None:
            raise ValueError("a remapped rotation has at least one regime")
        s = modified_scores(s, scale=D ** -0.5, bias=None if bias is None else bias.to(dt), cap=cap)
        w, ws = normalised(s, ok, sink=col)
        if V.shape[1] != Hq:
            V = V.repeat_interleave(Hq // V.shape[1], dim=1)
        o = w.to(V.dtype) @ V
        return o if vs is None or ws is None else o + ws.to(V.dtype) * vs.to(V.dtype)
# </embedded>
