"""The usual hand-written code a user would write without pedsl (the benchmark's baselines).

Shapes: q, k, v ``(B, H, L, D)``. Each baseline is plain eager PyTorch, as found in
Hugging Face ``transformers`` or the papers' reference code:

- ``hf_rotary``: ``q * cos + rotate_half(q) * sin`` with full-width ``(L, D)`` cos/sin tables
  (HF ``apply_rotary_pos_emb``; identity entries on channels a partial scheme leaves alone;
  ``rotate_every_two`` for the interleaved layout, as GPT-J), then SDPA.
- ``bias_attention``: a float ``(B|1, H, L, L)`` additive bias with the causal ``-inf`` mask
  passed to SDPA as ``attn_mask`` (HF's ALiBi models; FoX's reference without its kernel).
- ``scan_rotations`` / ``apply_blocks``: accumulated SO(2) transports as explicit per-position
  rotation matrices: the 2 x 2 block matrices ``M_t`` of every pair, their running products
  ``A_t = M_t ... M_1`` by a log-depth (Hillis-Steele) scan of batched matmuls, and an einsum
  applying ``A_t`` to q and k (and v / the output). Blocks are stored as ``(..., L, P, 2, 2)``,
  not as dense ``(L, D, D)`` matrices, to keep memory sane (the dense form is D/2 = 32 times
  larger and slower); this is generous to the baseline.
- PaTH: :func:`pedsl.ops.path.path_attention_naive` (per-block float64 reference) and
  :func:`pedsl.ops.path.path_attention_materialized` (all transported keys).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: Tensor) -> Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def hf_tables(cos: Tensor, sin: Tensor, D: int, pair_index: Sequence | None, layout: str) -> tuple[Tensor, Tensor]:
    """Full-width ``(L, D)`` HF tables from ``(L, P)`` ones; identity on pairs not in ``pair_index``."""
    L = cos.shape[0]
    if pair_index is not None:
        idx = torch.as_tensor(list(pair_index))
        cos = torch.ones(L, D // 2, dtype=cos.dtype).index_copy(-1, idx, cos)
        sin = torch.zeros(L, D // 2, dtype=sin.dtype).index_copy(-1, idx, sin)
    if layout == "halves":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def hf_rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "halves") -> Tensor:
    rot = rotate_half if layout == "halves" else rotate_every_two
    return x * cos + rot(x) * sin


def causal_bias_mask(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """``bias (B|1, H, L, L)`` plus ``-inf`` above the diagonal, in ``dtype``."""
    L = bias.shape[-1]
    causal = torch.ones(L, L, dtype=torch.bool, device=bias.device).tril()
    return bias.to(dtype).masked_fill(~causal, float("-inf"))


def bias_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_bias_mask(bias, q.dtype))


def forget_bias(log_f: Tensor) -> Tensor:
    """FoX bias ``G_i - G_j`` as ``(B, H, L, L)`` from ``log_f (B, H, L)`` (float32, as its reference code)."""
    G = torch.cumsum(log_f, dim=-1)
    return G.unsqueeze(-1) - G.unsqueeze(-2)


def rotation_blocks(angles: Tensor) -> Tensor:
    """``(..., L, P)`` step angles -> 2 x 2 rotation matrices ``(..., L, P, 2, 2)``."""
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)


def scan_rotations(M: Tensor) -> Tensor:
    """Inclusive running products ``A_t = M_t ... M_1`` along the position axis (-4), log-depth scan."""
    L = M.shape[-4]
    A = M
    step = 1
    while step < L:
        head, tail = A[..., :step, :, :, :], A[..., step:, :, :, :]
        A = torch.cat((head, tail @ A[..., : L - step, :, :, :]), dim=-4)
        step *= 2
    return A


def apply_blocks(x: Tensor, A: Tensor, layout: str = "halves", transpose: bool = False) -> Tensor:
    """Apply per-position block matrices ``A (B|1, H|1, L, P, 2, 2)`` to the pairs of ``x (B, H, L, D)``."""
    P = A.shape[-3]
    if layout == "halves":
        xp = torch.stack((x[..., :P], x[..., P:]), -1)  # (B, H, L, P, 2)
    else:
        xp = x.unflatten(-1, (P, 2))
    eq = "...pji,...pj->...pi" if transpose else "...pij,...pj->...pi"
    y = torch.einsum(eq, A, xp)
    if layout == "halves":
        return torch.cat((y[..., 0], y[..., 1]), -1)
    return y.flatten(-2)
