"""``model.qk_conv``: the causal depthwise convolution over queries and keys (pedsl.model.causal_conv).

Checked against a naive float64 loop (values and gradients), for causality, for being the identity
at init, for what the instruments capture, and through the configuration."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

import pedsl
from pedsl.compiler import compile_scheme
from pedsl.config import ModelConfig, resolve_train_config
from pedsl.model import TransformerLM, causal_conv


def naive_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out[b, h, t, d] = sum over i <= t of w[i, h, d] * x[b, h, t - i, d], one element at a time."""
    B, H, L, D = x.shape
    out = torch.zeros_like(x)
    for b in range(B):
        for h in range(H):
            for t in range(L):
                for d in range(D):
                    out[b, h, t, d] = sum(w[i, h, d] * x[b, h, t - i, d] for i in range(w.shape[0]) if t - i >= 0)
    return out


@pytest.mark.parametrize("taps, L", [(1, 5), (3, 7), (4, 3)])  # 4 taps over 3 positions: the window runs off
def test_causal_conv_matches_a_loop_forward_and_backward(taps, L):
    g = torch.Generator().manual_seed(taps * 10 + L)
    x = torch.randn(2, 3, L, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(taps, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    got, want = causal_conv(x, w), naive_conv(x, w)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    gy = torch.randn(got.shape, dtype=torch.float64, generator=g)
    gx, gw = torch.autograd.grad(got, (x, w), gy)
    wx, ww = torch.autograd.grad(want, (x, w), gy)
    torch.testing.assert_close(gx, wx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, ww, rtol=1e-12, atol=1e-12)


def _model(conv: int, name: str = "rope") -> TransformerLM:
    s = pedsl.load(name, heads=2, head_dim=8)
    torch.manual_seed(0)
    return TransformerLM(ModelConfig(vocab_size=64, n_layers=2, d_model=16, n_heads=2, qk_conv=conv),
                         lambda i: compile_scheme(s, num_heads=2, head_dim=8, d_model=16)).double()


def test_identity_at_init_and_a_real_change_after():
    plain, conv = _model(0), _model(4)
    conv.load_state_dict(plain.state_dict(), strict=False)  # same weights, taps [1, 0, 0, 0]
    tok = torch.randint(0, 64, (2, 12))
    torch.testing.assert_close(conv(tok), plain(tok), rtol=0, atol=0)
    with torch.no_grad():
        conv.blocks[0].attn.qk_conv[1, 1] += 0.5  # keys now mix in the previous byte's key
    assert (conv(tok) - plain(tok)).abs().max() > 1e-9  # float64: any real change is far above rounding


@pytest.mark.parametrize("name", ["rope", "alibi", "path"])
def test_the_convolution_is_causal(name):
    m = _model(3, name)
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.qk_conv.normal_()
    tok = torch.randint(0, 64, (1, 10))
    other = tok.clone()
    other[0, 6] = (other[0, 6] + 1) % 64
    a, b = m(tok), m(other)
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-12)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-6


def test_the_instruments_see_the_convolved_keys():
    m = _model(2)
    with torch.no_grad():
        m.blocks[0].attn.qk_conv[1, 1] = 1.0
    tok = torch.randint(0, 64, (1, 6))
    cap = m.capture(tok)[0]
    x = m.blocks[0].norm1(m.embed(tok))
    k_raw = m.blocks[0].attn.qkv(x).view(1, 6, 3, 2, 8)[:, :, 1].transpose(1, 2)
    want = k_raw.clone()
    want[:, :, 1:] += k_raw[:, :, :-1]
    torch.testing.assert_close(cap["k"], want)


def test_configuration():
    assert resolve_train_config(scheme="rope", overrides={"qk_conv": 4}).model.qk_conv == 4
    for bad in (-1, 17):
        with pytest.raises(ValidationError):
            ModelConfig(qk_conv=bad)
    assert ModelConfig().qk_conv == 0
