"""The two hand-written autograd functions behind PaTH attention, against float64 references.

``pedsl.ops.path_blocks`` (per-block UT/WY quantities) is compared with explicit Householder
products, values and gradients (autograd through the explicit products); ``pedsl.ops.path_scan``'s
superblocks (docs/semantics.md §6) are compared, through :func:`path_attention`, with the naive
loops for several superblock sizes: outputs and gradients of q, k, v, w, beta, log_forget and
q_scale, with lengths that leave a partial last block and a partial last superblock.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import float32_bound

from pedsl.ops.path import householder_product, path_attention, path_attention_naive
from pedsl.ops.path_blocks import path_blocks

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _explicit_blocks(Q, K, W, b):
    """(Qt, Kt, Sd, P) of one block from explicit products H_t = I - b_t w_t w_t^T (float64)."""
    C = Q.shape[-2]
    Qt = torch.stack([(Q[..., i, None, :] @ householder_product(W[..., : i + 1, :], b[..., : i + 1]))[..., 0, :]
                      for i in range(C)], -2)
    Kt = torch.stack([(householder_product(W[..., j + 1:, :], b[..., j + 1:]) @ K[..., j, :, None])[..., 0]
                      for j in range(C)], -2)
    rows = []
    for i in range(C):
        row = []
        for j in range(C):
            if j > i:
                row.append(torch.full(Q.shape[:-2], float("-inf"), dtype=Q.dtype))
                continue
            Pji = householder_product(W[..., j + 1: i + 1, :], b[..., j + 1: i + 1])  # H_i ... H_(j+1)
            row.append((Q[..., i, None, :] @ Pji @ K[..., j, :, None])[..., 0, 0])
        rows.append(torch.stack(row, -1))
    Sd = torch.stack(rows, -2)
    P = householder_product(W, b)  # H_C ... H_1: a query row moves through the block as r^T P
    return Qt, Kt, Sd, P


@pytest.mark.parametrize("C,D,beta", [(5, 4, "rand"), (8, 8, "rand"), (6, 4, "edge")])
def test_path_blocks_values_and_gradients_match_explicit_products(C, D, beta):
    g = torch.Generator().manual_seed(C * D)
    N, Z = 3, 2
    Q, K = (torch.randn(N, Z, C, D, generator=g, dtype=F64) for _ in range(2))
    W = F.normalize(torch.randn(N, Z, C, D, generator=g, dtype=F64), dim=-1)
    b = 2 * torch.rand(N, Z, C, generator=g, dtype=F64)
    if beta == "edge":  # a zero step, a projection (singular H) and a reflection inside one block
        b[..., 0], b[..., 2], b[..., -1] = 0.0, 1.0, 2.0
    ins = [t.clone().requires_grad_() for t in (Q, K, W, b)]
    got = path_blocks(*ins)
    ref = _explicit_blocks(*ins)
    ups = [torch.randn(o.shape, generator=g, dtype=F64) for o in ref]  # Sd: also above the diagonal
    for name, a, r in zip(("Qt", "Kt", "Sd", "P"), got, ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12, msg=lambda m: f"{name}: {m}")

    def grads(outs):
        loss = sum((o.masked_fill(torch.isinf(o), 0.0) * u).sum() for o, u in zip(outs, ups))
        return torch.autograd.grad(loss, ins)

    for name, a, r in zip("QKWb", grads(got), grads(ref)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-11, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("L,C,k", [(37, 4, 1), (37, 4, 2), (37, 4, 3), (45, 4, 4), (41, 3, 8), (9, 4, 4)])
@pytest.mark.parametrize("forget", [False, True])
def test_superblock_scan_matches_naive_values_and_gradients(L, C, k, forget):
    """N = ceil(L / C) blocks: (9, 4) leaves no key superblock, (45, 4, 4) a partial last block
    and superblock, (41, 3, 8) a superblock wider than most of the sequence."""
    g = torch.Generator().manual_seed(L + 10 * k)
    B, H, D = 2, 2, 4
    q, k_, v = (torch.randn(B, H, L, D, generator=g, dtype=F64) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=F64), dim=-1)
    beta = 2 * torch.rand(B, H, L, generator=g, dtype=F64)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g, dtype=F64) + 1.0)
    qsc = 0.5 + torch.rand(B, 1, L, generator=g, dtype=F64)
    ins = [t.clone().requires_grad_() for t in (q, k_, v, w, beta, lf, qsc)]
    probe = torch.randn(B, H, L, D, generator=g, dtype=F64)

    def run(fn, **kw):
        out = fn(*ins[:5], ins[5] if forget else None, scale=0.4, q_scale=ins[6], **kw)
        used = [t for i, t in enumerate(ins) if forget or i != 5]
        return out, torch.autograd.grad((out * probe).sum(), used)

    out, gr = run(path_attention, block_size=C, superblock=k)
    ref, gref = run(path_attention_naive)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-11)
    names = [n for i, n in enumerate("q k v w beta log_forget q_scale".split()) if forget or i != 5]
    for name, a, r in zip(names, gr, gref):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")


def test_superblock_scan_gradcheck():
    g = torch.Generator().manual_seed(3)
    B, H, L, D = 1, 1, 11, 3
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=F64) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=F64), dim=-1)
    beta = 0.1 + 1.8 * torch.rand(B, H, L, generator=g, dtype=F64)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g, dtype=F64))
    args = [t.requires_grad_() for t in (q, k, v, w, beta, lf)]
    assert torch.autograd.gradcheck(lambda *a: path_attention(*a, block_size=2, superblock=2), args)


def test_float32_superblocks_agree_with_one_level():
    """Float32 at a realistic block size: two levels and one level agree to float32 rounding."""
    g = torch.Generator().manual_seed(5)
    B, H, L, D = 1, 2, 300, 16
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g), dim=-1)
    beta = 2 * torch.rand(B, H, L, generator=g)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g) + 2.0)
    one = path_attention(q, k, v, w, beta, lf, block_size=16, superblock=1)
    two = path_attention(q, k, v, w, beta, lf, block_size=16, superblock=4)
    ref = path_attention_naive(*(t.double() for t in (q, k, v, w, beta, lf)))
    # float32 chain: up to L reflections of D + 2 roundings each transport a key, then the score's D, the softmax's
    # and the weighted sum's L; the gate's local cumsum (block_size terms) adds 2 block_size^2 max|lf| to a
    # logit's; one and two levels each lie within it of float64, so within twice it of each other. A wrong
    # superblock hand-over (a block's transport dropped or applied twice) moves outputs by a fraction of max|v|.
    bound = float32_bound(L * (D + 2) + 2 * L + D + 2 * 16 * 16 * int(lf.abs().max() + 1), v.double())
    assert float((two.double() - ref).abs().max()) <= bound
    assert float((two - one).abs().max()) <= 2 * bound
