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

Precision: ``g(j)`` grows with ``j`` (ALiBi: ``m_h j``; forget gate: ``-G_j``, a sum of ``j``
negative logs). A float32 kernel adds it to the scores, so a row whose keys carry ``|g| ~ m L``
rounds every logit to ``~6e-8 m L`` (ALiBi, H = 8: 1e-4 at L = 4,096) while a plain float32 bias,
small near the diagonal, rounds to ``~6e-8``. So the queries run in blocks, and each block's key term
is offset by ``g`` at the block's middle query (formed in the key term's own dtype - pass float64 -
then cast): a block's logits near its diagonal stay below ``SPAN`` and the output is about as
accurate as with a plain float32 bias. A head's blocks are the largest power of two (``MIN_BLOCK``
.. L) over which its ``g`` varies by at most ``SPAN``: 64 queries for ALiBi's steepest head of 8,
the whole sequence for its gentlest, ~512 for a forget gate that forgets ~0.05 a token.

CPU: each block is two calls of PyTorch's CPU flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu``, which accepts a float mask together with
``is_causal``): the block's own keys (causal) and the keys before it (all visible), each with the
key term as a ``(B|1, H|1, 1, keys)`` row broadcast over the queries (stride 0: no memory), merged by
their log-sum-exps; heads that need the same block size share the calls. Head dim stays D. The
backward (:class:`_BlockedKeyTerm`) is one call of the flash backward kernel over all queries, with
the key term un-offset and each query's log-sum-exp shifted back by its block's offset (the same
softmax, so the forward's speed is kept in training; the gradients carry the unblocked rounding), and
the key term's gradient ``sum_i dS_ij = v_j . dv_j - sum_i P_ij D_i``, the last sum riding in one
more value channel of the backward. Elsewhere the blocks use the extra channel with an explicit
bottom-right causal mask (SDPA's ``is_causal`` with ``Lq != Lk`` is top-left aligned).

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
from pedsl.ops.flash import FLASH, FLASH_BACKWARD, query_blocks


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


SPAN = 32.0  # |g(j) - g(mid)| over a block's own keys: float32 logits keep ~1e-6 (ALiBi, H = 8)
MIN_BLOCK = 32


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

    ``key_term``: ``g`` as ``(B|1, H|1, L)`` (None: no bias); pass it in float64 for full precision
    (see module docstring). ``chunk_size``: the queries per block (None: :func:`query_block`).
    """
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q = scale_queries(q, q_scale)
    if key_term is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    while key_term.dim() < 3:  # (L,) or (H, L) -> (1, H|1, L)
        key_term = key_term.unsqueeze(0)
    L = k.shape[-2]
    if q.device.type != "cpu" or FLASH is None or FLASH_BACKWARD is None or q.shape != k.shape:
        return _chunked(q, k, v, key_term, scale, query_block(key_term, L) if chunk_size is None else chunk_size)
    outs = []  # heads of one block size in one call: ALiBi's gentle heads need no blocks
    for h0, h1, block in _head_groups(key_term, L) if chunk_size is None else [(0, q.shape[1], int(chunk_size))]:
        heads = slice(h0, h1)
        g = key_term if key_term.shape[1] == 1 else key_term[:, heads]
        outs.append(_BlockedKeyTerm.apply(q[:, heads], k[:, heads], v[:, heads], g, scale, min(L, block)))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


def query_block(g: Tensor, L: int) -> int:
    """Queries per block for all heads: the smallest of :func:`_blocks_per_head`."""
    return min(_blocks_per_head(g, L))


def _blocks_per_head(g: Tensor, L: int) -> list[int]:
    """Per head of g, the largest power of two ``C`` (MIN_BLOCK .. L) such that g varies by at most
    ``SPAN`` within every block of C queries (all batch rows): ALiBi's ``m (C - 1) <= SPAN``, a
    forget gate's sum of C log gates."""
    if torch.compiler.is_compiling() or L < 2:  # no data-dependent sizes in a trace
        return [min(L, 2 * MIN_BLOCK)] * g.shape[1]
    gd = g.detach()
    chosen: list[int | None] = [None] * g.shape[1]
    C = 2 ** math.ceil(math.log2(L))
    while C >= MIN_BLOCK and None in chosen:
        pad = -L % C  # the last block repeats its last value: no extra range
        blocks = torch.cat([gd, gd[..., -1:].expand(*gd.shape[:-1], pad)], -1).unflatten(-1, (-1, C))
        spread = (blocks.amax(-1) - blocks.amin(-1)).amax(dim=(0, 2))  # per head
        for h, r in enumerate(spread.tolist()):
            if chosen[h] is None and (r <= SPAN or not math.isfinite(r) and C == MIN_BLOCK):
                chosen[h] = min(L, C)
        C //= 2
    return [min(L, MIN_BLOCK) if c is None else c for c in chosen]


def _head_groups(g: Tensor, L: int) -> list[tuple[int, int | None, int]]:
    """(first head, end (None: the last), block) for runs of heads with one block size (all heads when g has one)."""
    sizes = _blocks_per_head(g, L)
    if len(sizes) == 1:
        return [(0, None, sizes[0])]
    groups: list[tuple[int, int | None, int]] = []
    for h, size in enumerate(sizes):
        if groups and groups[-1][2] == size:
            groups[-1] = (groups[-1][0], h + 1, size)
        else:
            groups.append((h, h + 1, size))
    return groups


def _rows(g: Tensor, c0: int, c1: int, dtype: torch.dtype) -> Tensor:
    """The key term of the keys 0..c1-1 for queries c0..c1-1, offset by its value at the block's middle
    query (in g's dtype, then cast): ``(B|1, H|1, c1)``."""
    return (g[..., :c1] - g[..., (c0 + c1) // 2].unsqueeze(-1)).to(dtype)


def _row_mask(row: Tensor, queries: int) -> Tensor:
    return row.unsqueeze(-2).expand(row.shape[0], row.shape[1], queries, row.shape[-1])  # stride 0 over queries


class _BlockedKeyTerm(torch.autograd.Function):
    """Causal attention with the key term offset per query block, on the CPU flash kernel (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, g, scale, block):
        assert FLASH is not None  # the flash path is taken only where torch has the kernel
        outs, lses = [], []
        for c0, c1 in query_blocks(q.shape[-2], block):
            row, qb = _rows(g, c0, c1, q.dtype), q[:, :, c0:c1]
            o, lse = FLASH(qb, k[:, :, c0:c1], v[:, :, c0:c1], 0.0, True, attn_mask=_row_mask(row[..., c0:], c1 - c0),
                           scale=scale)[:2]
            if c0:  # the keys before the block, all visible: merged by log-sum-exp
                op, lp = FLASH(qb, k[:, :, :c0], v[:, :, :c0], 0.0, False,
                               attn_mask=_row_mask(row[..., :c0], c1 - c0), scale=scale)[:2]
                both = torch.logaddexp(lse, lp)
                o = o * torch.exp(lse - both).unsqueeze(-1).to(o.dtype) + op * torch.exp(lp - both).unsqueeze(-1).to(o.dtype)
                lse = both
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, k, v, g, out, lse)
        ctx.scale, ctx.block = scale, block
        return out

    @staticmethod
    def backward(ctx, dout):
        """One call of the flash backward over all queries, with the key term un-offset and each query's
        log-sum-exp shifted back by its block's offset (the softmax is the same): the kernel's speed."""
        assert FLASH_BACKWARD is not None  # the flash path is taken only where torch has the kernel
        q, k, v, g, out, lse = ctx.saved_tensors
        D, L, need_g = q.shape[-1], q.shape[-2], ctx.needs_input_grad[3]
        shift = torch.cat([g[..., (c0 + c1) // 2].unsqueeze(-1).expand(*g.shape[:-1], c1 - c0)
                           for c0, c1 in query_blocks(L, ctx.block)], -1)
        lse = (lse + shift).to(lse.dtype).expand(*q.shape[:-1]).contiguous()
        dout = dout.contiguous()
        if need_g:  # one more channel (zero in q, k, v and out; D_i = dout_i . out_i in dout) carries sum_i P_ij D_i
            z = torch.zeros_like(q[..., :1])
            dout, out = torch.cat([dout, (dout * out).sum(-1, keepdim=True)], -1), torch.cat([out, z], -1)
            q, k, v = torch.cat([q, z], -1), torch.cat([k, z], -1), torch.cat([v, z], -1)
        dq, dk, dv = FLASH_BACKWARD(dout, q, k, v, out.contiguous(), lse, 0.0, True,
                                    attn_mask=_row_mask(g.to(q.dtype), L), scale=ctx.scale)
        dg = None
        if need_g:  # sum_i dS_ij = v_j . dv_j - sum_i P_ij D_i
            dg = _sum_to((v[..., :D] * dv[..., :D]).sum(-1) - dv[..., D], g.shape).to(g.dtype)
        return dq[..., :D], dk[..., :D], dv[..., :D], dg, None, None


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """t summed over the dimensions that ``shape`` broadcasts (size 1)."""
    dims = [d for d, n in enumerate(shape) if n == 1 and t.shape[d] != 1]
    return t.sum(dims, keepdim=True) if dims else t


def _chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, chunk: int) -> Tensor:
    """The blocks with the key term in one more channel (any device; differentiable by autograd)."""
    D, L = q.shape[-1], q.shape[-2]
    outs = []
    for c0, c1 in query_blocks(L, chunk):
        qp = _append(q[:, :, c0:c1], 1.0)
        kp = _append(k[:, :, :c1], _rows(g, c0, c1, g.dtype).div(scale).to(k.dtype))
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
def compiled_flex() -> Callable:
    """FlexAttention under ``torch.compile`` (fused kernels), compiled on first call."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def compiled_flex_runs_on(device: torch.device) -> bool:
    """Whether compiled FlexAttention runs on ``device``: Inductor's CPU template needs x86 AVX2 with
    ``ATEN_CPU_CAPABILITY`` not lowered to ``default``, and not macOS (torch 2.13's own check,
    ``torch._inductor.kernel.flex.flex_cpu.check_cpu_supported``; elsewhere it raises while compiling)."""
    if device.type != "cpu":
        return True
    import os
    import sys

    return bool(torch.cpu._is_avx2_supported()) and os.getenv("ATEN_CPU_CAPABILITY") != "default" \
        and sys.platform != "darwin"


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
    if not compiled_flex_runs_on(q.device):
        raise CompileError(
            "compiled FlexAttention does not run on this CPU: torch's CPU kernel for it needs x86 AVX2 (and "
            "ATEN_CPU_CAPABILITY not set to 'default'), and not macOS",
            hint="pick the separable-bias or materialised-bias backend on this machine.",
        )
    L, S = q.shape[-2], k.shape[-2]
    block_mask = create_block_mask(_causal, None, None, L, S, device=q.device)
    return compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
