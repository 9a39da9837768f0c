"""pedsl.ops.rotary against HF-style / complex-number rotations and the naive oracle."""

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import rnd
from pedsl.errors import ShapeError
from pedsl.ops.reference import reference_attention, rotation_transport
from pedsl.ops.rotary import (
    apply_rotary,
    apply_rotary_channels,
    geometric_freqs,
    rotary_cos_sin,
    rotate_by_angles,
)

F64 = torch.float64
# (layout, channels, D): full head, contiguous prefix, halves quarters, an arbitrary gathered group
GROUPS = [
    ("halves", None, 8),
    ("interleaved", None, 8),
    ("halves", slice(0, 8), 16),
    ("interleaved", slice(0, 8), 16),
    ("halves", list(range(0, 4)) + list(range(8, 12)), 16),
    ("interleaved", [0, 1, 4, 5, 8, 9, 12, 13], 16),
    ("halves", [3, 1, 12, 6], 16),
    ("interleaved", [15, 2, 7, 9], 16),
]


def chans(channels, D):
    if channels is None:
        return list(range(D))
    return list(range(D)[channels]) if isinstance(channels, slice) else list(channels)


def n_pairs(channels, D):
    return len(chans(channels, D)) // 2


def test_geometric_freqs_match_hf_inv_freq():
    w = geometric_freqs(32)
    assert w.dtype == F64 and w.shape == (32,)
    hf = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=F64) / 64))
    torch.testing.assert_close(w, hf)
    torch.testing.assert_close(geometric_freqs(4, base=500.0, rot_dim=16), 500.0 ** (-torch.arange(0, 8, 2, dtype=F64) / 16))


def test_halves_matches_hf_rotate_half():
    x = rnd(2, 3, 5, 8)
    cos, sin = rotary_cos_sin(geometric_freqs(4), torch.arange(5), F64)
    cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    rotate_half = torch.cat([-x[..., 4:], x[..., :4]], -1)
    torch.testing.assert_close(apply_rotary(x, cos, sin, "halves"), x * cos2 + rotate_half * sin2)


def test_interleaved_matches_complex_multiplication():
    x = rnd(2, 3, 5, 8)
    theta = rnd(5, 4, seed=3)
    z = torch.view_as_complex(x.reshape(2, 3, 5, 4, 2).contiguous()) * torch.polar(torch.ones_like(theta), theta)
    want = torch.view_as_real(z).flatten(-2)
    torch.testing.assert_close(apply_rotary(x, theta.cos(), theta.sin(), "interleaved"), want)


@pytest.mark.parametrize("layout,channels,D", GROUPS)
def test_channel_groups_leave_other_channels_and_norm_unchanged(layout, channels, D):
    x = rnd(2, 3, 5, D)
    P = n_pairs(channels, D)
    theta = rnd(5, P, seed=4)
    y = apply_rotary_channels(x, theta.cos(), theta.sin(), channels, layout)
    rest = sorted(set(range(D)) - set(chans(channels, D)))
    torch.testing.assert_close(y[..., rest], x[..., rest])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


# every group at L = 17; the edge lengths 1 and 5 on a halves and an interleaved group
CASES = [(17, *g) for g in GROUPS] + [(L, *g) for L in (1, 5) for g in (GROUPS[2], GROUPS[7])]


@pytest.mark.parametrize("L,layout,channels,D", CASES)
def test_rope_attention_matches_reference(L, layout, channels, D):
    B, H = 2, 3
    q, k, v = (rnd(B, H, L, D, seed=s).requires_grad_() for s in (1, 2, 3))
    P = n_pairs(channels, D)
    freqs = geometric_freqs(P, base=100.0)
    pos = torch.arange(L) * 0.75  # a non-identity position map (PI with s = 4/3)
    cos, sin = rotary_cos_sin(freqs, pos, F64)
    out = F.scaled_dot_product_attention(
        apply_rotary_channels(q, cos, sin, channels, layout),
        apply_rotary_channels(k, cos, sin, channels, layout), v, is_causal=True)
    phases = pos.to(F64)[:, None] * freqs[None, :]
    T = rotation_transport(phases, layout, channels, D)
    ref = reference_attention(q, k, v, transport=T)
    torch.testing.assert_close(out, ref)
    w = rnd(B, H, L, D, seed=9)
    g_fast = torch.autograd.grad((out * w).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("layout,channels,D", [GROUPS[0], GROUPS[3], GROUPS[4], GROUPS[6]])
def test_rotate_by_angles_gradcheck(layout, channels, D):
    x = rnd(1, 2, 3, D, seed=1).requires_grad_()
    ang = rnd(1, 2, 3, n_pairs(channels, D), seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: rotate_by_angles(a, b, layout, channels), (x, ang))


def test_rotary_tables_stay_accurate_at_long_context():
    L, P = 65536, 32
    freqs = geometric_freqs(P)
    cos, sin = rotary_cos_sin(freqs, torch.arange(L), torch.float32)
    exact = torch.arange(L, dtype=F64)[:, None] * freqs
    assert (cos.double() - exact.cos()).abs().max() < 1e-7
    assert (sin.double() - exact.sin()).abs().max() < 1e-7
    naive = torch.arange(L, dtype=torch.float32)[:, None] * freqs.float()  # the float32 way
    assert (naive.cos().double() - exact.cos()).abs().max() > 1e-4
    x = rnd(1, 1, L, 2 * P, dtype=torch.float32)
    y = apply_rotary(x, cos, sin)
    rel = ((y.double().norm(dim=-1) - x.double().norm(dim=-1)).abs() / x.double().norm(dim=-1)).max()
    assert rel < 1e-6


def test_bad_layout_and_group_are_shape_errors():
    x = rnd(1, 1, 2, 8)
    c = torch.ones(2, 4, dtype=F64)
    with pytest.raises(ShapeError):
        apply_rotary(x, c, c, "zigzag")
    with pytest.raises(ShapeError):
        apply_rotary_channels(x, c[:, :1], c[:, :1], [0, 1, 2], "halves")
    with pytest.raises(ShapeError):
        apply_rotary_channels(x, c[:, :1], c[:, :1], [0, 1, 2, 3], "halves")


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_apply_rotary_gradcheck_constant_and_learned_tables(layout):
    x = rnd(2, 1, 3, 8, seed=1).requires_grad_()
    c, s = rnd(3, 4, seed=2), rnd(3, 4, seed=3)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, c, s, layout), (x,))  # custom Function
    c.requires_grad_(), s.requires_grad_()
    assert torch.autograd.gradcheck(lambda t, a, b: apply_rotary(t, a, b, layout), (x, c, s))  # plain autograd
