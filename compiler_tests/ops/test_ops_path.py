"""PaTH attention (pedsl/ops/path.py) against independent float64 references.

References: explicit Householder products (loops), the materialized L x L transported keys,
plain causal softmax attention (beta = 0), and absolute transforms A_t = M_t ... M_1 when every
step is an orthogonal reflection (beta = 2; docs/semantics.md §5.1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import float32_bound

from pedsl.errors import ShapeError
from pedsl.ops.path import (
    householder_product,
    path_attention,
    path_attention_materialized,
    path_attention_naive,
    ut_block_product,
)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def make(B=2, H=2, L=16, D=8, beta="rand", seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=dtype), dim=-1)
    if beta == "rand":
        b = 2 * torch.rand(B, H, L, generator=g, dtype=dtype)
    else:
        b = torch.full((B, H, L), float(beta), dtype=dtype)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g, dtype=dtype) + 1.5)
    qsc = 0.5 + torch.rand(B, 1, L, generator=g, dtype=dtype)
    return q, k, v, w, b, lf, qsc


def causal_attention(q, k, v, bias=None):
    L = q.shape[-2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_ut_block_product_equals_explicit(n):
    q, k, v, w, b, lf, _ = make(L=n, D=8, seed=n)
    b[..., 0] = 0.0  # a zero step inside a block
    b[..., -1] = 2.0  # and a reflection
    torch.testing.assert_close(ut_block_product(w, b), householder_product(w, b), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("D", [4, 8])
@pytest.mark.parametrize("L", [1, 3, 16, 37])
@pytest.mark.parametrize("forget", [False, True])
def test_forward_matches_naive(D, L, forget):
    q, k, v, w, b, lf, _ = make(L=L, D=D, seed=L + D)
    ref = path_attention_naive(q, k, v, w, b, lf if forget else None)
    for C in (4, 8):
        out = path_attention(q, k, v, w, b, lf if forget else None, block_size=C)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("beta", [0.0, 2.0, "rand"])
def test_special_betas_and_q_scale(beta):
    q, k, v, w, b, lf, qsc = make(L=37, D=8, beta=beta, seed=3)
    ref = path_attention_naive(q, k, v, w, b, lf, scale=0.3, q_scale=qsc)
    out = path_attention(q, k, v, w, b, lf, scale=0.3, q_scale=qsc, block_size=8)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-11)
    mat = path_attention_materialized(q, k, v, w, b, lf, scale=0.3, q_scale=qsc)
    torch.testing.assert_close(mat, ref, rtol=1e-10, atol=1e-11)


def test_beta_zero_is_plain_causal_attention():
    q, k, v, w, b, lf, _ = make(L=37, D=8, beta=0.0, seed=4)
    out = path_attention(q, k, v, w, b, block_size=8)
    torch.testing.assert_close(out, causal_attention(q, k, v), rtol=1e-12, atol=1e-12)
    G = lf.cumsum(-1)
    out = path_attention(q, k, v, w, b, lf, block_size=4)
    ref = causal_attention(q, k, v, G.unsqueeze(-1) - G.unsqueeze(-2))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_reflections_factor_into_absolute_transforms():
    """beta = 2: M_t orthogonal, P(j->i) = A_i A_j^T with A_t = M_t ... M_1 (explicit matrices)."""
    B, H, L, D = 2, 2, 19, 4
    q, k, v, w, b, lf, _ = make(B, H, L, D, beta=2.0, seed=5)
    eye = torch.eye(D, dtype=F64)
    M = eye - 2 * w.unsqueeze(-1) * w.unsqueeze(-2)  # (B, H, L, D, D)
    As, A = [], eye.expand(B, H, D, D)
    for t in range(L):
        A = M[:, :, t] @ A
        As.append(A)
    At = torch.stack(As, 2).transpose(-1, -2)  # A_t^T
    qa = (At @ q.unsqueeze(-1)).squeeze(-1)
    ka = (At @ k.unsqueeze(-1)).squeeze(-1)
    ref = causal_attention(qa, ka, v)
    out = path_attention(q, k, v, w, b, block_size=4)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("L,D,C,beta", [(37, 8, 8, "rand"), (16, 4, 4, 2.0), (3, 8, 4, "rand"),
                                        (13, 4, 4, 0.0)])
def test_gradients_match_naive(L, D, C, beta):
    q, k, v, w, b, lf, qsc = make(L=L, D=D, beta=beta, seed=7)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, w, b, lf, qsc)]
    probe = torch.randn(2, 2, L, D, generator=torch.Generator().manual_seed(1), dtype=F64)

    def grads(fn, **kw):
        out = fn(*inputs[:6], q_scale=inputs[6], **kw)
        return torch.autograd.grad((out * probe).sum(), inputs)

    g_ref = grads(path_attention_naive)
    g_out = grads(path_attention, block_size=C)
    for name, a, r in zip("q k v w beta log_forget q_scale".split(), g_out, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")


def test_gradcheck_small():
    q, k, v, w, b, lf, _ = make(B=1, H=1, L=7, D=4, seed=9)
    b = b.clamp(0.1, 1.9)
    args = [t.requires_grad_() for t in (q, k, v, w, b, lf)]
    assert torch.autograd.gradcheck(lambda *a: path_attention(*a, block_size=3), args)


def test_float32_long_forget_gate_is_stable():
    """Large |G| (long context, strong forgetting): per-block offsets keep float32 accurate."""
    q, k, v, w, b, lf, _ = make(B=1, H=2, L=300, D=8, seed=11)
    lf = lf - 3.0  # G reaches about -1000
    ref = path_attention_materialized(q, k, v, w, b, lf)
    out = path_attention(*(t.float() for t in (q, k, v, w, b, lf)), block_size=16)
    assert torch.isfinite(out).all()
    # float32 chain: up to L reflections of D + 2 roundings each transport a key, then the score's D, the softmax's
    # and the weighted sum's L, the inputs' rounding; the gate's local cumsum (block_size terms, float64 block
    # offsets) errs by block_size eps x its magnitude block_size max|lf| in a logit, 2x that in the output.
    # Dropping or misplacing one recent key (the gate keeps the weight near the diagonal) errs by ~0.1 max|v|.
    L, D, bs = 300, 8, 16
    gate = 2 * bs * bs * float(lf.abs().max())
    bound = float32_bound(L * (D + 2) + 2 * L + D + 2 + int(gate), v)
    assert float((out.double() - ref).abs().max()) <= bound


def test_bad_shapes_raise_shape_error():
    q, k, v, w, b, lf, _ = make(L=5)
    with pytest.raises(ShapeError, match="beta"):
        path_attention(q, k, v, w, b[..., :3])
    with pytest.raises(ShapeError, match="w has shape"):
        path_attention(q, k, v, w[..., :4], b)


def test_bfloat16_inputs_run_in_float32_and_keep_dtype():
    q, k, v, w, b, lf, _ = make(L=21, D=8, seed=12)
    ref = path_attention(q, k, v, w, b, lf, block_size=8)
    out = path_attention(*(t.bfloat16() for t in (q, k, v, w, b, lf)), block_size=8)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.05)


def test_hard_forget_reset_masks_the_past_without_nan():
    """log_forget = -inf at t (f_t = 0): queries i >= t see only keys j >= t."""
    q, k, v, w, b, lf, _ = make(L=20, D=4, seed=13)
    lf[..., 9] = float("-inf")
    out = path_attention(q, k, v, w, b, lf, block_size=4)
    assert torch.isfinite(out).all()
    lf_late = lf[:, :, 9:].clone()
    lf_late[..., 0] = 0.0  # the first step of a sequence never enters a bias
    ref_late = path_attention_naive(*(t[:, :, 9:] for t in (q, k, v, w, b)), lf_late)
    torch.testing.assert_close(out[:, :, 9:], ref_late, rtol=1e-10, atol=1e-11)
    ref_early = path_attention_naive(*(t[:, :, :9] for t in (q, k, v, w, b, lf)))
    torch.testing.assert_close(out[:, :, :9], ref_early, rtol=1e-10, atol=1e-11)
