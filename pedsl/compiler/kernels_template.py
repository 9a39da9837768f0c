"""Kernels copied verbatim into every module that `pedsl compile` writes (torch only).

Kept as a real module so it is linted and importable; codegen copies the text
after the ``# ----`` banner.
"""

import math

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Kernels. Every value below is a tensor laid out as (batch, head, position, distance, pair|chan),
# with size-1 dimensions where it does not vary, so arithmetic broadcasts by axis.
# ---------------------------------------------------------------------------------------------
F64 = torch.float64
TWO_PI = 2.0 * math.pi


def _axis(values, axis, device):
    """A constant vector as a 5-d tensor along 'pair' (last) or 'head' (second)."""
    t = torch.as_tensor(values, dtype=F64, device=device)
    return t.view(1, 1, 1, 1, -1) if axis == "pair" else t.view(1, -1, 1, 1, 1)


def _positions(L, device):
    return torch.arange(L, dtype=F64, device=device).view(1, 1, L, 1, 1)


def _distances(L, device):
    return torch.arange(L, dtype=F64, device=device).view(1, 1, 1, L, 1)


def _t(v, device=None):
    return v if torch.is_tensor(v) else torch.tensor(float(v), dtype=F64, device=device)


def _log_length(L, length, device):
    """tau(i) = max(1, ln(i + 1) / ln(length)): Qwen's logn attention, per query position."""
    i = torch.arange(L, dtype=F64, device=device)
    return torch.clamp(torch.log(i + 1) / math.log(length), min=1.0).view(1, 1, L, 1, 1)


def _frozen_token_table(seed, vocab_size, pairs):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, pairs, generator=g, dtype=F64)


def _frozen_position_table(seed, pairs, L, chunk=1024):
    """Standard normal values per (position, pair), generated in chunks so every prefix is stable."""
    parts = []
    for c in range(0, max(L, 1), chunk):
        g = torch.Generator().manual_seed(seed * 1_000_003 + c // chunk)
        parts.append(torch.randn(chunk, pairs, generator=g, dtype=F64))
    return torch.cat(parts)[:L]


def _per_head_site(module, inp, B, L, heads, width):
    """A learned map of x or of the tokens, one value per head (and pair or channel): (B, H, L, 1, W)."""
    out = module(inp)  # (B, L, H * W)
    return out.view(B, L, heads, width).permute(0, 2, 1, 3).unsqueeze(3)


def _shortconv(conv, v):
    """Causal depthwise convolution over positions of v (B, H, L, 1, W)."""
    B, H, L, _, W = v.shape
    flat = v[:, :, :, 0, :].permute(0, 1, 3, 2).reshape(B, H * W, L).to(conv.weight.dtype)
    out = conv(flat)[..., :L].reshape(B, H, W, L).permute(0, 1, 3, 2)
    return out.unsqueeze(3)


def _rotate(x, cos, sin, first, second):
    """Rotate channel pairs (first[k], second[k]) of x (B, H, L, D) by the angles behind cos/sin (..., L, P)."""
    xa, xb = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = xa * cos - xb * sin
    out[..., second] = xb * cos + xa * sin
    return out


def _cumulative_angles(steps):
    """A(t) = sum_{s <= t} a(s) in float64, reduced mod 2 pi."""
    return torch.remainder(torch.cumsum(steps.to(F64), dim=-2), TWO_PI)


def _attention(q, k, v, key_term, q_scale):
    """Causal attention with logits tau_i <q_i, k_j> / sqrt(D) + g(j), with g in one extra channel.

    Under the causal mask a bias f(i) + g(j) changes the softmax only through g(j): append
    q' = [q, 1], k' = [k, g * sqrt(D)], v' = [v, 0] and keep the scale 1 / sqrt(D).
    """
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    if q_scale is not None:
        q = q * q_scale.to(q.dtype).unsqueeze(-1)
    if key_term is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    B, H, L, _ = q.shape
    one = q.new_ones(B, H, L, 1)
    g = (key_term / scale).to(k.dtype).unsqueeze(-1).expand(B, H, L, 1)
    qp, kp, vp = torch.cat([q, one], -1), torch.cat([k, g], -1), torch.cat([v, torch.zeros_like(one)], -1)
    return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)[..., :D]


def _softmax_attention(scores, v, bias, q_scale):
    """softmax(tau_i * scores / sqrt(D) + bias) v under the causal mask; scores (B, H, L, L)."""
    D, L = v.shape[-1], v.shape[-2]
    s = scores / math.sqrt(D)
    if q_scale is not None:
        s = s * q_scale.to(s.dtype).unsqueeze(-1)
    if bias is not None:
        s = s + bias.to(s.dtype)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1).to(v.dtype) @ v


def _householder_scores(q, k, w, beta):
    """<q_i, H_i ... H_{j+1} k_j> for every j <= i, with H_t = I - beta_t w_t w_t^T.

    Moves every query leftwards through the steps, one key position at a time
    ((H_i ... H_{j+1})^T q = H_{j+1} ... H_i q since each H is symmetric): O(L^2 D).
    """
    L = q.shape[2]
    cur = q
    cols = [None] * L
    for j in range(L - 1, -1, -1):
        cols[j] = (cur * k[:, :, j : j + 1]).sum(-1)
        if j > 0:
            wj, bj = w[:, :, j], beta[:, :, j]
            proj = (cur[:, :, j:] * wj[:, :, None]).sum(-1, keepdim=True)
            cur = torch.cat([cur[:, :, :j], cur[:, :, j:] - bj[:, :, None, None] * proj * wj[:, :, None]], dim=2)
    return torch.stack(cols, dim=-1)


def _dynamic_ntk(base, factor, original, pairs, L, device):
    """Dynamic NTK (HF 'dynamic'): past the original length the base grows with the run-time length n = L."""
    if L > original and pairs > 1:
        s = factor * L / original - (factor - 1)
        base = base * s ** (2 * pairs / (2 * pairs - 2))
    k = torch.arange(pairs, dtype=F64, device=device)
    return (base ** (-2.0 * k / (2 * pairs))).view(1, 1, 1, 1, pairs)
