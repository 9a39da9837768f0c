"""The C++ causal kernel with biases in its rows (pedsl/ops/band_kernel.cpp, ``causal_bias_attention``):
forward and every gradient (q, k, v, the float64 key term, the distance table, the sink logits) against a naive
float64 softmax at L = 1, 2, around the block of 64, with grouped key/value heads and broadcast biases, a soft
cap, a sink and a sliding window; float32 within the arithmetic bound; ALiBi and FoX dispatched to it by their plans, and the separable path when
the kernels are off; T5's table likewise, with the Toeplitz path when they are off."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, band_kernel_or_skip, fast_and_reference, float32_bound, rnd
from pedsl.ops import band_kernel as BK


def naive(q, k, v, g, t, sink=None, cap=None, window=None):
    """softmax_{i - window < j <= i}(cap tanh((q_i k_j / sqrt(D) + g_j - g_i + t[i - j]) / cap)) v_j over the whole
    (L, L) matrix, with one more column ``sink[b, h, i]`` of value zero in the softmax."""
    B, Hq, L, D = q.shape
    k, v = (x.repeat_interleave(Hq // k.shape[1], 1) for x in (k, v))
    i = torch.arange(L)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    if g is not None:
        s = s + g[..., None, :] - g[..., :, None]
    if t is not None:
        s = s + t[:, (i[:, None] - i[None, :]).clamp(min=0)]
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    hidden = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= (window or L))
    s = s.masked_fill(hidden, float("-inf")).expand(B, Hq, L, L)
    if sink is None:
        return s.softmax(-1) @ v
    return torch.cat([s, sink.expand(B, Hq, L)[..., None]], -1).softmax(-1)[..., :L] @ v


def _outputs_and_grads(fn, leaves, seed=5):
    o = fn(*leaves)
    w = rnd(*o.shape, seed=seed)
    wanted = [x for x in leaves if x is not None and x.requires_grad]
    return [o.detach()] + list(torch.autograd.grad((o.double() * w).sum(), wanted))


def _leaves(B, Hq, Hk, L, D, g_batch, t_heads, seed=0):
    q, k, v = rnd(B, Hq, L, D, seed=seed), rnd(B, Hk, L, D, seed=seed + 1), rnd(B, Hk, L, D, seed=seed + 2)
    g = rnd(g_batch, Hq, L, seed=seed + 3).cumsum(-1)  # coordinates that drift, as a forget gate's sums do
    t = rnd(t_heads, L + 3, seed=seed + 4)  # longer than the call: the kernel reads its first L distances
    return [x.requires_grad_() for x in (q, k, v, g, t)]


@pytest.mark.parametrize("L", [1, 2, 63, 65, 130])
@pytest.mark.parametrize("B, Hq, Hk, g_batch, t_heads", [(2, 2, 2, 2, 2), (2, 4, 1, 1, 1), (1, 3, 3, 1, 3)])
def test_forward_and_every_gradient_equal_a_naive_softmax(L, B, Hq, Hk, g_batch, t_heads):
    band_kernel_or_skip()
    leaves = _leaves(B, Hq, Hk, L, 8, g_batch, t_heads)
    got = _outputs_and_grads(BK.causal_bias_attention, leaves)
    want = _outputs_and_grads(naive, leaves)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("which", ["key term", "table"])
def test_each_bias_alone(which):
    band_kernel_or_skip()
    q, k, v, g, t = _leaves(2, 2, 1, 70, 8, 2, 2, seed=7)
    g, t = (g, None) if which == "key term" else (None, t)
    got = _outputs_and_grads(BK.causal_bias_attention, [q, k, v, g, t])
    want = _outputs_and_grads(naive, [q, k, v, g, t])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("L", [1, 63, 130])
@pytest.mark.parametrize("sink_shape, cap, window", [
    ((1, 3, 1), None, None), (None, 0.7, None), ((2, 3, 1), 2.0, 40), ((2, 3, 130), None, 5), (None, None, 70)])
def test_sink_soft_cap_and_window_with_every_gradient(L, sink_shape, cap, window):
    """A sink per head (GPT-OSS) or per query, a soft cap (small enough to bend the scores: tanh past its odd
    polynomial's range), a window, each with both biases: their forward and gradients, the sink's and the key
    term's own row constant (which a sink or a cap makes count) included."""
    band_kernel_or_skip()
    q, k, v, g, t = _leaves(2, 3, 1, L, 8, 2, 3, seed=11)
    q = (q.detach() * 3).requires_grad_()  # scores of several units: the cap's tanh far from linear
    sink = None if sink_shape is None else rnd(*sink_shape[:2], min(sink_shape[2], L), seed=12).requires_grad_()
    leaves = [q, k, v, g, t, sink]

    def kernel(*a):
        return BK.causal_bias_attention(*a, cap=cap, window=window)

    def want(*a):
        return naive(*a, cap=cap, window=window)

    for a, b in zip(_outputs_and_grads(kernel, leaves), _outputs_and_grads(want, leaves), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_float32_sink_and_soft_cap_within_the_arithmetic_bound():
    """float32 with a cap and a sink: the scores' chain of D products, the bias, the cap's division, tanh
    (Cephes' tanhf, within 2 ulp: 3 roundings) and product, then the softmax over L keys and the weighted sum,
    bounded by float32_bound of that depth; the gradients likewise against their float64 values."""
    band_kernel_or_skip()
    L, D = 150, 16
    q, k, v, g, t = _leaves(1, 2, 2, L, D, 1, 2, seed=21)
    q = (q.detach() * 3).requires_grad_()
    sink = rnd(1, 2, 1, seed=22).requires_grad_()
    leaves = [q, k, v, g, t, sink]
    want = _outputs_and_grads(lambda *a: naive(*a, cap=1.5, window=100), leaves)
    low = [x if x is g else x.detach().float().requires_grad_() for x in leaves]  # the key term stays float64
    got = _outputs_and_grads(lambda *a: BK.causal_bias_attention(*a, cap=1.5, window=100), low)
    depth = 2 * L + D + 8  # a score (D + bias + cap), the softmax's L terms, the weighted sum's L; the backward's as deep
    for a, b in zip(got, want, strict=True):
        assert (a.double() - b).abs().max() <= float32_bound(depth, b)


def test_float32_within_the_arithmetic_bound_of_large_coordinates():
    """Coordinates near 1e4 (ALiBi's slope 0.5 at position 2e4) whose differences are small: the difference
    is taken in float64 and rounded once, so the float32 output errs like one without the offset."""
    band_kernel_or_skip()
    L, D = 150, 16
    q, k, v = (rnd(1, 2, L, D, seed=s) for s in (1, 2, 3))
    g = 1e4 + 0.5 * torch.arange(L, dtype=torch.float64).expand(1, 2, L)
    t = rnd(2, L, seed=4)
    want = naive(q, k, v, g, t)
    got = BK.causal_bias_attention(q.float(), k.float(), v.float(), g, t).double()
    assert (got - want).abs().max() <= float32_bound(L + D, want)


@pytest.mark.parametrize("name, kw", [("alibi", {}), ("alibi_learned", {}), ("fox", {"x": True}), ("t5_bias", {})])
def test_the_plans_run_alibi_fox_and_t5_on_the_kernel(name, kw, monkeypatch):
    """The plan declares the kernel; a full causal call runs it (and the separable or Toeplitz path with the
    kernels off), each equal to the float64 reference interpreter, gradients of the learned slopes, gates
    and table entries too."""
    band_kernel_or_skip()
    mods = fast_and_reference(name, "", 4, 8)
    assert "bias" in mods[0].plan.kernels
    q, k, v = (rnd(2, 4, 20, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    x = rnd(2, 20, D_MODEL, seed=4) if kw else None
    calls = []
    real = BK.BiasAttention.apply
    monkeypatch.setattr(BK.BiasAttention, "apply", lambda *a: calls.append(1) or real(*a))

    def run(mod):
        o = mod(q, k, v, x=x)
        w = rnd(*o.shape, seed=9)
        return [o] + list(torch.autograd.grad((o * w).sum(), [q, k, v, *mod.parameters()]))

    want = run(mods[1])
    for kernels_on in (True, False):
        monkeypatch.setattr(BK, "band_ops", BK.band_ops if kernels_on else (lambda: None))
        calls.clear()
        got = run(mods[0])
        assert bool(calls) == kernels_on
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name, extra, kw", [
    ("rope_sink", "", {}), ("alibi", "softcap = 2.0", {}), ("fox", "window = 7", {"x": True}),
    ("t5_bias", "window = 9\nsink = logit", {}), ("rope_softmax1", "softcap = 3.0", {}),
    ("kerple_log", "softcap = 1.5\nsink = logit", {"gqa": True}), ("rope", "window = 5\nsoftcap = 0.5", {"pos": 7})])
def test_soft_caps_sinks_and_windows_run_on_the_kernel(name, extra, kw, monkeypatch):
    """A sink logit (GPT-OSS), softmax plus one, a soft cap (Gemma 2) or a window, beside a bias or not, through
    the general path: the plan declares the kernel, a fresh call runs it (grouped key/value heads, positions
    that start elsewhere), equal to the float64 reference interpreter with every gradient (the sink logits',
    the gates', the tables'); with the kernels off, the blocks of queries, equal too."""
    band_kernel_or_skip()
    mods = fast_and_reference(name, extra, 4, 8)
    assert "bias" in mods[0].plan.kernels
    hk = 2 if kw.get("gqa") else 4
    q = rnd(2, 4, 20, 8, seed=1).requires_grad_()
    k, v = (rnd(2, hk, 20, 8, seed=s).requires_grad_() for s in (2, 3))
    x = rnd(2, 20, D_MODEL, seed=4) if kw.get("x") else None
    pos = torch.arange(20).expand(2, 20) + kw["pos"] if "pos" in kw else None
    calls = []
    real = BK.BiasAttention.apply
    monkeypatch.setattr(BK.BiasAttention, "apply", lambda *a: calls.append(1) or real(*a))

    def run(mod):
        o = mod(q, k, v, x=x, positions=pos)
        w = rnd(*o.shape, seed=9)
        return [o] + list(torch.autograd.grad((o * w).sum(), [q, k, v, *mod.parameters()]))

    want = run(mods[1])
    for kernels_on in (True, False):
        monkeypatch.setattr(BK, "band_ops", BK.band_ops if kernels_on else (lambda: None))
        calls.clear()
        got = run(mods[0])
        assert bool(calls) == kernels_on
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
