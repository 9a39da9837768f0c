"""The analysis instruments (pedsl.study.instruments) against cases with known answers,
directly and through a compiled scheme module (probs / transform_qkv / rotary_groups)."""

from __future__ import annotations

import math

import pytest
import torch

from pedsl.formulas import channel_pairs
from pedsl.study import instruments as ins
from compiler_helpers import SCHEMES



def uniform_attention(B: int, H: int, L: int) -> torch.Tensor:
    i = torch.arange(L)
    a = (i[None, :] <= i[:, None]).double() / (i[:, None] + 1).double()  # a(i, j) = 1/(i + 1), j <= i
    return a.expand(B, H, L, L).clone()


@pytest.mark.parametrize("L,W", [(64, 8), (100, 32), (32, 40)])
def test_far_mass_of_uniform_attention(L, W):
    a = uniform_attention(2, 3, L)
    per_query = ins.far_mass_per_query(a, W)
    # the last query: keys j with L - 1 - j > W, i.e. j < L - 1 - W: (L - 1 - W) / L of its mass
    assert per_query[0, 0, -1].item() == pytest.approx(max(0, L - 1 - W) / L)
    # the mean over queries, by a naive double loop
    naive = sum(sum(1 / (i + 1) for j in range(i + 1) if i - j > W) for i in range(L)) / L
    fm = ins.far_mass(a, W)
    assert fm.shape == (3,)
    assert torch.allclose(fm, torch.full((3,), naive, dtype=torch.float64))
    assert ins.uniform_far_mass(L, W) == pytest.approx(naive)


def test_far_mass_grows_toward_one_for_uniform_attention():
    vals = [ins.uniform_far_mass(L, 32) for L in (128, 512, 2048, 8192)]
    assert all(b > a for a, b in zip(vals, vals[1:])) and vals[-1] > 0.97


def test_sink_mass():
    L = 16
    a = torch.zeros(1, 2, L, L)
    a[..., 0] = 1.0  # every query attends only to token 0
    assert torch.allclose(ins.sink_mass(a), torch.ones(2, dtype=torch.float64))
    u = uniform_attention(1, 1, L)
    assert ins.sink_mass(u).item() == pytest.approx(sum(1 / (i + 1) for i in range(L)) / L)
    assert ins.far_mass(a, 4).tolist() == pytest.approx([sum(1 for i in range(L) if i > 4) / L] * 2)


def test_stable_rank_of_rank_one_and_orthogonal_matrices():
    u = torch.randn(2, 3, 50, 1, dtype=torch.float64)
    v = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    g = ins.geometry(u * v)  # rank one: (B, H, L, D)
    assert g["stable_rank"] == pytest.approx([1.0] * 3)
    sigma = torch.linalg.matrix_norm(u * v, ord=2).mean(0)
    assert g["sigma1"] == pytest.approx(sigma.tolist())
    eye = torch.eye(8, dtype=torch.float64).repeat(4, 1).expand(1, 2, 32, 8)  # orthogonal columns, equal norms
    assert ins.geometry(eye)["stable_rank"] == pytest.approx([8.0, 8.0])


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_single_active_pair_gets_all_frequency_energy(layout):
    D, P, k0 = 16, 8, 5
    pairs = channel_pairs(list(range(D)), layout)
    assert len(pairs) == P
    assert pairs[1] == ((1, 9) if layout == "halves" else (2, 3))
    q = torch.zeros(2, 3, 20, D)
    k = torch.zeros(2, 3, 20, D)
    c1, c2 = pairs[k0]
    q[..., c1], k[..., c2] = torch.randn(2, 3, 20), torch.randn(2, 3, 20)
    e = ins.frequency_energy(q, k, pairs)
    expect = torch.zeros(3, P, dtype=torch.float64)
    expect[:, k0] = 1
    assert torch.allclose(e, expect)
    freqs = [10000 ** (-k / P) for k in range(P)]
    assert torch.allclose(ins.log_mean_frequency(e, freqs), torch.full((3,), math.log(freqs[k0]), dtype=torch.float64))


def test_frequency_energy_matches_a_naive_causal_mean():
    q, k = torch.randn(1, 2, 7, 4, dtype=torch.float64), torch.randn(1, 2, 7, 4, dtype=torch.float64)
    pairs = [(0, 2), (1, 3)]
    raw = torch.zeros(2, 2, dtype=torch.float64)
    for h in range(2):
        for p, (a, b) in enumerate(pairs):
            vals = [(q[0, h, i, a] ** 2 + q[0, h, i, b] ** 2) * (k[0, h, j, a] ** 2 + k[0, h, j, b] ** 2)
                    for i in range(7) for j in range(i + 1)]
            raw[h, p] = sum(vals) / len(vals)
    assert torch.allclose(ins.frequency_energy(q, k, pairs), raw / raw.sum(-1, keepdim=True))


def test_score_decoherence_bins_and_moments():
    L = 20
    i = torch.arange(L)
    s = -(i[:, None] - i[None, :]).double()  # score = -distance
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf")).expand(2, 1, L, L)
    d = ins.score_decoherence(s)
    assert d["bins"] == [[0, 0], [1, 1], [2, 3], [4, 7], [8, 15], [16, 19]]
    for b, (lo, hi) in enumerate(d["bins"]):
        dist = [x for x in range(lo, hi + 1) for _ in range(L - x)]  # pairs at each distance
        mean = -sum(dist) / len(dist)
        std = math.sqrt(sum((-x - mean) ** 2 for x in dist) / len(dist))
        assert d["mean"][0][b] == pytest.approx(mean)
        assert d["std"][0][b] == pytest.approx(std, abs=1e-9)
        assert d["count"][b] == len(dist)


def test_instruments_through_a_compiled_module():
    from pedsl.compiler import compile_scheme

    mod = compile_scheme(SCHEMES / "rope.pe", head_dim=16, num_heads=2, requires_grad=False)
    L = 48
    zeros = torch.zeros(1, 2, L, 16)
    a = mod.probs(zeros, zeros)  # no signal in q, k: uniform causal attention
    assert torch.allclose(ins.far_mass(a, 8), torch.full((2,), ins.uniform_far_mass(L, 8), dtype=torch.float64),
                          atol=1e-6)
    groups = mod.rotary_groups()
    assert len(groups) == 1 and len(groups[0]["freqs"]) == 8
    pairs = channel_pairs(groups[0]["channels"], groups[0]["layout"])
    q = torch.zeros(1, 2, L, 16)
    k = torch.zeros(1, 2, L, 16)
    q[..., pairs[3][0]] = 1.0
    k[..., pairs[3][1]] = 1.0
    e = ins.frequency_energy(q, k, pairs)
    assert e[:, 3].tolist() == pytest.approx([1.0, 1.0])
    _, kt, _, _ = mod.transform_qkv(q, k, k)  # rotated keys stay in pair 3's plane: rank <= 2
    assert ins.geometry(kt)["stable_rank"][0] <= 2.0 + 1e-6
