"""Remapped positions (docs/semantics.md §2d): ReRoPE, Leaky ReRoPE, Self-Extend and Dual Chunk Attention against
each paper's formula
transcribed as a naive float64 loop over (i, j) - the relative position the paper gives the pair, read by a
RoPE score written from the rotation's definition - forward and backward, in float64 and float32; prefill plus
decoding equals one full forward; the reference interpreter agrees; a window composes."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import SCHEMES, fast_and_reference, float32_bound, output_and_grads, rnd
from pedsl.compiler import compile_scheme

F64 = torch.float64
H, D, L = 2, 8, 24


def rerope(i: int, j: int, w: int, **_) -> float:
    """ReRoPE (Su 2023, kexue.fm/archives/9708): the relative position min(i - j, w)."""
    return float(min(i - j, w))


def leaky(i: int, j: int, w: int, k: float, **_) -> float:
    """Leaky ReRoPE (Su 2023): i - j below w, else w + (i - j - w) / k."""
    d = i - j
    return float(d) if d < w else w + (d - w) / k


def self_extend(i: int, j: int, w: int, G: int, **_) -> float:
    """Self-Extend (Jin et al. 2024, arXiv 2401.01325, §3 and datamllab/LongLM): i - j within the neighbour
    window w, else the grouped positions floor(i / G) - floor(j / G) + w - floor(w / G)."""
    d = i - j
    return float(d) if d < w else float(i // G - j // G + w - w // G)


def naive_attention(q, k, v, rel, base: float = 10000.0):
    """softmax_j(<q_i, R(rel(i, j)) k_j> / sqrt(D)) v_j over j <= i, pair (m, m + D/2) turned by
    w_m * rel with w_m = base^(-2m / D) (halves layout), entry by entry."""
    B, Hh, n, Dd = q.shape
    P = Dd // 2
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(Hh):
            for i in range(n):
                scores = []
                for j in range(i + 1):
                    r = rel(i, j)
                    s = q.new_zeros(())
                    for m in range(P):
                        a, c = m, m + P
                        t = base ** (-2 * m / Dd) * r
                        # <R(t_i) q, R(t_j) k> = (qa ka + qc kc) cos(t_i - t_j) + (qa kc - qc ka) sin(t_i - t_j)
                        s = s + (q[b, h, i, a] * k[b, h, j, a] + q[b, h, i, c] * k[b, h, j, c]) * math.cos(t) \
                            + (q[b, h, i, a] * k[b, h, j, c] - q[b, h, i, c] * k[b, h, j, a]) * math.sin(t)
                    scores.append(s / math.sqrt(Dd))
                wts = torch.softmax(torch.stack(scores), 0)
                out[b, h, i] = (wts[:, None] * v[b, h, : i + 1]).sum(0)
    return out


def dca(i: int, j: int, c: int, size: int, **_) -> float:
    """Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama's rotary tables): keys at
    j mod c; the query at i mod c in its own chunk, at min(i mod c + c, size) over the previous chunk and at
    min(2c - 1, size) over every earlier one (c = chunk_size - local_window, size = chunk_size)."""
    gap = i // c - j // c
    q = i % c if gap == 0 else min(i % c + c, size) if gap == 1 else min(2 * c - 1, size)
    return float(q - j % c)


CASES = {
    "dca": ("chunk_size = 8\nlocal_window = 3", lambda i, j: dca(i, j, c=5, size=8)),
    "rerope": ("reach = 5", lambda i, j: rerope(i, j, w=5)),
    "leaky_rerope": ("reach = 5\nleak = 3.0", lambda i, j: leaky(i, j, w=5, k=3.0)),
    "self_extend": ("neighbours = 6\ngroup = 4", lambda i, j: self_extend(i, j, w=6, G=4)),
}


def _module(name: str, dtype=F64):
    params = dict(line.split(" = ") for line in CASES[name][0].split("\n"))
    src = (SCHEMES / f"{name}.pe").read_text().replace('import "rope.pe"', f'import "{SCHEMES / "rope.pe"}"')
    mod = compile_scheme(src, num_heads=H, head_dim=D, params={k: float(v) if "." in v else int(v)
                                                              for k, v in params.items()})
    return mod.to(dtype)


def _qkv(dtype, seed=0):
    return [rnd(1, H, L, D, seed=seed + s, dtype=dtype).requires_grad_(True) for s in range(3)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_match_the_papers_formula(name):
    mod = _module(name)
    q, k, v = _qkv(F64)
    out, grads = output_and_grads(mod, q, k, v)
    qn, kn, vn = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref = naive_attention(qn, kn, vn, CASES[name][1])
    weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    ref_grads = torch.autograd.grad((ref * weight).sum(), [qn, kn, vn])
    torch.testing.assert_close(out, ref.detach(), rtol=0, atol=1e-12)
    for g, r in zip(grads[:3], ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-11)
    # float32: within the rounding bound of L keys and D channels at the float64 result's magnitude
    mod32 = _module(name, torch.float32)
    o32 = mod32(*(t.detach().float() for t in (q, k, v)))
    assert (o32.double() - ref.detach()).abs().max() <= float32_bound(L + D, ref.detach())


def test_the_far_regime_matters():
    """Past the window the three methods differ from RoPE and from each other (a test that could fail)."""
    q, k, v = (t.detach() for t in _qkv(F64))
    rope = compile_scheme((SCHEMES / "rope.pe").read_text(), num_heads=H, head_dim=D).double()(q, k, v)
    outs = [_module(n)(q, k, v) for n in sorted(CASES)]
    for o in outs:
        torch.testing.assert_close(o[:, :, :5], rope[:, :, :5], rtol=0, atol=1e-12)  # every key is near
        assert (o - rope).abs().max() > 1e-3
    assert (outs[0] - outs[1]).abs().max() > 1e-3 and (outs[1] - outs[2]).abs().max() > 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_prefill_then_decoding_equals_one_forward(name):
    mod = _module(name)
    q, k, v = (t.detach() for t in _qkv(F64, seed=4))
    full = mod(q, k, v)
    cache = mod.new_cache(1)
    parts = [mod(q[:, :, :9], k[:, :, :9], v[:, :, :9], cache=cache)]
    parts.append(mod(q[:, :, 9:13], k[:, :, 9:13], v[:, :, 9:13], cache=cache))  # a chunk
    for t in range(13, L):
        parts.append(mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=0, atol=1e-12)


REFERENCE_CASES = {"self_extend": "param neighbours: int = 3\nparam group: int = 2",
                   "dca": "param chunk_size: int = 7\nparam local_window: int = 2"}


@pytest.mark.parametrize("extra", ["", "window = 7", "sink = logit", "softcap = 2.0"])
@pytest.mark.parametrize("name", sorted(REFERENCE_CASES))
def test_the_general_path_agrees_with_the_reference(name, extra):
    """Gapped positions: DCA's chunks are of positions (p // c), not of token indices."""
    fast, ref = fast_and_reference(name, f"{REFERENCE_CASES[name]}\n{extra}", H, D)
    assert fast.plan.kernels == ()  # no fast kernel declares remapped positions
    q, k, v = _qkv(F64, seed=7)
    pos = torch.tensor([[0, 1, 2, 3, 5, 8, 9, 10, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]])
    o1, g1 = output_and_grads(fast, q, k, v, positions=pos)
    o2, g2 = output_and_grads(ref, q, k, v, positions=pos)
    torch.testing.assert_close(o1, o2, rtol=0, atol=1e-12)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("name, rel", [("dca", lambda i, j: dca(i, j, c=88, size=96)),
                                       ("rerope", lambda i, j: rerope(i, j, w=32)),
                                       ("leaky_rerope", lambda i, j: leaky(i, j, w=32, k=21.0)),
                                       ("self_extend", lambda i, j: self_extend(i, j, w=32, G=21))])
def test_diff_numeric_transport_curve_reads_the_regimes(name, rel):
    """`pedsl diff --numeric`'s transport curve of a remapped scheme: (2 / D) sum_k cos(w_k rel(i, i - d)),
    averaged over the queries i >= d, with each paper's relative position (16x factors, 128 trained)."""
    from pedsl.diffing.numeric import curves
    from pedsl.lang.api import load

    s = load(SCHEMES / f"{name}.pe", params={"factor": 16} if name not in ("rerope", "dca") else None)
    lmax, Dh = 60, s.head_dim
    ws = [10000.0 ** (-2 * m / Dh) for m in range(Dh // 2)]
    want = [sum(math.cos(w * rel(i, i - d)) for w in ws for i in range(d, lmax + 1)) * 2 / Dh / (lmax + 1 - d)
            for d in range(lmax + 1)]
    got = curves(s, lmax=lmax).transport
    assert got == pytest.approx(want, abs=1e-9)
