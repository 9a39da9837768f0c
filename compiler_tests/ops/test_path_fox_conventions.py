"""The two PaTH-FoX conventions of the library, each against a naive float64 reference of what it means.

FLA's PaTH-FoX kernel (fla-org/flash-linear-attention, fla/ops/path_attn) adds the cumulative log
forget gate to the transported scores and then scales both by 1/sqrt(D):

    o_i = sum_j softmax_j( (q_i^T H_i H_{i-1} ... H_{j+1} k_j + G_i - G_j) / sqrt(D) ) v_j,
    H_s = I - beta_s w_s w_s^T,   G_t = sum_{s <= t} log f_s;

``path_fox_fla`` is that; ``path_fox`` (like FoX) adds ``G_i - G_j`` after the scale. The reference
below is written from that formula (explicit products of the steps for every pair), with the module's
own w, beta and raw gate logits, so the 1/sqrt(D) on the gate is what is checked.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme

F64 = torch.float64
B, H, L, D, DM = 2, 2, 9, 8, 12


def fla_path_fox_naive(q, k, v, w, beta, log_f, *, gate_scaled: bool):
    """Causal PaTH-FoX, pair by pair: q, k, v, w (B, H, L, D), beta, log_f (B, H, L)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    G = torch.cumsum(log_f, -1)
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            steps = [eye - beta[b, h, s] * torch.outer(w[b, h, s], w[b, h, s]) for s in range(q.shape[2])]
            for i in range(q.shape[2]):
                logits, M = [], eye
                for j in range(i, -1, -1):  # M = H_i H_{i-1} ... H_{j+1}
                    gate = G[b, h, i] - G[b, h, j]
                    dot = q[b, h, i] @ M @ k[b, h, j]
                    logits.append((dot + gate) * scale if gate_scaled else dot * scale + gate)
                    M = M @ steps[j]
                p = torch.softmax(torch.stack(logits[::-1]), 0)
                out[b, h, i] = p @ v[b, h, : i + 1]
    return out


def _case(name: str, seed: int = 0):
    torch.manual_seed(seed)
    mod = compile_scheme(SCHEMES / f"{name}.pe", d_model=DM, num_heads=H, head_dim=D).double()
    g = torch.Generator().manual_seed(seed + 1)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    x = torch.randn(B, L, DM, generator=g, dtype=F64)
    with torch.no_grad():  # a gate that forgets visibly, so a factor sqrt(D) on it shows
        mod.learned.sites["bias[0]__linear0"].bias.fill_(-1.0)
    return mod, q, k, v, x


def _naive(mod, q, k, v, x, *, gate_scaled):
    w, beta, _ = mod.householder_inputs(B, L, x, None, None, F64)
    log_f = F.logsigmoid(mod.learned.sites["bias[0]__linear0"](x)).transpose(1, 2)  # the raw gate (B, H, L)
    return fla_path_fox_naive(q, k, v, w, beta, log_f, gate_scaled=gate_scaled)


def _grads(out, mod, q, k, v):
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=F64)
    ts = [q, k, v, *mod.parameters()]
    return torch.autograd.grad((out * r).sum(), ts)


def test_path_fox_fla_is_flas_convention_forward_and_backward():
    mod, q, k, v, x = _case("path_fox_fla")
    got, want = mod(q, k, v, x=x), _naive(mod, q, k, v, x, gate_scaled=True)
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
    for a, b in zip(_grads(got, mod, q, k, v), _grads(want, mod, q, k, v)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    unscaled = _naive(mod, q, k, v, x, gate_scaled=False)
    assert (got - unscaled).abs().max() > 1e-2  # the 1/sqrt(D) on the gate is not a no-op here


def test_path_fox_is_the_fox_convention_and_differs_from_fla():
    """Same weights in both schemes (their sites are named alike): path_fox adds the gate unscaled."""
    mod, q, k, v, x = _case("path_fox")
    fla, *_ = _case("path_fox_fla")
    fla.load_state_dict(mod.state_dict())
    got = mod(q, k, v, x=x)
    torch.testing.assert_close(got, _naive(mod, q, k, v, x, gate_scaled=False), rtol=1e-11, atol=1e-12)
    assert (got - fla(q, k, v, x=x)).abs().max() > 1e-2


@pytest.mark.parametrize("backend", ["blockwise", "reference"])
def test_path_fox_fla_runs_on_each_backend_alike(backend):
    mod, q, k, v, x = _case("path_fox_fla")
    other = compile_scheme(SCHEMES / "path_fox_fla.pe", d_model=DM, num_heads=H, head_dim=D, backend=backend).double()
    other.load_state_dict(mod.state_dict())
    torch.testing.assert_close(other(q, k, v, x=x), mod(q, k, v, x=x), rtol=1e-10, atol=1e-12)
