"""video_rope (VideoRoPE, Wei et al. 2025) against a naive float64 transcription of the official code: its
positions (``get_t_scale_rope_index``: diagonal layout, temporal spacing delta) and its rotation
(``apply_m_modify_multimodal_rotary_pos_emb``: rotate_half pairs k of one geometric grid, the fastest 2 S
alternating h and w, the slowest reading t), attention forward and gradients; the scheme's channels are a
fixed permutation of the official ones."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.data.grids import video_positions
from pedsl.errors import DataError
from pedsl.lang.api import load
from pedsl.lang.frequencies import rotary_frequencies

F64 = torch.float64


def official_positions(frames, rows, cols, spacing, text_before, text_after):
    """get_t_scale_rope_index for one row [text, video, text], token by token."""
    out = [[p, p, p] for p in range(text_before)]
    for f in range(frames):
        for r in range(rows):
            for c in range(cols):
                t = f * spacing + text_before
                out.append([t, r - (rows - 1) // 2 + t, c - (cols - 1) // 2 + t])
    start = max(p[0] for p in out) + 1
    out += [[start + i] * 3 for i in range(text_after)]
    return torch.tensor(out).T


def official_rotation(x, pos, base, space_pairs):
    """x (B, H, L, D) rotated as the official code: pair k = channels (k, k + D/2) turns by base^(-2k/D) times
    position h (even k < 2 S), w (odd k < 2 S) or t (k >= 2 S); pos (3, L)."""
    D = x.shape[-1]
    out = x.clone()
    for k in range(D // 2):
        axis = (1 if k % 2 == 0 else 2) if k < 2 * space_pairs else 0
        ang = pos[axis].to(F64) * base ** (-2.0 * k / D)
        a, b = x[..., k], x[..., k + D // 2]
        out[..., k] = a * ang.cos() - b * ang.sin()
        out[..., k + D // 2] = b * ang.cos() + a * ang.sin()
    return out


def official_attention(q, k, v, pos, base, space_pairs):
    D, L = q.shape[-1], q.shape[2]
    qr, kr = official_rotation(q, pos, base, space_pairs), official_rotation(k, pos, base, space_pairs)
    s = (qr @ kr.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def scheme_channels(D: int, S: int) -> list[int]:
    """For each channel of video_rope (row pairs (j, j + S), column pairs (2S + j, 3S + j), time pairs
    (4S + j, 4S + T + j), halves inside each group) the official channel it carries."""
    T = D // 2 - 2 * S
    perm = [0] * D
    for j in range(S):
        perm[j], perm[j + S] = 2 * j, 2 * j + D // 2
        perm[2 * S + j], perm[3 * S + j] = 2 * j + 1, 2 * j + 1 + D // 2
    for j in range(T):
        perm[4 * S + j], perm[4 * S + T + j] = 2 * S + j, 2 * S + j + D // 2
    assert sorted(perm) == list(range(D))
    return perm


@pytest.mark.parametrize("spacing, before, after", [(2, 3, 2), (1, 0, 3), (3, 2, 0)])
def test_video_positions_are_the_official_layout(spacing, before, after):
    got = video_positions(3, 4, 5, spacing=spacing, text_before=before, text_after=after)
    torch.testing.assert_close(got, official_positions(3, 4, 5, spacing, before, after), rtol=0, atol=0)


@pytest.mark.parametrize("kw", [dict(spacing=0), dict(spacing=1.5), dict(text_before=-1)])
def test_video_positions_refuse_what_is_no_layout(kw):
    with pytest.raises(DataError, match="video_positions"):
        video_positions(2, 2, 2, **kw)


@pytest.mark.parametrize("head_dim, heads", [(32, 2), (64, 1)])
def test_attention_and_gradients_equal_the_official_formula(head_dim, heads):
    """Text, a 3-frame 3 x 4 video at delta = 2 (diagonal layout), text: the scheme on permuted q and k equals
    the official rotation on the official channels, forward and gradients, float64."""
    mod = compile_scheme(SCHEMES / "video_rope.pe", num_heads=heads, head_dim=head_dim).double()
    S = mod.scheme.params["space_pairs"]
    assert S == head_dim * 3 // 16
    pos = video_positions(3, 3, 4, spacing=2, text_before=2, text_after=3)
    L = pos.shape[-1]
    g = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn(1, heads, L, head_dim, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    perm = scheme_channels(head_dim, S)
    ours = mod(q[..., perm], k[..., perm], v, positions=pos[:, None])
    want = official_attention(q, k, v, pos, 1e6, S)
    torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((ours * w).sum(), (q, k, v)), torch.autograd.grad((want * w).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_time_takes_the_lowest_frequencies_of_one_grid_at_qwen_size():
    """At head_dim 128 (Qwen2-VL's mrope_section [16, 24, 24]): 24 row and 24 column pairs on the 48 fastest
    frequencies of base 1e6 (even and odd k), the 16 slowest on t."""
    s = load(SCHEMES / "video_rope.pe", head_dim=128)
    f = rotary_frequencies(s)
    grid = [1e6 ** (-2 * k / 128) for k in range(64)]
    assert f["row"] == pytest.approx(grid[0:48:2], rel=1e-12)
    assert f["col"] == pytest.approx(grid[1:48:2], rel=1e-12)
    assert f["time"] == pytest.approx(grid[48:], rel=1e-12)
    assert max(f["time"]) < min(f["row"] + f["col"])
