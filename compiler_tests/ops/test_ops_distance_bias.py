"""The Toeplitz distance-bias kernel (pedsl.ops.distance_bias) against a dense float64 reference whose bias
is written row by row from the table, forward and gradients (q, k, v and the table), across block and
key-tile boundaries."""

import math

import pytest
import torch

from compiler_helpers import float32_bound, largest_allocation, rnd
from pedsl.errors import ShapeError
from pedsl.ops import distance_bias as DB

F64 = torch.float64


def _dense(q, k, v, table):
    """softmax_j<=i(<q_i, k_j> / sqrt(D) + table[h, i - j]) v_j in float64, the bias written row by row."""
    B, H, L, D = q.shape
    bias = torch.full((table.shape[0], L, L), float("-inf"), dtype=F64)
    rows = []
    for i in range(L):
        row = torch.full((table.shape[0], L), float("-inf"), dtype=F64)
        row = torch.cat([table[:, i - torch.arange(i + 1)].to(F64), row[:, i + 1:]], dim=1)  # keys 0..i: t[i - j]
        rows.append(row)
    bias = torch.stack(rows, dim=1)  # (H|1, L, L), differentiable in the table
    s = q.to(F64) @ k.to(F64).transpose(-1, -2) / math.sqrt(D) + bias
    return torch.softmax(s, -1) @ v.to(F64)


def _grads(out, inputs, seed=3):
    # drawn in float64 and cast, so the float32 and float64 runs are weighted by the same numbers
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs)


@pytest.mark.parametrize("B, H, L, table_heads, block, key_tile", [
    (2, 3, 37, 3, 16, 5),    # L not a multiple of the block, tiles of 5 keys
    (1, 2, 5, 1, 16, 2),     # L < block, one table for all heads
    (2, 2, 64, 2, 16, 64),   # L a multiple of the block
    (1, 2, 40, 2, 64, 512),  # one block, one tile
    (1, 1, 1, 1, 8, 4),      # one token
    (2, 2, 50, 1, 16, 16),   # the tile as wide as the block
])
@pytest.mark.parametrize("learned", [True, False], ids=["learned", "frozen"])
def test_forward_and_gradients_equal_the_dense_float64_reference(B, H, L, table_heads, block, key_tile, learned):
    q, k, v = (rnd(B, H, L, 8, seed=s).requires_grad_(True) for s in range(3))
    table = (rnd(table_heads, L + 3, seed=7) * 2).requires_grad_(learned)
    inputs = [q, k, v] + ([table] if learned else [])
    out = DB.distance_bias_attention(q, k, v, table, block=block, key_tile=key_tile)
    want = _dense(q, k, v, table)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for got, ref in zip(_grads(out, inputs), _grads(want, inputs)):
        torch.testing.assert_close(got, ref, rtol=1e-11, atol=1e-12)


def test_float32_errs_no_more_than_float32_sdpa_with_the_materialised_bias():
    """Against float64, the float32 kernel's output and gradients, like those of the usual float32 layer (SDPA
    with the materialised (H, L, L) bias and causal mask), are within float32's rounding of a reduction over
    the L keys and D channels (float32_bound: eps32 (L + D) max|ref|). A multiple of SDPA's own error is no
    bound: the two kernels sum in different orders, and their ratio was 0.5x-3x across CPU capabilities."""
    import torch.nn.functional as F

    H, L = 4, 300
    q, k, v = (rnd(1, H, L, 16, seed=s, dtype=torch.float32).requires_grad_(True) for s in range(3))
    table = (-0.05 * torch.arange(320, dtype=F64)).expand(H, 320).clone().requires_grad_(True)
    out = DB.distance_bias_attention(q, k, v, table, block=64, key_tile=100)
    i = torch.arange(L)
    bias = table[:, (i[:, None] - i[None, :]).clamp(min=0)].float().masked_fill(i[None, :] > i[:, None], float("-inf"))
    usual = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    want = _dense(q, k, v, table)
    assert out.dtype == torch.float32
    inputs = [q, k, v, table]
    pairs = [(out, usual)] + list(zip(_grads(out, inputs), _grads(usual, inputs)))
    for ref, (got, hand) in zip([want, *_grads(want, inputs)], pairs):
        err, err_usual = (float((t.detach().to(F64) - ref.detach().to(F64)).abs().max()) for t in (got, hand))
        bound = float32_bound(L + 16, ref)
        assert err <= bound and err_usual <= bound, (err, err_usual, bound)


def test_no_tensor_grows_as_the_square_of_the_length():
    """Forward and backward allocate O(B H block (block + key tile)) per tile: nothing of (B, H, L, L)."""
    B, H, L, D = 1, 2, 2000, 8
    q, k, v = (rnd(B, H, L, D, seed=s, dtype=torch.float32).requires_grad_(True) for s in range(3))
    table = (-0.01 * torch.arange(L, dtype=F64)).expand(H, L).clone().requires_grad_(True)
    most = largest_allocation(lambda: DB.distance_bias_attention(q, k, v, table).sum().backward())
    n = DB.BLOCK
    assert most <= 4 * B * H * n * (DB.KEY_TILE + n + 1)  # one tile's scores, in the skewed buffer
    assert most < 4 * B * H * L * L / 4


def test_bad_shapes_are_diagnostics():
    q = rnd(1, 2, 10, 4)
    with pytest.raises(ShapeError, match="table must be"):
        DB.distance_bias_attention(q, q, q, rnd(2, 9))
    with pytest.raises(ShapeError, match="alike"):
        DB.distance_bias_attention(q, q[:, :, :5], q[:, :, :5], rnd(2, 10))
    with pytest.raises(ShapeError, match="float32 or float64"):
        DB.distance_bias_attention(q.half(), q.half(), q.half(), rnd(2, 10))
