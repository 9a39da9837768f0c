"""The expression kernels of the modules `pedsl compile` writes (torch only): what the generated
``token_values`` code calls to build constants, frozen tables, learned maps and short convolutions.

Kept as a real module so it is linted and importable; codegen copies the text after the ``# ----``
banner verbatim, next to the general forward (:mod:`pedsl.compiler.general`, which defines ``F64``).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from pedsl.compiler.general import F64

# <embedded>
# ---------------------------------------------------------------------------------------------
# Kernels. Every value below is a tensor laid out as (batch, head, position, distance, pair|chan),
# with size-1 dimensions where it does not vary, so arithmetic broadcasts by axis.
# ---------------------------------------------------------------------------------------------


def _axis(values, axis, device):
    """A constant vector as a 5-d tensor along 'pair' (last) or 'head' (second)."""
    t = torch.as_tensor(values, dtype=F64, device=device)
    return t.view(1, 1, 1, 1, -1) if axis == "pair" else t.view(1, -1, 1, 1, 1)


def _distances(L, device):
    return torch.arange(L, dtype=F64, device=device).view(1, 1, 1, L, 1)


def _t(v, device=None):
    return v if torch.is_tensor(v) else torch.tensor(float(v), dtype=F64, device=device)


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


class _LearnedValue(nn.Module):
    """A learned(init) value: ``value`` over its axes (heads, pairs; None where it does not vary), starting
    at init (a number or a 5-d tensor), read as a float64 5-d tensor."""

    def __init__(self, init, heads, pairs):
        super().__init__()
        self.view5 = (1, heads or 1, 1, 1, pairs or 1)
        start = _t(init).to(F64).expand(self.view5).reshape([s for s in (heads, pairs) if s is not None])
        self.value = nn.Parameter(start.to(torch.get_default_dtype()))

    def at5(self):
        return self.value.to(F64).view(self.view5)


def _t5_bucket(d, buckets, max_distance, bidirectional):
    """T5's bucket of distances d = i - j (Hugging Face's _relative_position_bucket at j - i), float64: a key after
    its query (d < 0, a signed per-axis distance) in the upper half when bidirectional, in bucket 0 otherwise."""
    n = buckets // 2 if bidirectional else buckets
    later = (d < 0).to(d.dtype) * n if bidirectional else torch.zeros_like(d)
    d = d.abs() if bidirectional else d.clamp(min=0)
    exact = n // 2
    far = exact + torch.floor(torch.log(d.clamp(min=exact) / exact) / math.log(max_distance / exact) * (n - exact))
    return torch.where(d < exact, d, far.clamp(max=n - 1)) + later


def _sinusoid_dot(d, dim, base):
    """sum_{k=1..dim/2} cos(d base^(-2k/dim)) (Sandwich), float64."""
    return sum(torch.cos(d * base ** (-2 * k / dim)) for k in range(1, dim // 2 + 1))


def _table_at(emb, index, rows):
    """A learned (rows, HEADS) table read at a 5-d integer-valued index (1, 1, 1, L, 1): (1, HEADS, 1, L, 1)."""
    return emb.weight.to(F64)[index.clamp(0, rows - 1).long()[0, 0, 0, :, 0]].t().reshape(1, -1, 1, index.shape[3], 1)


def _mlp_module(hidden, depth, heads, relu=False):
    act = nn.ReLU if relu else nn.SiLU
    layers = [nn.Linear(1, hidden), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), act()]
    return nn.Sequential(*layers, nn.Linear(hidden, heads))


def _mlp_at(net, features):
    """The MLP of a 5-d feature (B|1, 1, rows|1, L, 1) per distance (and query): (B|1, HEADS, rows|1, L, 1), float64."""
    f = _t(features)
    out = net(f.to(net[0].weight.dtype))  # (B|1, 1, rows|1, L, HEADS)
    return out.to(F64).permute(0, 4, 2, 3, 1)


def _frozen_at(seed, pairs, pos):
    """The position table read at the positions pos (B, 1, L, 1, 1): (B, 1, L, 1, P)."""
    p = pos[:, 0, :, 0, 0].long().clamp(min=0)
    table = _frozen_position_table(seed, pairs, int(p.max()) + 1 if p.numel() else 1).to(pos.device)
    return table[p].view(p.shape[0], 1, p.shape[1], 1, pairs)


def _shortconv(conv, v, seg):
    """Causal depthwise convolution over positions of v (B, H, L, 1, W), as a sum of shifted taps; a tap
    reads zeros across a document boundary or at padding (seg = (docs, valid), each (B, L))."""
    docs, valid = seg
    B, H, L, _, W = v.shape
    flat = v[:, :, :, 0, :].permute(0, 1, 3, 2).reshape(v.shape[0], H * W, L).to(conv.weight.dtype)
    flat = flat.expand(docs.shape[0], -1, -1)
    K = conv.weight.shape[-1]
    out: torch.Tensor | int = 0
    for s in range(min(K, L)):
        keep = F.pad(valid, (s, 0))[:, :L].clone()
        if s:
            keep[:, s:] &= docs[:, s:] == docs[:, :-s]
        out = out + F.pad(flat, (s, 0))[..., :L] * keep[:, None, :].to(flat.dtype) * conv.weight[:, 0, K - 1 - s, None]
    assert isinstance(out, torch.Tensor)  # a kernel has a tap and a sequence a position: the loop ran
    return out.reshape(-1, H, W, L).permute(0, 1, 3, 2).unsqueeze(3)


def _geometric(base, pairs, device):
    """The geometric grid base^(-2k / (2 pairs)) as a 5-d tensor along 'pair'."""
    k = torch.arange(pairs, dtype=F64, device=device)
    return (base ** (-2.0 * k / (2 * pairs))).view(1, 1, 1, 1, pairs)
# </embedded>
