"""The C++ causal kernel with biases in its rows (pedsl/ops/band_kernel.cpp, ``causal_bias_attention``):
forward and every gradient (q, k, v, the float64 key term, the distance table) against a naive float64
softmax at L = 1, 2, around the block of 64, with grouped key/value heads and broadcast biases; float32
within the arithmetic bound; ALiBi and FoX dispatched to it by their plans, and the separable path when
the kernels are off; T5's table likewise, with the Toeplitz path when they are off."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, band_kernel_or_skip, fast_and_reference, float32_bound, rnd
from pedsl.ops import band_kernel as BK


def naive(q, k, v, g, t):
    """softmax_{j <= i}(q_i k_j / sqrt(D) + g_j - g_i + t[i - j]) v_j over the whole (L, L) matrix."""
    B, Hq, L, D = q.shape
    k, v = (x.repeat_interleave(Hq // k.shape[1], 1) for x in (k, v))
    i = torch.arange(L)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    if g is not None:
        s = s + g[..., None, :] - g[..., :, None]
    if t is not None:
        s = s + t[:, (i[:, None] - i[None, :]).clamp(min=0)]
    return s.masked_fill(i[None, :] > i[:, None], float("-inf")).softmax(-1) @ v


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
