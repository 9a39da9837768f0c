"""FIRE's MLP-bias kernel (pedsl.ops.mlp_bias) against a dense float64 reference that evaluates the MLP at
every (query, key) pair, forward and gradients (q, k, v, u, w and the MLP's W1, b1, W2, b2), across block and
key-tile boundaries, with units on, off and kinked inside the range of x; and its memory."""


import pytest
import torch

from compiler_helpers import dense_mlp_bias, float32_bound, largest_allocation, rnd
from pedsl.errors import ShapeError
from pedsl.ops import mlp_bias as MB

F64 = torch.float64


def _fire_factors(L, c=0.3, threshold=10.0):
    """FIRE's u(d) = log(c d + 1) and w(i) = 1 / log(c max(i, threshold) + 1), learned c and threshold."""
    c, thr = torch.tensor(c, dtype=F64, requires_grad=True), torch.tensor(threshold, dtype=F64, requires_grad=True)
    d = torch.arange(L, dtype=F64)
    return c, thr, torch.log(c * d + 1), 1 / (torch.log(c * torch.maximum(d, thr) + 1) + 1e-6)


def _mlp(H, K, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    w1, b1 = torch.randn(K, generator=g, dtype=F64), torch.randn(K, generator=g, dtype=F64) * 0.5 * spread
    w2, b2 = torch.randn(H, K, generator=g, dtype=F64), torch.randn(H, generator=g, dtype=F64)
    return [t.requires_grad_(True) for t in (w1, b1, w2, b2)]


def _grads(out, inputs, seed=3):
    # drawn in float64 and cast: a float32 run and its float64 reference are weighted by the same numbers
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs, retain_graph=True)


@pytest.mark.parametrize("B, H, L, block, score_tile, threshold", [
    (2, 3, 37, 16, 20, 10.0),   # L not a multiple of the block nor the tiles, the threshold inside
    (1, 2, 5, 16, 4, 10.0),     # L < block: every query below the threshold (a Toeplitz bias)
    (2, 2, 64, 16, 32, 64.0),   # L a multiple of the block and the tiles, the threshold at L
    (1, 2, 40, 64, 512, 0.5),   # one block, one tile, every query above the threshold
    (1, 1, 1, 8, 4, 10.0),      # one token
    (2, 2, 50, 8, 12, 100.0),   # the threshold past L; tiles not a multiple of the block
])
def test_forward_and_gradients_equal_the_dense_float64_reference(B, H, L, block, score_tile, threshold):
    """Gradients of q, k, v, the MLP and, through u and w, FIRE's c and threshold."""
    q, k, v = (rnd(B, H, L, 8, seed=s).requires_grad_(True) for s in range(3))
    c, thr, u, w = _fire_factors(L, threshold=threshold)
    mlp = _mlp(H, 12, seed=L)
    inputs = [q, k, v, c, thr, *mlp]
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=block, score_tile=score_tile)
    want = dense_mlp_bias(q, k, v, u, w, *mlp)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    got, ref = _grads(out, inputs), _grads(want, inputs)
    for name, a, b in zip(["q", "k", "v", "c", "threshold", "W1", "b1", "W2", "b2"], got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=lambda m, name=name: f"{name}: {m}")
    if threshold < L - 1:
        assert float(ref[4].abs()) > 0 or threshold < 1  # the threshold's gradient is exercised


@pytest.mark.parametrize("spread", [0.0, 1.0, 20.0], ids=["kinks-at-zero", "mixed", "kinks-far"])
def test_units_on_off_and_in_range_all_take_part(spread):
    """b1 = 0 puts every kink at x = 0 (each unit on or off over the whole call); a wide spread puts most kinks
    outside the range of x; in between, some fall inside tiles. All equal the dense reference."""
    B, H, L = 1, 2, 45
    q, k, v = (rnd(B, H, L, 8, seed=s + 10).requires_grad_(True) for s in range(3))
    u = torch.log(0.5 * torch.arange(L, dtype=F64) + 1).requires_grad_(True)
    w = (1 / torch.log(0.5 * torch.arange(L, dtype=F64).clamp(min=4) + 1)).requires_grad_(True)
    mlp = _mlp(H, 16, seed=3, spread=spread)
    inputs = [q, k, v, u, w, *mlp]
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=16, score_tile=24)
    want = dense_mlp_bias(q, k, v, u, w, *mlp)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(_grads(out, inputs), _grads(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_bands_cross_tiles_and_the_threshold_and_vanish_where_w_is_constant():
    """Blocks of 16 queries, tiles of 20 keys, the threshold at 30 (inside the second block): past it w varies
    over a block's rows, so kinks become bands of distances evaluated per pair (crossing tile edges); below
    it w is constant and there are none. Forward and every gradient equal the dense reference."""
    B, H, L, thr = 2, 2, 70, 30.0
    q, k, v = (rnd(B, H, L, 8, seed=s + 20).requires_grad_(True) for s in range(3))
    c, t, u, w = _fire_factors(L, c=0.5, threshold=thr)
    mlp = _mlp(H, 24, seed=5)
    plan = MB._Plan(u, w, tuple(mlp), L, F64)
    assert plan.block(0, 16).bands == []  # every row below the threshold
    assert sum(len(plan.block(c0, c0 + 16).bands) for c0 in (32, 48)) > 0
    inputs = [q, k, v, c, t, *mlp]
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=16, score_tile=20)
    want = dense_mlp_bias(q, k, v, u, w, *mlp)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(["q", "k", "v", "c", "threshold", "W1", "b1", "W2", "b2"], _grads(out, inputs),
                          _grads(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=lambda m, name=name: f"{name}: {m}")


def test_float32_is_as_close_to_float64_as_float32_sdpa_with_the_materialised_bias():
    """The float32 kernel and float32 SDPA with the materialised bias are both within float32's rounding of
    their reductions (float32_bound), not within a multiple of each other's error printed by one CPU."""
    import torch.nn.functional as F

    B, H, L = 1, 2, 300
    q, k, v = (rnd(B, H, L, 16, seed=s) for s in range(3))
    c, thr, u, w = _fire_factors(L, threshold=50.0)
    mlp = [t.detach() for t in _mlp(H, 32, seed=1)]
    want = dense_mlp_bias(q, k, v, u.detach(), w.detach(), *mlp)
    out = MB.mlp_bias_attention(q.float(), k.float(), v.float(), u.float(), w.float(), *(t.float() for t in mlp))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    x = (u[(i - j).clamp(min=0)] * w[:, None]).float()
    bias = (torch.relu(x[..., None] * mlp[0].float() + mlp[1].float()) @ mlp[2].float().t() + mlp[3].float())
    base = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                          attn_mask=bias.permute(2, 0, 1).masked_fill(j > i, float("-inf")))
    bound = float32_bound(L + 16 + 32, want)  # keys, channels of a score, the MLP's hidden units of a bias
    assert float((out.detach().double() - want).abs().max()) <= bound
    assert float((base.double() - want).abs().max()) <= bound


def test_training_holds_nothing_larger_than_a_block_of_bias():
    """Forward and backward at L = 2,000 (float32): the largest allocation is one tile's skewed buffer
    (B H 256 (1024 + 255)) or a band's activations (K, 256, L), never (H, L, L) nor the MLP's activations over
    a block's keys."""
    B, H, L, K = 1, 4, 2000, 32
    q, k, v = (rnd(B, H, L, 16, seed=s, dtype=torch.float32).requires_grad_(True) for s in range(3))
    c, thr, u, w = _fire_factors(L, c=0.1, threshold=512.0)
    mlp = [t.float().detach().requires_grad_(True) for t in _mlp(H, K, seed=2)]
    most = largest_allocation(lambda: MB.mlp_bias_attention(q, k, v, u.float(), w.float(), *mlp).sum().backward())
    assert most <= 4 * max(H * MB.BLOCK * (MB.SCORE_TILE + MB.BLOCK), K * MB.BLOCK * L)
    assert most < 4 * H * L * L / 8


def test_bad_shapes_and_devices_are_diagnostics():
    q = rnd(1, 2, 10, 8)
    u, w = torch.ones(10, dtype=F64), torch.ones(10, dtype=F64)
    mlp = [t.detach() for t in _mlp(2, 4, seed=0)]
    with pytest.raises(ShapeError, match="q, k and v"):
        MB.mlp_bias_attention(q, q[:, :1], q, u, w, *mlp)
    with pytest.raises(ShapeError, match="expected u"):
        MB.mlp_bias_attention(q, q, q, u[:5], w, *mlp)
    with pytest.raises(ShapeError, match="expected u"):
        MB.mlp_bias_attention(q, q, q, u, w, mlp[0], mlp[1], mlp[2][:1], mlp[3])
    with pytest.raises(ShapeError, match="float32 or float64"):
        MB.mlp_bias_attention(q.half(), q.half(), q.half(), u, w, *mlp)


def _assert_equal_to_dense(out, want, inputs, names=None):
    """Forward and the gradients of ``inputs`` equal the dense reference's."""
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    names = names or [str(i) for i in range(len(inputs))]
    for name, a, b in zip(names, _grads(out, inputs), _grads(want, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("sub", [4, 8])
def test_sub_blocks_of_rows_split_the_mlp_and_equal_the_dense_float64_reference(monkeypatch, sub):
    """Blocks of 32 queries split per sub-block of 4 or 8 rows (each with its own tables and narrower bands; the
    last block, 6 rows, in one), tiles of 24 keys, the threshold inside: forward and every gradient equal the
    dense reference, and the sub-blocks' bands are narrower than the block's."""
    B, H, L = 2, 2, 102
    q, k, v = (rnd(B, H, L, 8, seed=s + 30).requires_grad_(True) for s in range(3))
    c, t, u, w = _fire_factors(L, c=0.5, threshold=20.0)
    mlp = _mlp(H, 24, seed=7)
    plan = MB._Plan(u, w, tuple(mlp), L, F64)
    assert plan.sorted
    wide = sum(hi - lo for _, lo, hi, _ in plan.split(64, 96).bands)
    monkeypatch.setattr(MB, "SUB", sub)
    split = plan.split(64, 96)
    assert split.sub == sub and len({b[0] for b in split.bands}) > 1  # bands in several sub-blocks
    assert max(hi - lo for _, lo, hi, _ in split.bands) < wide
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=32, score_tile=24)
    _assert_equal_to_dense(out, dense_mlp_bias(q, k, v, u, w, *mlp), [q, k, v, c, t, *mlp],
                           ["q", "k", "v", "c", "threshold", "W1", "b1", "W2", "b2"])


def test_the_bisection_split_equals_the_per_distance_split():
    """Where u is non-decreasing from 0 and w positive (FIRE), each unit's states over the distances are found by
    bisection: the same bands and units on as testing every distance."""
    L = 700
    c, thr, u, w = _fire_factors(L, c=0.2, threshold=100.0)
    plan = MB._Plan(u, w, tuple(_mlp(3, 32, seed=11, spread=4.0)), L, F64)
    assert plan.sorted
    for c0 in (0, 96, 320, 640):
        c1 = min(L, c0 + 64)
        wr = plan.w64[c0:c1].view(-1, 32 if (c1 - c0) % 32 == 0 else c1 - c0)
        xlo, xhi = wr.amin(1)[:, None] * plan.u64[:c1], wr.amax(1)[:, None] * plan.u64[:c1]
        up, first, end = MB._sorted_states(plan.k64, xlo, xhi)
        on, (on2, first2, end2) = MB._on_between(up, first, end, c1), MB._distance_states(plan.k64, xlo, xhi)
        band = first < end  # (first >= end: no band)
        assert torch.equal(on, on2) and torch.equal(band, first2 < end2) and band.any() == (c0 > 0)
        assert torch.equal(first[band], first2[band]) and torch.equal(end[band], end2[band])


def test_u_not_monotone_and_w_of_both_signs_take_the_per_distance_split():
    """A u that is not monotone and a w of both signs (not FIRE's, still exact): the per-distance split, forward
    and every gradient equal the dense reference."""
    B, H, L = 1, 2, 70
    q, k, v = (rnd(B, H, L, 8, seed=s + 40).requires_grad_(True) for s in range(3))
    d = torch.arange(L, dtype=F64)
    u = (torch.sin(0.3 * d) * 2).requires_grad_(True)
    w = (torch.cos(0.05 * d) + 0.2).requires_grad_(True)
    mlp = _mlp(H, 16, seed=9)
    assert not MB._Plan(u, w, tuple(mlp), L, F64).sorted
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=32, score_tile=40)
    _assert_equal_to_dense(out, dense_mlp_bias(q, k, v, u, w, *mlp), [q, k, v, u, w, *mlp])


def test_sub_blocks_grow_with_the_keys_down_to_one_row_each(monkeypatch):
    """Sub-blocks double while a block's keys exceed 64 times their rows (fewer tables over many keys); one row
    per sub-block has no bands at all (w is one number per row). Forward and gradients equal the reference."""
    assert [MB._sub_rows(256, c1) for c1 in (256, 2048, 4096, 8192, 16384)] == [32, 32, 64, 128, 256]
    assert MB._sub_rows(200, 8192) == 200 and MB._sub_rows(16, 8192) == 16
    monkeypatch.setattr(MB, "SUB", 1)
    assert MB._sub_rows(32, 64) == 1 and MB._sub_rows(32, 100) == 2
    B, H, L = 1, 2, 100
    q, k, v = (rnd(B, H, L, 8, seed=s + 50).requires_grad_(True) for s in range(3))
    c, t, u, w = _fire_factors(L, c=0.5, threshold=10.0)
    mlp = _mlp(H, 12, seed=4)
    assert MB._Plan(u, w, tuple(mlp), L, F64).split(32, 64).bands == []
    out = MB.mlp_bias_attention(q, k, v, u, w, *mlp, block=32, score_tile=40)
    _assert_equal_to_dense(out, dense_mlp_bias(q, k, v, u, w, *mlp), [q, k, v, c, t, *mlp])
