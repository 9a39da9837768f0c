"""FoX (the Forgetting Transformer's forget-gate bias) against x-transformers' ``DataDependentAlibi``.

The peer computes per head ``g_t = log sigmoid(W x_t + b)`` (``post_log_scale`` 1), its cumulative sum
``G`` and the bias ``G_i - G_j``, added to the scaled scores. pedsl's ``fox`` writes the same gate as
``accumulate(log_sigmoid(linear(x, to = head)))``. How to load the peer's parameters: its
``to_forget_gates[0]`` is an ``nn.Linear(dim, heads)``, the module's site ``bias[0]__linear0`` is one of
the same shape and layout (output channel h = head h), so the state dict copies over as is. Then the
attention output and the gradients of q, k, v, x and the gate's weight and bias must agree in float64.
"""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme

x_transformers = pytest.importorskip("x_transformers.x_transformers")  # a test extra: present in CI

F64 = torch.float64
B, H, L, D, DM = 2, 3, 37, 8, 12


def _peer_attention(peer, q, k, v, x):
    """x-transformers' causal attention with the data-dependent ALiBi bias, written out: scores scaled,
    the bias added, the future masked."""
    scores = q @ k.transpose(-1, -2) * D ** -0.5 + peer(x)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(causal, float("-inf")), -1) @ v


@pytest.mark.parametrize("bias_init", [5.0, -1.0])
def test_fox_equals_x_transformers_data_dependent_alibi_forward_and_backward(bias_init):
    torch.manual_seed(0)
    peer = x_transformers.DataDependentAlibi(DM, H, causal=True, bias_init=bias_init).double()
    mod = compile_scheme(SCHEMES / "fox.pe", d_model=DM, num_heads=H, head_dim=D).double()
    site = mod.learned.sites["bias[0]__linear0"]
    site.load_state_dict(peer.to_forget_gates[0].state_dict())
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    x = torch.randn(B, L, DM, generator=g, dtype=F64, requires_grad=True)
    got, want = mod(q, k, v, x=x), _peer_attention(peer, q, k, v, x)
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
    r = torch.randn(got.shape, generator=g, dtype=F64)
    ours = torch.autograd.grad((got * r).sum(), [q, k, v, x, site.weight, site.bias])
    theirs = torch.autograd.grad((want * r).sum(), [q, k, v, x, *peer.to_forget_gates[0].parameters()])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
    assert (got - _peer_attention(peer, q, k, v, x.flip(1))).abs().max() > 1e-3  # the gate reads x
