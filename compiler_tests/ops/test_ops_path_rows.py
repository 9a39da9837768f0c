"""PaTH's two implementations of its scan's loops and row steps, each against the float64 naive loops.

The package runs the C++ kernel's (:class:`pedsl.ops.path_kernel.PathCppRows`: the scan's pairs one head
per task, its own 2^x, the UT transform's inverse by forward substitution); generated modules run
:class:`pedsl.ops.path_blocks.PathTorchRows` (torch only). Both are compared here with
:func:`path_attention_naive` (values and every input's gradient), the C++ one in float32 too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compiler_helpers import band_kernel_or_skip, float32_bound

from pedsl.ops.path import path_attention_naive
from pedsl.ops.path_blocks import PathTorchRows
from pedsl.ops.path_kernel import PathCppRows, path_rows
from pedsl.ops.path_kernels import path_forward

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(L, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 2, 4
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(B, H, L, generator=g, dtype=dtype)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g, dtype=dtype) + 1.0)
    return [q, k, v, w, beta, lf], torch.randn(B, H, L, D, generator=g, dtype=dtype)


def _run(fn, ins, probe, forget, **kw):
    ins = [t.clone().requires_grad_() for t in ins]
    used = ins if forget else ins[:5]
    out = fn(*ins[:5], ins[5] if forget else None, **kw)
    return out, torch.autograd.grad((out * probe).sum(), used)


def _cpp_rows():
    band_kernel_or_skip()  # built where a compiler is present, a skip where none is
    rows = path_rows(torch.zeros(1))
    assert isinstance(rows, PathCppRows)
    return rows


@pytest.mark.parametrize("which", ["cpp", "torch"])
@pytest.mark.parametrize("L,C,k,forget", [(45, 4, 4, True), (41, 3, 8, False), (37, 4, 3, True), (9, 4, 4, True)])
def test_scan_loops_match_naive_values_and_gradients(which, L, C, k, forget):
    rows = _cpp_rows() if which == "cpp" else PathTorchRows
    ins, probe = _inputs(L, F64, L + k)
    out, grads = _run(path_forward, ins, probe, forget, block_size=C, superblock=k, rows=rows)
    ref, grefs = _run(path_attention_naive, ins, probe, forget)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-11)
    for name, a, r in zip("q k v w beta log_forget".split(), grads, grefs):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")


def test_cpp_float32_within_rounding_of_float64():
    """Float32 on the C++ loops, within float32_bound of the longest chain of roundings: a score's D terms moved
    through up to L / C block products of D terms each and the C-term UT transform, the softmax's L terms and
    the output's L terms, D (L / C + C + 1) + 2 L < 4 (L + D) at L = 96, C = 8, D = 4; the backward runs each
    chain again the other way (8 (L + D))."""
    rows = _cpp_rows()
    L = 96
    ins, probe = _inputs(L, F64, 7)
    ref, grefs = _run(path_attention_naive, ins, probe, True)
    out, grads = _run(path_forward, [t.float() for t in ins], probe.float(), True, block_size=8, superblock=4,
                      rows=rows)
    D = ins[0].shape[-1]
    assert (out.double() - ref).abs().max() <= float32_bound(4 * (L + D), ref)
    for a, r in zip(grads, grefs):
        assert (a.double() - r).abs().max() <= float32_bound(8 * (L + D), r)


def test_cpp_unit_lower_inverse_is_the_inverse():
    rows = _cpp_rows()
    g = torch.Generator().manual_seed(1)
    t = torch.randn(6, 9, 9, generator=g, dtype=F64) * 0.5
    x = rows.unit_lower_inverse(t)
    eye = torch.eye(9, dtype=F64)
    torch.testing.assert_close((eye + t.tril(-1)) @ x, eye.expand(6, 9, 9), rtol=0, atol=1e-12)
    assert torch.equal(x, x.tril())
