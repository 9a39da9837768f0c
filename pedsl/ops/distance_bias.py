"""Causal attention with a bias that depends on the distance only, ``b(i, j) = t[h, i - j]``
(T5's buckets, dynamic position bias, KERPLE, Sandwich: a Toeplitz bias), without an (H, L, L) tensor.

The table ``t (H|1, >= L)`` is computed once per call (O(H L)) by the caller. The keys are taken in
reverse order (one flip of k and v per call); then the bias of the block of queries ``c0 .. c1 - 1``
over the keys ``c1 - 1, ..., 0`` is, at row r and column j', ``t[c0 + r - c1 + 1 + j']``: both indices
step the distance by +1, so with ``tp = [-inf x block, t]`` the block's rows are a view of ``tp`` with
strides (1, 1) - no copy, no index tensor, and the causal ``-inf`` comes with it. Forward: one call of
PyTorch's CPU flash kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, float mask read in
place) per block over the keys it can see (the causal half of the work), which also returns each
query's log-sum-exp.

Backward (:class:`_DistanceBias`), per block, from the forward's output and log-sum-exp:

* table frozen (Sandwich): the flash backward kernel with the same rows;
* table learned: per tile of ``block`` queries by ``KEY_TILE`` keys (scores kept in cache) the
  probabilities are recomputed and ``dS = P * (dO V^T - rowsum(dO * O))`` formed, with the scale, the
  log-sum-exp and the row sums folded into the matmuls by one more channel; dq, dk, dv are its matmuls.
  The table's gradient is the sum of ``dS`` along each distance: ``dS`` is written through a skewed view
  of a buffer whose row r is shifted by r, so that each column is one distance and the gradient is a
  column sum (no scatter).

Memory: O(B H block (block + KEY_TILE)) beyond the inputs and outputs. Denormals (docs/semantics.md
§6): peaked rows fill the softmax with denormal floats; the application owns ``torch.set_flush_denormal``.

The public call checks its inputs; everything after the ``# ----`` banner is torch only and codegen
copies it verbatim into the generated modules of schemes with distance tables.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.errors import ShapeError
from pedsl.ops.flash import FLASH, FLASH_BACKWARD, flash_supports, query_blocks


def check_causal_inputs(name: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    """A :class:`ShapeError` unless q, k, v are (B, H, L, D) alike, on CPU in float32 or float64."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ShapeError(f"{name}: q, k and v must be (B, H, L, D) alike, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}", hint="one causal sequence: as many keys as queries")
    if not distance_bias_supported(q):
        raise ShapeError(f"{name} runs on CPU in float32 or float64, got {q.dtype} on {q.device}",
                         hint="elsewhere use SchemeAttention's blocks of queries (pedsl.compiler.general)")


def distance_bias_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, scale: float | None = None,
                            block: int | None = None, key_tile: int | None = None) -> Tensor:
    """Causal attention ``softmax_j<=i(scale <q_i, k_j> + table[h, i - j]) v_j`` of q, k, v ``(B, H, L, D)``
    (one sequence at positions 0 .. L-1); ``table (H|1, >= L)`` in any float dtype (float64: cast once),
    differentiable. CPU, float32 / float64 (:func:`distance_bias_supported`). ``block``: queries per block
    (default :data:`BLOCK`); ``key_tile``: keys per tile of the learned table's backward (:data:`KEY_TILE`)."""
    check_causal_inputs("distance_bias_attention", q, k, v)
    L = q.shape[-2]
    if table.dim() != 2 or table.shape[-1] < L or table.shape[0] not in (1, q.shape[1]):
        raise ShapeError(f"distance_bias_attention: table must be (1 or {q.shape[1]}, >= {L}), got "
                         f"{tuple(table.shape)}", hint="one value per head (or one for all) and distance 0 .. L-1")
    return distance_forward(q, k, v, table, scale=scale, block=block, key_tile=key_tile)


# <embedded>
# ---------------------------------------------------------------------------------------------
# The Toeplitz kernel (copied verbatim into generated modules of schemes with distance tables).
# ---------------------------------------------------------------------------------------------
BLOCK = 256  # queries per block of the forward (the flash kernel reads the bias rows in place)
KEY_TILE = 1024  # keys per tile of the learned table's backward: B * H * 256 * 1024 scores stay in the L3 cache


def distance_bias_supported(q: Tensor) -> bool:
    """Whether :func:`distance_bias_attention` runs for tensors like ``q`` (PyTorch's CPU flash kernel)."""
    return flash_supports(q) and q.dtype in (torch.float32, torch.float64)


def distance_forward(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, scale: float | None = None,
                     block: int | None = None, key_tile: int | None = None) -> Tensor:
    """:func:`distance_bias_attention` on inputs of the right shapes (unchecked)."""
    D, L = q.shape[-1], q.shape[-2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if L == 0:
        return torch.zeros_like(q)
    block = min(BLOCK if block is None else int(block), L)
    return _DistanceBias.apply(q, k, v, table, scale, block, max(1, KEY_TILE if key_tile is None else int(key_tile)))


def _padded_table(table: Tensor, L: int, block: int, dtype: torch.dtype) -> Tensor:
    """``[-inf x block, t[0], ..., t[L-1]]``: (H|1, block + L) in the compute dtype, contiguous."""
    t = table[..., :L].to(dtype)
    return torch.cat([t.new_full((t.shape[0], block), float("-inf")), t], -1).contiguous()


def _bias_rows(tp: Tensor, block: int, c0: int, c1: int) -> Tensor:
    """Bias of the queries c0 .. c1-1 over the keys c1-1, c1-2, ..., 0 (reversed), ``-inf`` where the key
    follows the query: (H|1, c1 - c0, c1), a view of the padded table (row r, column j' reads distance
    c0 + r - (c1 - 1 - j'): both strides 1)."""
    return tp.as_strided((tp.shape[0], c1 - c0, c1), (tp.stride(0), 1, 1),
                         tp.storage_offset() + block + c0 - c1 + 1)


def _mask(rows: Tensor, B: int) -> Tensor:
    return rows.unsqueeze(0).expand(B, *rows.shape)


class _DistanceBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, scale, block, key_tile):
        assert FLASH is not None  # the flash path is taken only where torch has the kernel
        B, _, L, _ = q.shape
        tp = _padded_table(table.detach(), L, block, q.dtype)
        kr, vr = k.flip(-2), v.flip(-2)  # keys in reverse order: the first c1 keys are kr[..., L - c1:, :]
        outs, lses = [], []
        for c0, c1 in query_blocks(L, block):
            o, lse = FLASH(q[:, :, c0:c1], kr[:, :, L - c1:], vr[:, :, L - c1:], 0.0, False,
                           attn_mask=_mask(_bias_rows(tp, block, c0, c1), B), scale=scale)[:2]
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, kr, vr, table, out, lse)
        ctx.scale, ctx.block, ctx.key_tile = scale, block, key_tile
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        assert FLASH_BACKWARD is not None  # the flash path is taken only where torch has the kernel
        q, kr, vr, table, out, lse = ctx.saved_tensors
        B, _, L, _ = q.shape
        scale, block = ctx.scale, ctx.block
        tp = _padded_table(table.detach(), L, block, q.dtype)
        dout = dout.contiguous()
        if ctx.needs_input_grad[3]:
            dq, dk, dv, dtab = _explicit_backward(q, kr, vr, dout, out, lse, tp, scale, block, ctx.key_tile)
            dt = torch.zeros_like(table)
            dt[..., :L] = dtab.to(table.dtype)
            return dq, dk.flip(-2), dv.flip(-2), dt, None, None, None
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(kr), torch.zeros_like(vr)  # dk, dv: reversed keys
        for c0, c1 in query_blocks(L, block):
            keys = slice(L - c1, L)
            gq, gk, gv = FLASH_BACKWARD(dout[:, :, c0:c1], q[:, :, c0:c1], kr[:, :, keys], vr[:, :, keys],
                                        out[:, :, c0:c1], lse[:, :, c0:c1], 0.0, False,
                                        attn_mask=_mask(_bias_rows(tp, block, c0, c1), B), scale=scale)
            dq[:, :, c0:c1] = gq
            dk[:, :, keys] += gk
            dv[:, :, keys] += gv
        return dq, dk.flip(-2), dv.flip(-2), None, None, None, None


def _explicit_backward(q, kr, vr, dout, out, lse, tp, scale, block, key_tile):
    """dq, dk, dv (keys reversed) and the table's gradient (H|1, L) from the recomputed probabilities, per
    tile of ``block`` queries by ``key_tile`` keys (:class:`TileGrads`). dS is written through a skewed view
    (:func:`skewed_buffer`), so that the table's gradient is a column sum (no scatter)."""
    B, H, L, D = q.shape
    grads = TileGrads(q, kr, vr, dout, out, lse, scale)
    dtab = torch.zeros(tp.shape[0], L, dtype=q.dtype, device=q.device)
    for c0, c1 in query_blocks(L, block):
        rows = _bias_rows(tp, block, c0, c1)
        for a in range(0, c1, key_tile):
            e = min(c1, a + key_tile)
            flat, ds = skewed_buffer((B, H), c1 - c0, e - a, q.dtype, q.device)
            grads.tile(rows[:, :, a:e], c0, c1, a, e, ds=ds)
            sums = column_sums(flat, c1 - c0, e - a).sum(0)
            add_at_distances(dtab, sums if dtab.shape[0] > 1 else sums.sum(0, keepdim=True), c0 - c1 + 1 + a)
    dq, dk, dv = grads.result()
    return dq, dk, dv, dtab


class TileGrads:
    """dq, dk, dv (keys reversed) of causal attention with a float bias, accumulated per tile of queries by
    reversed keys from the probabilities recomputed with the saved log-sum-exp. Folded into the matmuls by
    one more channel: ``[q scale, -lse] . [k, 1]`` gives the logits minus the log-sum-exp, and
    ``[dO, -delta] . [v, 1]`` gives ``dP - delta`` (delta = rowsum(dO * O))."""

    def __init__(self, q, kr, vr, dout, out, lse, scale):
        B, H, L, D = q.shape
        one = q.new_ones(B, H, L, 1)
        self.scale = scale
        self.q1 = torch.cat([q * scale, -lse.unsqueeze(-1).to(q.dtype)], -1)
        self.do1 = torch.cat([dout, -(dout * out).sum(-1, keepdim=True)], -1)
        self.k1, self.v1 = torch.cat([kr, one], -1), torch.cat([vr, one], -1)
        self.dq, self.dk, self.dv = torch.zeros_like(q), torch.zeros_like(kr), torch.zeros_like(vr)

    def tile(self, bias: Tensor, c0: int, c1: int, a: int, e: int, ds: Tensor | None = None) -> Tensor:
        """dS (B, H, n, m) of the queries c0 .. c1-1 over the reversed keys a .. e-1 of the first c1 (original
        keys c1-1-a down to c1-e), with their bias ``(H|1, n, m)`` (a view is fine; ``-inf`` masks); written
        into ``ds`` when given. Adds the tile's share to dq, dk, dv."""
        B, H, n, m = self.q1.shape[0], self.q1.shape[1], c1 - c0, e - a
        qb, K, V, do = self._slices(c0, c1, a, e)
        p = torch.empty(B, H, n, m, dtype=qb.dtype, device=qb.device)
        for b in range(B):  # logits - lse in one pass (baddbmm broadcasts the bias over the heads)
            torch.baddbmm(bias.expand(H, n, m), qb[b], K[b].transpose(-1, -2), out=p[b])
        _exp_(p)
        dpd = do @ V.transpose(-1, -2)  # dP - delta
        ds = torch.mul(p, dpd) if ds is None else torch.mul(p, dpd, out=ds)
        self._add_dv(p, c0, c1, a, e)
        self._add_dq_dk(ds, c0, c1, a, e)
        return ds

    def skewed_tile(self, flat: Tensor, c0: int, c1: int, a: int, e: int) -> Tensor:
        """:meth:`tile` in place: ``flat (B, H, n (m + n - 1))`` (:func:`skewed_buffer`'s layout) holds the tile's
        bias in its view on entry (its gaps anything but NaN) and dS on return, its gaps zeroed, so that
        :func:`column_sums` of it are dS's sums along each distance. The bias is never copied (``baddbmm_`` adds
        the logits to it in place) and no second buffer is written. Returns the ``(B, H, n, m)`` view."""
        B, H, n, m = flat.shape[0], flat.shape[1], c1 - c0, e - a
        qb, K, V, do = self._slices(c0, c1, a, e)
        p = flat.as_strided((B, H, n, m), (*flat.stride()[:2], m + n, 1), flat.storage_offset())
        for b in range(B):
            p[b].baddbmm_(qb[b], K[b].transpose(-1, -2))
        _exp_(flat)  # the whole buffer: the contiguous (vectorised) path, ~5x faster than through the view
        zero_gaps(flat, n, m)
        self._add_dv(p, c0, c1, a, e)
        p.mul_(do @ V.transpose(-1, -2))  # dS = P (dP - delta)
        self._add_dq_dk(p, c0, c1, a, e)
        return p

    def _slices(self, c0: int, c1: int, a: int, e: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        L = self.q1.shape[-2]
        keys = slice(L - c1 + a, L - c1 + e)
        return self.q1[:, :, c0:c1], self.k1[:, :, keys], self.v1[:, :, keys], self.do1[:, :, c0:c1]

    def _add_dv(self, p: Tensor, c0: int, c1: int, a: int, e: int) -> None:
        L, D = self.q1.shape[-2], self.q1.shape[-1] - 1
        self.dv[:, :, L - c1 + a: L - c1 + e] += p.transpose(-1, -2) @ self.do1[:, :, c0:c1, :D]

    def _add_dq_dk(self, ds: Tensor, c0: int, c1: int, a: int, e: int) -> None:
        L, D = self.q1.shape[-2], self.q1.shape[-1] - 1
        keys = slice(L - c1 + a, L - c1 + e)
        self.dq[:, :, c0:c1] += ds @ self.k1[:, :, keys, :D]
        self.dk[:, :, keys] += ds.transpose(-1, -2) @ self.q1[:, :, c0:c1, :D]

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """dq, dk, dv (keys reversed)."""
        return self.dq.mul_(self.scale), self.dk, self.dv


def _exp_(p: Tensor) -> Tensor:
    """``exp`` in place of logits minus the log-sum-exp, clamped first: exp's underflow path is ~12x slower per
    entry on CPU, and peaked rows (KERPLE power, ALiBi-like slopes) send most entries there. An entry below
    log(tiny) + 1 reads as e * tiny (3e-38 in float32; clamping at log(tiny) itself rounds into the denormals,
    the slow path again), below the resolution of every sum it enters (masked keys included: at most
    L * e * tiny)."""
    return p.clamp_(min=math.log(torch.finfo(p.dtype).tiny) + 1.0).exp_()


def skewed_buffer(lead: tuple, n: int, m: int, dtype, device) -> tuple[Tensor, Tensor]:
    """A buffer whose row r is shifted by r (the gaps between the rows zeroed) and its ``(*lead, n, m)`` view:
    a tile of queries by reversed keys written through the view has one distance per column of
    :func:`column_sums` (row r, column j at column r + j)."""
    width = m + n - 1
    flat = torch.empty(*lead, n * width, dtype=dtype, device=device)  # the last row ends at n * width exactly
    zero_gaps(flat, n, m)
    return flat, flat.as_strided((*lead, n, m), (*flat.stride()[:-1], width + 1, 1))


def zero_gaps(flat: Tensor, n: int, m: int) -> None:
    """Zero the n - 1 gaps of n entries between the rows of a :func:`skewed_buffer` ``flat`` (contiguous)."""
    if n > 1:
        flat.as_strided((*flat.shape[:-1], n - 1, n), (*flat.stride()[:-1], m + n, 1), flat.storage_offset() + m).zero_()


def column_sums(flat: Tensor, n: int, m: int) -> Tensor:
    """(*lead, n + m - 1): the sums along each distance of what was written through :func:`skewed_buffer`."""
    return flat.view(*flat.shape[:-1], n, m + n - 1).sum(-2)


def add_at_distances(dst: Tensor, sums: Tensor, base: int) -> None:
    """``dst[..., base + c] += sums[..., c]`` for the distances >= 0 (``base``: the distance of column 0)."""
    lo = max(base, 0)
    dst[..., lo: base + sums.shape[-1]] += sums[..., lo - base:]
# </embedded>
