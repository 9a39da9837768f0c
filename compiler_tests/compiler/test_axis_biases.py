"""Biases over per-axis distances (``distance.AXIS``, docs/semantics.md §3a): forward and gradients against a
naive float64 formula written here and against the reference interpreter, at lengths of several query blocks
(never a (B, H, L, L) tensor), with GQA, documents and padding, decoding with a cache (positions per axis given
or continued), the fused path without positions (text: every axis at the token index), the generated module,
and the diagnostics of misuse."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.compiler.general import attention as general_attention
from pedsl.compiler.codegen import generate
from pedsl.compiler.reference import reference_stream
from pedsl.errors import CheckError
from pedsl.lang.api import load

F64 = torch.float64
LEARNED = """scheme learned_axes "x" {
  axes h, w
  qk: none
  bias = -exp(learned(log(slopes(heads)))) * abs(distance.h) - exp(learned(log(slopes(heads)) - 1)) * abs(distance.w)
}
"""
EUCLID = """scheme euclid "x" {
  axes h, w
  qk: none
  bias = -slopes(heads) * sqrt(distance.h ** 2 + distance.w ** 2)
}
"""
SIGNED = """scheme signed "x" {
  axes t, h, w
  layout interleaved
  channels {
    row = fraction(0.5)
    col = rest
  }
  qk on row: rotate(geometric(100.0) * position.h)
  qk on col: rotate(geometric(100.0) * position.w)
  bias = 0.3 * distance.w - 0.05 * distance.h ** 2 + 0.01 * query_position * abs(distance.t)
}
"""


def write_scheme(folder, text: str):
    path = folder / (text.split()[1] + ".pe")
    path.write_text(text)
    return path


def _slopes(H: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=F64)


def grid_positions(B: int, S: int, W: int | None = None, shift=(0, 0)) -> torch.Tensor:
    """(2, B, 1 + S * W): a start token at (0, 0), then an S x W grid in raster order at (1 + r, 1 + c),
    each row of the batch shifted by ``shift * b`` (rows differ)."""
    W = W or S
    r, c = torch.meshgrid(torch.arange(S), torch.arange(W), indexing="ij")
    cells = torch.stack([r.flatten(), c.flatten()]) + 1
    one = torch.cat([torch.zeros(2, 1, dtype=torch.long), cells], 1)
    return torch.stack([one + torch.tensor(shift)[:, None] * b * (torch.arange(one.shape[1]) > 0) for b in range(B)], 1)


def _qkv(B, Hq, Hkv, L, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, L, D, generator=g, dtype=F64, requires_grad=True),
            *(torch.randn(B, Hkv, L, D, generator=g, dtype=F64, requires_grad=True) for _ in range(2)))


def naive(q, k, v, bias_of):
    """Causal softmax attention with the bias ``bias_of(i, j)`` -> (H,) entry by entry (GQA: head h reads
    key/value head h // (Hq / Hkv))."""
    B, Hq, L, D = q.shape
    r = Hq // k.shape[1]
    kk, vv = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
    s = q @ kk.transpose(-1, -2) / math.sqrt(D)
    bias = torch.zeros(B, Hq, L, L, dtype=F64)
    for b in range(B):
        for i in range(L):
            for j in range(i + 1):
                bias[b, :, i, j] = bias_of(b, i, j)
    s = (s + bias).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vv


def _manhattan(P, slopes):
    return lambda b, i, j: -slopes * float((P[:, b, i] - P[:, b, j]).abs().sum())


def test_alibi_2d_forward_and_gradients_equal_the_formula_over_several_query_blocks():
    """L = 1 + 18 x 18 = 325 > one block of 256 queries; GQA 4 -> 2; rows at different positions."""
    mod = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=4, head_dim=8).double()
    P = grid_positions(2, 18, shift=(1, 3))
    L = P.shape[-1]
    q, k, v = _qkv(2, 4, 2, L, 8)
    out = mod(q, k, v, positions=P)
    want = naive(q, k, v, _manhattan(P, _slopes(4)))
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    wgt = torch.randn_like(out)
    got = torch.autograd.grad((out * wgt).sum(), (q, k, v))
    exp = torch.autograd.grad((want * wgt).sum(), (q, k, v))
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_the_bias_is_formed_per_block_of_queries_never_over_every_pair(monkeypatch):
    """At a 64 x 64 grid (L = 4097) every evaluation of the bias covers at most one block of queries."""
    mod = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=2, head_dim=8)
    shapes = []
    real = mod.axis_bias

    def spy(b, dist, qpos):
        shapes.append(tuple(dist.shape))
        return real(b, dist, qpos)

    monkeypatch.setattr(mod, "axis_bias", spy)
    P = grid_positions(1, 64)
    q, k, v = (torch.randn(1, 2, P.shape[-1], 8) for _ in range(3))
    with torch.no_grad():
        out = mod(q, k, v, positions=P)
    assert torch.isfinite(out).all()
    assert len(shapes) == math.ceil(P.shape[-1] / general_attention.QUERY_CHUNK)
    assert max(s[1] for s in shapes) == general_attention.QUERY_CHUNK and all(s[2] == P.shape[-1] for s in shapes)


def test_learned_per_axis_slopes_forward_and_gradients_equal_the_formula_and_the_reference(tmp_path):
    mod = compile_scheme(write_scheme(tmp_path, LEARNED), num_heads=4, head_dim=8).double()
    params = dict(mod.named_parameters())
    assert len(params) == 2  # one set of slopes per axis
    with torch.no_grad():
        for p in params.values():
            p.add_(0.1 * torch.randn_like(p))
    th, tw = (params[n] for n in sorted(params))
    P = grid_positions(2, 5, 6, shift=(2, 0))
    L = P.shape[-1]
    q, k, v = _qkv(2, 4, 4, L, 8, seed=1)
    out = mod(q, k, v, positions=P)

    def bias_of(b, i, j):
        d = (P[:, b, i] - P[:, b, j]).abs().to(F64)
        return -torch.exp(th) * d[0] - torch.exp(tw) * d[1]

    want = naive(q, k, v, bias_of)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    wgt = torch.randn_like(out)
    got = torch.autograd.grad((out * wgt).sum(), (q, k, v, th, tw))
    exp = torch.autograd.grad((want * wgt).sum(), (q, k, v, th, tw))
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert got[3].abs().sum() > 0 and got[4].abs().sum() > 0
    ref = reference_stream(mod, q, k, v, x=None, tokens=None, positions=P.max(0).values,
                           docs=torch.zeros(2, L, dtype=torch.long), valid=torch.ones(2, L, dtype=torch.bool),
                           step_valid=torch.ones(2, L, dtype=torch.bool), mask4=None, axes_pos=P.permute(1, 2, 0))
    torch.testing.assert_close(ref, want, rtol=1e-10, atol=1e-12)
    exp_r = torch.autograd.grad((ref * wgt).sum(), (th, tw))
    for a, b in zip(got[3:], exp_r):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_euclidean_and_signed_terms_with_the_query_position_equal_the_formula(tmp_path):
    """CROMA's Euclidean 2D-ALiBi; and a term of signed per-axis distances, a square and query_position
    (3 axes, a rotation beside it) against the formula and the reference backend."""
    mod = compile_scheme(write_scheme(tmp_path, EUCLID), num_heads=2, head_dim=8).double()
    P = grid_positions(1, 4, 5)
    q, k, v = _qkv(1, 2, 2, P.shape[-1], 8, seed=2)
    slopes = _slopes(2)
    want = naive(q, k, v, lambda b, i, j: -slopes * float((P[:, b, i] - P[:, b, j]).to(F64).norm()))
    torch.testing.assert_close(mod(q, k, v, positions=P), want, rtol=1e-10, atol=1e-12)

    fast = compile_scheme(write_scheme(tmp_path, SIGNED), num_heads=2, head_dim=8).double()
    ref = compile_scheme(write_scheme(tmp_path, SIGNED), num_heads=2, head_dim=8, backend="reference").double()
    T = torch.tensor([[0, 1, 2, 3, 3, 3, 3, 3, 3, 7, 8]])
    H = torch.tensor([[0, 1, 2, 3, 3, 3, 4, 4, 4, 7, 8]])
    W = torch.tensor([[0, 1, 2, 3, 4, 5, 3, 4, 5, 7, 8]])
    P3 = torch.stack([T, H, W])
    q, k, v = _qkv(1, 2, 2, 11, 8, seed=3)
    got = fast(q, k, v, positions=P3)
    torch.testing.assert_close(got, ref(q, k, v, positions=P3), rtol=1e-10, atol=1e-12)
    bias = lambda b, i, j: torch.full((2,), 0.3 * float(W[b, i] - W[b, j]) - 0.05 * float(H[b, i] - H[b, j]) ** 2  # noqa: E731
                                      + 0.01 * float(P3[:, b, i].max()) * float(abs(T[b, i] - T[b, j])), dtype=F64)
    q2, k2 = (_axial_rotation(x, H[0], W[0]) for x in (q, k))
    torch.testing.assert_close(got, naive(q2, k2, v, bias), rtol=1e-10, atol=1e-12)


def _axial_rotation(x, rows, cols):
    """SIGNED's rotation written out: channels 0-3 turn by the row, 4-7 by the column, pairs (2k, 2k + 1) of
    each group at the frequencies 100^(-2k / 4)."""
    out = x.clone()
    for first, pos in ((0, rows), (4, cols)):
        for k in range(2):
            ang = pos.to(F64) * 100.0 ** (-2 * k / 4)
            a, b = first + 2 * k, first + 2 * k + 1
            out[..., a] = x[..., a] * ang.cos() - x[..., b] * ang.sin()
            out[..., b] = x[..., b] * ang.cos() + x[..., a] * ang.sin()
    return out


def test_decoding_with_a_cache_equals_one_forward():
    """Prefill part of a grid with its (2, B, L) positions, decode the rest a token (then a chunk) at a time with
    their positions; then text without positions continues every axis at the largest position + 1."""
    mod = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=4, head_dim=8).double()
    P = grid_positions(2, 5, shift=(0, 1))
    L, extra = P.shape[-1], 3
    nxt = P.max(0).values.max(-1).values  # (B,)
    full_pos = torch.cat([P, (nxt[None, :, None] + 1 + torch.arange(extra)).expand(2, 2, extra)], -1)
    q, k, v = (t.detach() for t in _qkv(2, 4, 2, L + extra, 8, seed=4))
    full = mod(q, k, v, positions=full_pos)
    cache = mod.new_cache(2)
    cuts = [0, 12, 13, 14, 20, L]
    outs = [mod(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions=P[..., a:b], cache=cache)
            for a, b in zip(cuts, cuts[1:])]
    outs += [mod(q[:, :, L:L + 1], k[:, :, L:L + 1], v[:, :, L:L + 1], cache=cache),
             mod(q[:, :, L + 1:], k[:, :, L + 1:], v[:, :, L + 1:], cache=cache)]
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-12)
    ref = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=4, head_dim=8, backend="reference").double()
    cache = ref.new_cache(2)
    outs = [ref(q[:, :, :L], k[:, :, :L], v[:, :, :L], positions=P, cache=cache),
            ref(q[:, :, L:], k[:, :, L:], v[:, :, L:], cache=cache)]
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-12)


def test_documents_and_padding_with_axis_positions_equal_each_row_alone():
    """Two documents packed in one row, and a left-padded row: each equals its documents run alone."""
    mod = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=2, head_dim=8).double()
    A, Bp = grid_positions(1, 3), grid_positions(1, 2, 4)
    La, Lb = A.shape[-1], Bp.shape[-1]
    q, k, v = (t.detach() for t in _qkv(1, 2, 2, La + Lb, 8, seed=5))
    packed = mod(q, k, v, positions=torch.cat([A, Bp], -1),
                 document_ids=torch.tensor([[0] * La + [1] * Lb]))
    alone = torch.cat([mod(q[:, :, :La], k[:, :, :La], v[:, :, :La], positions=A),
                       mod(q[:, :, La:], k[:, :, La:], v[:, :, La:], positions=Bp)], 2)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-12)
    pad = 4
    padded_pos = torch.cat([torch.zeros(2, 1, pad, dtype=torch.long), A], -1)
    mask = torch.tensor([[False] * pad + [True] * La])
    qp, kp, vp = (torch.cat([torch.randn(1, 2, pad, 8, dtype=F64), t[:, :, :La]], 2) for t in (q, k, v))
    out = mod(qp, kp, vp, positions=padded_pos, attn_mask=mask)
    torch.testing.assert_close(out[:, :, pad:], alone[:, :, :La], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "masked", "reference"])
def test_without_positions_every_axis_reads_the_token_index(backend):
    """Text: d_h = d_w = i - j, so alibi_2d is ALiBi with twice the slopes, on every backend's own path."""
    mod = compile_scheme(SCHEMES / "alibi_2d.pe", num_heads=4, head_dim=8, backend=backend).double()
    q, k, v = (t.detach() for t in _qkv(1, 4, 4, 9, 8, seed=6))
    want = naive(q, k, v, lambda b, i, j: -2 * _slopes(4) * (i - j))
    torch.testing.assert_close(mod(q, k, v), want, rtol=1e-10, atol=1e-12)


def test_the_generated_module_equals_the_compiled_one(tmp_path):
    path = write_scheme(tmp_path, LEARNED)
    mod = compile_scheme(path, num_heads=4, head_dim=8).double()
    with torch.no_grad():
        for p in mod.parameters():
            p.add_(0.1 * torch.randn_like(p))
    import importlib.util

    file = tmp_path / "gen_learned_axes.py"
    file.write_text(generate(mod.scheme, mod.plan))
    spec = importlib.util.spec_from_file_location("gen_learned_axes", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module().double()
    gen.load_state_dict(mod.state_dict())
    P = grid_positions(2, 17, shift=(1, 1))
    q, k, v = (t.detach() for t in _qkv(2, 4, 2, P.shape[-1], 8, seed=7))
    torch.testing.assert_close(gen(q, k, v, positions=P), mod(q, k, v, positions=P), rtol=1e-10, atol=1e-12)
    cache_g, cache_m = gen.new_cache(2), mod.new_cache(2)
    for a, b in ((0, 40), (40, 41), (41, P.shape[-1])):
        torch.testing.assert_close(gen(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions=P[..., a:b], cache=cache_g),
                                   mod(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions=P[..., a:b], cache=cache_m),
                                   rtol=1e-10, atol=1e-12)


def test_the_plan_says_how_the_bias_is_carried():
    mod = compile_scheme(SCHEMES / "alibi_2d.pe")
    (b,) = mod.plan.biases
    assert (b.kind, b.axes, b.slope, b.coordinate) == ("axis-distance", ("h", "w"), None, False)
    assert "per block of queries" in b.why
    assert load(SCHEMES / "alibi_2d.pe").biases[0].axes == ("h", "w")


@pytest.mark.parametrize("text, code, words", [
    ("axes h, w\n  bias = -slopes(heads) * abs(distance.x)", "E230", "does not declare"),
    ("bias = -slopes(heads) * abs(distance.h)", "E230", "declares no axes"),
    ("axes h, w\n  bias = -slopes(heads) * distance", "E231", "say which axis"),
    ("axes h, w\n  qk: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2))\n"
     "  bias = -slopes(heads) * abs(distance.h)", "E204", "householder"),
    ("axes h, w\n  bias = -slopes(heads) * abs(position.h)", "E204", "whose"),
])
def test_misuse_is_a_positioned_diagnostic(tmp_path, text, code, words):
    path = write_scheme(tmp_path, "scheme s {\n  " + text + "\n}\n")
    with pytest.raises(CheckError) as info:
        load(path)
    diag = info.value.diagnostics[0]
    assert diag.code == code and words in diag.message and diag.line >= 2
