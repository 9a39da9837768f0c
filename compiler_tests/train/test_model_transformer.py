"""The transformer: shapes, causality, one scheme module per layer (and nothing else
positional), capture() returns what the scheme module saw, tied/untied heads."""

from __future__ import annotations

import math

import torch

from compiler_helpers import float64_bound
from torch import nn

from pedsl.config import ModelConfig
from pedsl.model import TransformerLM
from train_helpers import helper, lm_depth

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=2)


class Recorder(nn.Module):
    """Causal SDPA that records the keyword arguments it receives; has a learned scalar."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer, self.seen = layer, []
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, q, k, v, *, x=None, tokens=None):
        self.seen.append({"q": q, "x": x, "tokens": tokens})
        return self.gain * torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_shapes_and_factory_per_layer():
    made = []
    model = TransformerLM(CFG, lambda i: made.append(i) or Recorder(i))
    assert made == [0, 1]
    tokens = torch.randint(0, 256, (3, 10))
    logits = model(tokens)
    assert logits.shape == (3, 10, 256)
    rec = model.blocks[0].attn.pe
    assert rec.seen[0]["q"].shape == (3, 2, 10, 16)
    assert rec.seen[0]["x"].shape == (3, 10, 32) and torch.equal(rec.seen[0]["tokens"], tokens)


def _depth(length: int, layers: int | None = None) -> int:
    return lm_depth(CFG, length, layers)


def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = TransformerLM(CFG, lambda i: helper.TestALiBi(2)).double()
    a = torch.randint(0, 256, (2, 12))
    b = a.clone()
    b[:, 8:] = torch.randint(0, 256, (2, 4))
    # float64: the prefix is the same arithmetic in both, up to the order of the masked keys' zeros
    want = model(a)[:, :8]
    assert torch.allclose(model(b)[:, :8], want, rtol=0, atol=float64_bound(_depth(12), want))


def test_nope_model_is_permutation_blind_in_the_prefix():
    """No other positional signal: without a scheme, the last position's output is invariant to
    permuting the earlier tokens (one layer: deeper, the causal mask itself leaks order)."""
    torch.manual_seed(0)
    model = TransformerLM(CFG.model_copy(update={"n_layers": 1}), lambda i: helper.NoPE()).double()
    a = torch.randint(0, 256, (1, 9))
    b = torch.cat([a[:, :8].flip(1), a[:, 8:]], 1)
    want = model(a)[:, -1]  # float64: permuted keys change only the order of the softmax's sums
    assert torch.allclose(model(b)[:, -1], want, rtol=0, atol=float64_bound(_depth(9, layers=1), want))


def test_capture_returns_scheme_inputs_without_grad():
    torch.manual_seed(0)
    model = TransformerLM(CFG, Recorder)
    tokens = torch.randint(0, 256, (2, 7))
    caps = model.capture(tokens)
    assert len(caps) == 2
    for layer, cap in enumerate(caps):
        assert cap["q"].shape == cap["k"].shape == cap["v"].shape == (2, 2, 7, 16)
        assert cap["x"].shape == (2, 7, 32) and not cap["q"].requires_grad
        assert torch.equal(cap["q"], model.blocks[layer].attn.pe.seen[-1]["q"])
    assert all(b.attn.captured is None for b in model.blocks)


def test_scheme_parameters_train_and_tied_embedding():
    model = TransformerLM(CFG, Recorder)
    assert any(n.endswith("pe.gain") for n, _ in model.named_parameters())
    assert "head" not in dict(model.named_children()) or model.head is None
    model.loss(torch.randint(0, 256, (2, 9))).backward()
    assert model.blocks[0].attn.pe.gain.grad is not None
    untied = TransformerLM(CFG.model_copy(update={"tie_embeddings": False, "norm": "layernorm"}), Recorder)
    assert untied.head is not None and untied(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 256)


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = TransformerLM(CFG, lambda i: helper.NoPE())
    with torch.no_grad():
        loss = float(model.loss(torch.randint(0, 256, (4, 33))))
    assert abs(loss - math.log(256)) < 0.3


def test_test_alibi_matches_a_naive_loop():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    out = helper.TestALiBi(2)(q, k, v)
    ref = torch.zeros_like(out)
    for h in range(2):
        m = 2.0 ** (-8.0 * (h + 1) / 2)
        for i in range(5):
            s = torch.tensor([float(q[0, h, i] @ k[0, h, j]) / 2.0 - m * (i - j) for j in range(i + 1)])
            a = torch.softmax(s, 0).double()
            ref[0, h, i] = (a[:, None] * v[0, h, : i + 1]).sum(0)
    assert torch.allclose(out, ref, atol=1e-10)
