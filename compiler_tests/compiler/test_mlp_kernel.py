"""FIRE's C++ MLP-bias kernel (pedsl/ops/mlp_kernel.cpp, dispatched by mlp_kernel.py): forward and every
gradient (q, k, v, u, w, W1, b1, W2, b2) against the dense float64 reference that evaluates the MLP at every
pair, at L across its blocks of 64 queries, with units switching inside rows, several at one distance and
exactly at a kink, a constant w (below FIRE's threshold), w of either sign, a decreasing u, B and H above one;
float32 against the reference; the torch kernel where the C++ one does not apply (u not monotone, values not
finite) or cannot be built; and the FIRE module through the C++ kernel."""

from __future__ import annotations

import pytest
import torch
from compiler_helpers import SCHEMES, band_kernel_or_skip, dense_mlp_bias, float32_bound

from pedsl.compiler import compile_scheme
from pedsl.errors import ShapeError
from pedsl.ops import cpu_kernels as CK
from pedsl.ops import mlp_kernel as MK

F64 = torch.float64


def _spy(monkeypatch) -> tuple[list, list]:
    """(calls of the C++ ops, calls of the torch kernel) from here on."""
    band_kernel_or_skip()  # the C++ kernels built where a compiler is present, a skip where none is
    ops, cpp, torch_kernel = MK.mlp_ops(), [], []

    class Spy:
        def __getattr__(self, name):
            return lambda *args: cpp.append(name) or getattr(ops, name)(*args)

    monkeypatch.setattr(MK, "mlp_ops", Spy)
    real = MK.mlp_bias_attention
    monkeypatch.setattr(MK, "mlp_bias_attention", lambda *a, **kw: torch_kernel.append(1) or real(*a, **kw))
    return cpp, torch_kernel


def _fire(L, threshold, c=0.3, extra=0):
    """FIRE's u(d) = log(c d + 1) (L + extra entries) and w(i) = 1 / log(c max(i, threshold) + 1)."""
    d = torch.arange(L + extra, dtype=F64)
    u = torch.log(c * d + 1)
    return u, 1 / (torch.log(c * torch.maximum(d[:L], torch.tensor(threshold, dtype=F64)) + 1) + 1e-6)


def _mlp(H, K, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(K, generator=g, dtype=F64), torch.randn(K, generator=g, dtype=F64) * spread,
            torch.randn(H, K, generator=g, dtype=F64), torch.randn(H, generator=g, dtype=F64))


def _float32_chains(B, H, L, K, D=16):
    """The longest float32 rounding chain behind each compared tensor, for float32_bound: the output's MLP (K),
    score (D), softmax and weighted sum (2L) and the inputs' rounding; the q, k, v gradients add the backward's
    dP (D), row sum and products (3L) and the MLP's (K); u, w and the MLP's parameters add a row's L pairs (their
    sum over the B H L rows, worst case B H L^2 eps, would hide a dropped row: the floor's multiple covers it)."""
    out = K + D + 2 * L + 2
    grad = out + 3 * L + D + K
    pairs = grad + L
    return dict(out=out, q=grad, k=grad, v=grad, u=pairs, w=pairs, w1=pairs, b1=pairs, w2=pairs, b2=pairs)


def _outputs_and_grads(fn, leaves, cot, scale):
    out = fn(*leaves, scale=scale)
    return [out] + list(torch.autograd.grad((out.double() * cot).sum(), leaves))


def _compare(fn, B, H, L, u, w, mlp, *, dtype=F64, scale=None, chains=None, seed=0):
    """fn and the dense reference, forward and the gradients of q, k, v, u, w and the MLP, equal: in float64 to
    1e-9 relative; in float32 (chains from _float32_chains) each within float32_bound of its chain plus 4x the
    error of the dense reference run in float32 (the floor: a gradient that cancels to ~0, like b2's under the
    softmax's shift invariance, errs by its terms' size, not its own), two orders of the same sums erring alike."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, 16, generator=g, dtype=F64) for _ in range(3))
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, u, w, *mlp)]
    ref = [t.detach().double().requires_grad_(True) for t in leaves]
    cot = torch.randn(B, H, L, 16, generator=g, dtype=F64)
    got, exp = _outputs_and_grads(fn, leaves, cot, scale), _outputs_and_grads(dense_mlp_bias, ref, cot, scale)
    floor = _outputs_and_grads(dense_mlp_bias, leaves, cot, scale) if chains else exp
    for name, a, b, f in zip(["out", "q", "k", "v", "u", "w", "w1", "b1", "w2", "b2"], got, exp, floor):
        assert a.dtype == dtype and a.shape == b.shape, name
        if chains is None:
            torch.testing.assert_close(a.double(), b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")
            continue
        err, floor_err = float((a.detach().double() - b).abs().max()), float((f.detach().double() - b).abs().max())
        bound = float32_bound(chains[name], b) + 4 * floor_err
        assert err <= bound, f"{name}: float32 error {err:.3g} above {bound:.3g} (floor's {floor_err:.3g})"


@pytest.mark.parametrize("B, H, L, K, threshold, block", [
    (1, 1, 1, 3, 10.0, None),      # one token
    (2, 2, 2, 4, 10.0, None),
    (2, 3, 63, 12, 10.0, 64),      # one block short of 64, the threshold inside
    (1, 2, 64, 32, 64.0, 64),      # one full block, w constant up to L
    (2, 2, 65, 8, 0.5, 64),        # a second block of one query, every query past the threshold
    (1, 4, 300, 32, 20.0, None),   # blocks of the default size and a partial one, FIRE's 32 units
    (2, 2, 130, 6, 1000.0, None),  # the threshold past L: w constant (a Toeplitz bias)
])
def test_the_kernel_equals_the_dense_reference_forward_and_every_gradient(B, H, L, K, threshold, block, monkeypatch):
    if block is not None:
        monkeypatch.setattr(MK, "MLP_BLOCK", block)
    cpp, torch_kernel = _spy(monkeypatch)
    u, w = _fire(L, threshold, extra=3)  # u longer than L: its gradient past L is zero
    _compare(MK.mlp_attention, B, H, L, u, w, _mlp(H, K, seed=L), seed=L)
    assert cpp == ["forward", "backward"] and not torch_kernel


def test_units_switching_at_one_distance_and_exactly_at_their_kink(monkeypatch):
    """u = d and w = 1 on the first rows: units whose kink is an integer distance switch exactly there (their
    pre-activation 0 at that pair, off as torch's relu'(0) = 0), several at the same distance, units that
    switch off along the row (W1 < 0), units with W1 = 0 (on or off everywhere); a scale of 0.5."""
    cpp, _ = _spy(monkeypatch)
    L, H = 70, 3
    u = torch.arange(L, dtype=F64)
    w = torch.ones(L, dtype=F64)
    w[40:] = 0.5
    w1 = torch.tensor([1.0, 1.0, 2.0, -1.0, -0.5, 0.0, 0.0, 1.0])
    b1 = torch.tensor([-5.0, -5.0, -10.0, 7.0, 3.0, 1.0, -1.0, -64.0])
    w2 = torch.randn(H, 8, generator=torch.Generator().manual_seed(1), dtype=F64)
    _compare(MK.mlp_attention, 2, H, L, u, w, (w1.double(), b1.double(), w2, torch.zeros(H, dtype=F64)), scale=0.5)
    assert cpp == ["forward", "backward"]


def test_w_of_either_sign_and_a_decreasing_u_run_on_the_kernel(monkeypatch):
    """x = u[d] w[i] is monotone along a row whatever w[i]'s sign is, and for a non-increasing u too."""
    cpp, torch_kernel = _spy(monkeypatch)
    L, H = 90, 2
    u, w = _fire(L, 7.0)
    w = w * torch.where(torch.arange(L) % 3 == 0, -1.0, 1.0).double()
    w[5] = 0.0
    _compare(MK.mlp_attention, 1, H, L, u, w, _mlp(H, 10, seed=4))
    _compare(MK.mlp_attention, 2, H, L, -u, w.abs(), _mlp(H, 10, seed=5))
    assert cpp == ["forward", "backward"] * 2 and not torch_kernel


def test_float32_equals_the_reference(monkeypatch):
    cpp, _ = _spy(monkeypatch)
    L, H = 200, 4
    u, w = _fire(L, 30.0)
    _compare(MK.mlp_attention, 2, H, L, u, w, _mlp(H, 32, seed=2), dtype=torch.float32,
             chains=_float32_chains(2, H, L, 32))
    assert cpp == ["forward", "backward"]


def test_inputs_the_kernel_does_not_take_go_to_the_torch_kernel(monkeypatch):
    """A u that is not monotone over the first L distances (its tail past L does not count), or not finite: the
    torch kernel, still equal to the reference (or, with a NaN, NaN like it); bad shapes get its diagnostic."""
    cpp, torch_kernel = _spy(monkeypatch)
    L, H = 40, 2
    u, w = _fire(L, 5.0, extra=4)
    bumpy = u.clone()
    bumpy[17] = bumpy[18] + 0.01
    _compare(MK.mlp_attention, 1, H, L, bumpy, w, _mlp(H, 6, seed=3))
    assert torch_kernel == [1] and not cpp
    tail = u.clone()
    tail[L + 1] = -5.0  # past L: no pair reads it
    _compare(MK.mlp_attention, 1, H, L, tail, w, _mlp(H, 6, seed=3))
    assert cpp == ["forward", "backward"] and torch_kernel == [1]
    q = torch.randn(1, H, L, 16, dtype=F64)
    nan_w = w.clone()
    nan_w[3] = float("nan")
    assert torch.isnan(MK.mlp_attention(q, q, q, u, nan_w, *_mlp(H, 6, seed=3))).any() and torch_kernel == [1, 1]
    with pytest.raises(ShapeError, match="mlp_bias_attention"):
        MK.mlp_attention(q, q, q, u, w[:-1], *_mlp(H, 6, seed=3))


def test_without_the_build_the_torch_kernel_answers_quietly(monkeypatch, recwarn):
    """No compiler (or PEDSL_CPU_KERNELS off): the torch kernel, the same answer, no warning."""
    monkeypatch.setenv("CXX", "/no/such/compiler")
    monkeypatch.setattr(CK, "_state", [])
    torch_kernel = []
    real = MK.mlp_bias_attention
    monkeypatch.setattr(MK, "mlp_bias_attention", lambda *a, **kw: torch_kernel.append(1) or real(*a, **kw))
    u, w = _fire(50, 10.0)
    _compare(MK.mlp_attention, 1, 2, 50, u, w, _mlp(2, 8, seed=6))
    assert torch_kernel == [1] and not CK.state().loaded and MK.mlp_ops() is None and not recwarn.list


def test_the_fire_module_runs_on_the_kernel(monkeypatch):
    """The compiled FIRE module (float32, two blocks) calls the C++ kernel forward and backward and equals the
    torch kernel's answer: both float32, each within its chain's float32_bound of the module's float64 twin (on the
    torch kernel) plus 4x the torch kernel's own error there, so within twice that of each other."""
    cpp, torch_kernel = _spy(monkeypatch)
    torch.manual_seed(0)
    mod = compile_scheme(SCHEMES / "fire.pe", num_heads=4, head_dim=16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 100, 16, generator=g).requires_grad_(True) for _ in range(3))
    out = mod(q, k, v)
    grads = torch.autograd.grad(out.sum(), [q, *mod.parameters()])
    assert cpp == ["forward", "backward"] and not torch_kernel
    monkeypatch.setattr(MK, "runs_on_kernel", lambda *a: False)
    want = mod(q, k, v)
    wgrads = torch.autograd.grad(want.sum(), [q, *mod.parameters()])
    torch.manual_seed(0)
    twin = compile_scheme(SCHEMES / "fire.pe", num_heads=4, head_dim=16).double()
    q64 = q.detach().double().requires_grad_(True)
    ref = twin(q64, k.double(), v.double())
    refgrads = torch.autograd.grad(ref.sum(), [q64, *twin.parameters()])
    chains = _float32_chains(1, 4, 100, 32)
    for n, a, b, r in zip([chains["out"], chains["q"]] + [chains["w1"]] * len(grads), [out, *grads],
                          [want, *wgrads], [ref, *refgrads]):
        floor_err = float((b.double() - r).abs().max())
        bound = float32_bound(n, r) + 4 * floor_err
        assert float((a.double() - r).abs().max()) <= bound and float((a - b).abs().max()) <= 2 * bound


def test_threads_share_the_work_and_the_gradients_add_up(monkeypatch):
    """Three threads over B H = 4 (batch, head) pairs: each thread's u, w and MLP gradients added once."""
    cpp, _ = _spy(monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        u, w = _fire(150, 12.0)
        _compare(MK.mlp_attention, 2, 2, 150, u, w, _mlp(2, 16, seed=8))
    finally:
        torch.set_num_threads(before)
    assert cpp == ["forward", "backward"]
