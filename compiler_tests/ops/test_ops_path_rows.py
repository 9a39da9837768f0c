"""PaTH's two implementations of its scan's loops and row steps, each against the float64 naive loops.

The package runs the C++ kernel's (:class:`pedsl.compiler.path_kernel.PathCppRows`: the scan's pairs one head
per task, the online softmax in one pass over a row, the UT transform's inverse by forward substitution);
generated modules run :class:`pedsl.ops.path_blocks.PathTorchRows` (torch only). Both are compared here with
:func:`path_attention_naive` (values and every input's gradient) and the C++ row steps with float64 ones.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compiler_helpers import F32_EPS, band_kernel_or_skip, float32_bound

from pedsl.compiler.path_kernel import PathCppRows, path_rows
from pedsl.ops.path import path_attention_naive
from pedsl.ops.path_blocks import PathTorchRows
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
    """Float32 on the C++ loops: within the rounding bound of a chain of L + D terms (scores, softmax, sums)."""
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


def test_cpp_row_steps_match_float64():
    """2^x by range reduction and a degree-7 polynomial: within a few float32 roundings of float64's exp2;
    a masked score (-inf) gives exactly 0; the online step's running max, sum and rescaled accumulator."""
    rows = _cpp_rows()
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, 37, generator=g) * 20
    s[0, 0, 3] = float("-inf")
    lse = torch.randn(3, 5, 1, generator=g) * 20 + 30
    p = s.clone()
    rows.probs(p, lse)
    want = torch.exp2(s.double() - lse.double())
    # x = s - lse is rounded once (relative |x| ln2 eps in 2^x); the reduction is exact, the polynomial and
    # the scaling ~8 roundings more
    x = (s.double() - lse.double()).abs().nan_to_num(posinf=0.0)
    assert ((p.double() - want).abs() <= (x * 0.7 + 10) * F32_EPS * want).all()
    assert p[0, 0, 3] == 0
    mx, ln, a = torch.randn(3, 5, generator=g) * 20, torch.rand(3, 5, generator=g), torch.randn(3, 5, 4, generator=g)
    x = [t.clone() for t in (s, mx, ln, a)]
    rows.online(*x)
    y = [t.double() for t in (s, mx, ln, a)]
    PathTorchRows.online(*y)
    assert torch.equal(x[1].double(), y[1])
    for got, want in zip((x[0], x[2], x[3]), (y[0], y[2], y[3])):
        assert ((got.double() - want).abs() <= 200 * F32_EPS * want.abs().amax(-1, keepdim=True)).all()


def test_cpp_unit_lower_inverse_is_the_inverse():
    rows = _cpp_rows()
    g = torch.Generator().manual_seed(1)
    t = torch.randn(6, 9, 9, generator=g, dtype=F64) * 0.5
    x = rows.unit_lower_inverse(t)
    eye = torch.eye(9, dtype=F64)
    torch.testing.assert_close((eye + t.tril(-1)) @ x, eye.expand(6, 9, 9), rtol=0, atol=1e-12)
    assert torch.equal(x, x.tril())
