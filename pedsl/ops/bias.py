"""Causal attention with additive logit biases, without an (H, L, L) tensor.

Separable biases (docs/semantics.md §5.7): under the causal mask a bias
``b(i, j) = f(i) + g(j)`` changes the softmax of row ``i`` only through the key
term ``g(j)`` (``f(i)`` is a per-row constant). ALiBi (Press et al.) is
``-m_h i + m_h j`` so ``g(j) = m_h j``; a forget gate (FoX, Lin et al. 2025;
PaTH-FoX) is ``b(i, j) = sum_{s=j+1..i} log f_s = G_i - G_j`` with
``G_t = sum_{s<=t} log f_s``, so ``g(j) = -G_j``. We append one channel::

    q' = [q * tau, 1],   k' = [k, g / scale],   v' = [v, 0]        (all (B, H, L, D+1))

and call the causal fused kernel with the *original* ``scale`` (1/sqrt(D)):
``scale <q', k'> = scale tau <q, k> + g(j)``. q, k and v keep one head
dimension so SDPA stays on its fused (flash) path, forward and backward; the
extra output channel is dropped.

Precision: ``g(j)`` grows with ``j`` (ALiBi: ``m_h j``, up to ``0.5 * L`` for the
first of 8 heads; forget gate: ``-G_j``, a sum of ``j`` negative logs). Stored in
float32 it carries an absolute error of about ``6e-8 |g(j)|`` in the logit
(~6e-5 at L = 2048, ~2e-3 at L = 65,536). ``chunk_size`` runs the queries in
chunks and subtracts a per-chunk offset ``g(mid)`` (in the key term's own dtype,
so pass a float64 key term) before the cast: the keys that matter keep small
logits (error ~ 6e-8 * m * chunk_size / 2 instead of 6e-8 * m * L). Chunks
use an explicit bottom-right boolean causal mask (SDPA's ``is_causal`` with
``Lq != Lk`` is top-left aligned).

CPU fast path: when the key term needs no gradient (ALiBi, a frozen gate) the
channel is replaced by a ``(B|1, H|1, 1, L)`` float mask broadcast (stride 0)
over the queries and passed *with* ``is_causal`` to the CPU flash kernel: head
dim stays D (about +4% over plain causal SDPA instead of ~+15% for D+1).

Temperature per query (docs/semantics.md §5.4) is ``q_scale (B|1, H|1, L)`` multiplying
the rows of q before the kernel.

Denormals (docs/semantics.md §6): sharply peaked attention (any distance bias) fills the
softmax with denormal floats that slow CPU kernels several-fold. The fix,
``torch.set_flush_denormal(True)``, is process-wide, so this library never
calls it: applications (train, eval, bench) own that choice.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pedsl.errors import CompileError


def scale_queries(q: Tensor, q_scale: Tensor | None) -> Tensor:
    """q times the per-query temperature ``q_scale (B|1, H|1, L)``; half-precision q is multiplied in
    float32 and rounded once (rounding tau first doubled the error of a temperature scheme in float16)."""
    if q_scale is None:
        return q
    dt = torch.promote_types(q.dtype, torch.float32)
    return (q.to(dt) * q_scale.to(dt).unsqueeze(-1)).to(q.dtype)  # (B|1, H|1, L, 1)


def _append(x: Tensor, col: Tensor | float) -> Tensor:
    """``x (B, H, L, D)`` with one more channel (a scalar or a ``(B|1, H|1, L)`` column)."""
    B, H, L, _ = x.shape
    if isinstance(col, Tensor):
        c = col.unsqueeze(-1).expand(B, H, L, 1)
    else:
        c = x.new_full((), col).expand(B, H, L, 1)
    return torch.cat([x, c], dim=-1)


def separable_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_term: Tensor | None = None,
    *,
    scale: float | None = None,
    q_scale: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Causal attention with logits ``scale * tau_i <q_i, k_j> + g(j)``; returns ``(B, H, L, D)``.

    ``key_term``: ``g`` as ``(B|1, H|1, L)`` (None: no bias). ``chunk_size``: process
    queries in chunks with a per-chunk offset (long contexts; see module docstring).
    On CPU, a key term that needs no gradient uses a broadcast row mask instead of
    the extra channel (see ``_cpu_row_mask``). With the channel, the output is a
    view of a ``(B, H, L, D+1)`` tensor.
    """
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q = scale_queries(q, q_scale)
    if key_term is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    while key_term.dim() < 3:  # (L,) or (H, L) -> (1, H|1, L)
        key_term = key_term.unsqueeze(0)
    L = k.shape[-2]
    if chunk_size is not None and chunk_size < L:
        return _chunked(q, k, v, key_term, scale, int(chunk_size))
    if q.device.type == "cpu" and not (torch.is_grad_enabled() and key_term.requires_grad):
        out = _cpu_row_mask(q, k, v, key_term, scale)
        if out is not None:
            return out
    qp = _append(q, 1.0)
    kp = _append(k, (key_term / scale).to(k.dtype))
    vp = _append(v, 0.0)
    return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)[..., :D]


def _cpu_row_mask(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float) -> Tensor | None:
    """CPU fast path for a key term that needs no gradient (ALiBi, frozen gates).

    PyTorch's CPU flash kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``)
    accepts ``is_causal`` together with a float mask; a ``(B|1, H|1, 1, L)`` row
    expanded with stride 0 over the queries costs no memory and keeps head dim D
    (about 4% over plain causal SDPA, against ~15% for the D+1 channel). The
    public ``F.scaled_dot_product_attention`` refuses mask + is_causal, hence the
    aten op; its backward gives no gradient to the mask, so a key term that
    requires grad takes the channel path. Returns None if the op is unavailable.
    """
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or q.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return None
    Lq, Lk = q.shape[-2], k.shape[-2]
    mask = g.detach().to(q.dtype).unsqueeze(-2)  # (B|1, H|1, 1, L)
    mask = mask.expand(mask.shape[0], mask.shape[1], Lq, Lk)
    try:
        return op(q, k, v, 0.0, True, attn_mask=mask, scale=scale)[0]
    except (RuntimeError, TypeError):  # pragma: no cover - other torch builds
        return None


def _chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, chunk: int) -> Tensor:
    D, L = q.shape[-1], q.shape[-2]
    outs = []
    for c0 in range(0, L, chunk):
        c1 = min(L, c0 + chunk)
        mid = (c0 + c1) // 2  # offset g(mid): logits of the keys near the chunk's queries stay ~ m * chunk / 2
        gk = ((g[..., :c1] - g[..., mid : mid + 1]) / scale).to(k.dtype)  # offset in g's dtype, then cast
        qp = _append(q[:, :, c0:c1], 1.0)
        kp = _append(k[:, :, :c1], gk)
        vp = _append(v[:, :, :c1], 0.0)
        # bottom-right causal: query c0 + r sees keys j <= c0 + r
        mask = torch.ones(c1 - c0, c1, dtype=torch.bool, device=q.device).tril(diagonal=c0)
        outs.append(F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)[..., :D])
    return torch.cat(outs, dim=-2)


def alibi_key_term(slopes: Tensor, L: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """ALiBi key term ``g(j) = m_h j`` as ``(1, H, L)`` (``b(i,j) = -m_h i + m_h j``)."""
    j = torch.arange(L, dtype=torch.float64, device=slopes.device)
    return (slopes.to(torch.float64)[:, None] * j[None, :]).unsqueeze(0).to(dtype)


def forget_key_term(log_f: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Forget-gate key term ``g(j) = -G_j``, ``G_t = sum_{s<=t} log f_s``: ``(B, H, L)``.

    The cumulative sum is done in float64 and cast to ``dtype`` (default: ``log_f.dtype``;
    pass float64 for the chunked long-context path). Differentiable in ``log_f``.
    """
    return (-torch.cumsum(log_f.to(torch.float64), dim=-1)).to(dtype or log_f.dtype)


def alibi_bias(slopes: Tensor, L: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Materialised ALiBi bias ``b(i,j) = -m_h (i - j)`` as ``(1, H, L, L)`` (baseline/fallback only)."""
    pos = torch.arange(L, dtype=torch.float64, device=slopes.device)
    rel = pos[:, None] - pos[None, :]  # (L, L) = i - j
    return (-slopes.to(torch.float64)[:, None, None] * rel).unsqueeze(0).to(dtype)


def materialized_bias_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, *, scale: float | None = None,
                                q_scale: Tensor | None = None) -> Tensor:
    """The usual hand-written baseline: SDPA with a float ``(B|1, H, L, L)`` mask incl. ``-inf`` causal.

    Also the fallback for biases that are not separable.
    """
    Lq, Lk = q.shape[-2], k.shape[-2]
    causal = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=Lk - Lq)
    mask = bias.to(q.dtype).masked_fill(~causal, float("-inf"))
    return F.scaled_dot_product_attention(scale_queries(q, q_scale), k, v, attn_mask=mask, scale=scale)


def alibi_score_mod(slopes: Tensor) -> Callable:
    """FlexAttention ``score_mod`` adding ``-m_h (q_idx - kv_idx)``; ``slopes (H,)``."""
    m = slopes.to(torch.float32)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - m[h] * (q_idx - kv_idx)

    return score_mod


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_bias_attention(q: Tensor, k: Tensor, v: Tensor, score_mod: Callable, *, scale: float | None = None) -> Tensor:
    """FlexAttention (``torch.nn.attention.flex_attention``) with a causal block mask.

    Compiles on first use. On CPU only the forward pass is supported: asking for
    gradients there raises :class:`pedsl.errors.CompileError`.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as e:  # pragma: no cover - old torch
        raise CompileError(
            "FlexAttention is not available in this torch build",
            hint="use the separable-bias or materialised-bias backend, or install torch >= 2.5.",
        ) from e
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise CompileError(
            "FlexAttention on CPU supports the forward pass only, but gradients were requested",
            hint="run it under torch.no_grad() (evaluation), or pick the separable-bias / materialised-bias "
            "backend for training on CPU.",
        )
    L, S = q.shape[-2], k.shape[-2]
    block_mask = create_block_mask(_causal, None, None, L, S, device=q.device)
    return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
