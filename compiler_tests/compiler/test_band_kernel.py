"""The C++ sliding-window kernel (pedsl/ops/band_kernel.cpp, loaded by band_kernel.py): forward and
gradients against a naive float64 band at the boundaries (N = 1, 2, N >= L, L not a multiple of the block,
one block, many), with grouped key/value heads; float32 against the flash path; the general forward's
dispatch to it; and the flash path where it cannot be built (no compiler, PEDSL_CPU_KERNELS off); the
shared build's folder name (pedsl/ops/cpu_kernels.py; its cache's hostile cases: test_kernel_cache.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from compiler_helpers import SCHEMES, band_kernel_or_skip, float32_bound, naive_band, spy_band_ops
from pedsl.compiler import band_dispatch, compile_scheme
from pedsl.ops import band_kernel as BK
from pedsl.ops import cpu_kernels as CK
from pedsl.ops import window_kernels as W


def _qkv(B, Hq, Hk, L, D, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hk, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


def _grads(fn, q, k, v, seed=1):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = fn(q, k, v)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return [o.detach().double()] + [g.double() for g in torch.autograd.grad((o.double() * w).sum(), [q, k, v])]


@pytest.mark.parametrize("L, N", [(1, 1), (5, 1), (37, 1), (37, 2), (37, 3), (37, 36), (37, 37), (37, 100),
                                  (64, 64), (65, 64), (130, 33), (200, 64), (300, 129), (257, 300)])
@pytest.mark.parametrize("B, Hq, Hk", [(2, 4, 4), (1, 4, 2), (2, 3, 1)])
def test_the_kernel_equals_a_naive_band_forward_and_backward(L, N, B, Hq, Hk):
    """float64, the kernel called directly (so N >= L runs it too): each query sees its last N keys,
    the first queries fewer (the window reaching before 0); query heads share key/value heads."""
    band_kernel_or_skip()
    q, k, v = _qkv(B, Hq, Hk, L, 16, seed=L * 1000 + N)
    got = _grads(lambda a, b, c: BK.BandAttention.apply(a, b, c, N), q, k, v)
    want = _grads(lambda a, b, c: naive_band(a, b, c, window=N), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("threads", [3, 8])
@pytest.mark.parametrize("L, N", [(37, 5), (300, 20), (300, 64), (300, 65), (300, 150), (600, 129)])
def test_threads_split_the_backward_without_racing(L, N, threads):
    """With fewer key/value heads than threads the backward cuts each head's query blocks into segments
    (even ones together, then odd ones): the gradients equal the band's, whatever the split."""
    band_kernel_or_skip()
    q, k, v = _qkv(1, 2, 1, L, 8, seed=L + N)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _grads(lambda a, b, c: BK.BandAttention.apply(a, b, c, N), q, k, v)
    finally:
        torch.set_num_threads(before)
    want = _grads(lambda a, b, c: naive_band(a, b, c, window=N), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("L, N", [(700, 100), (1000, 300), (333, 65)])
def test_float32_agrees_with_the_flash_path(L, N):
    """float32 at head dim 64, against the flash-kernel path it replaces (and both near the float64 band)."""
    band_kernel_or_skip()
    q, k, v = _qkv(1, 4, 2, L, 64, seed=N, dtype=torch.float32)
    got = _grads(lambda a, b, c: BK.BandAttention.apply(a, b, c, N), q, k, v)
    flash = _grads(lambda a, b, c: W.banded_attention(a, b, c, N, None), q, k, v)
    want = _grads(lambda a, b, c: naive_band(a, b, c, window=N), *(t.double() for t in (q, k, v)))
    # the chain of an output or a gradient: a score's D channels, the N keys of the softmax and its weighted
    # sum, and in the backward the D channels of dO v and the N keys dS is summed over
    n = 2 * N + 2 * 64
    for a, f, b in zip(got, flash, want):
        assert (a.double() - b).abs().max() <= float32_bound(n, b)
        assert (a - f).abs().max() <= 2 * float32_bound(n, b)  # two float32 computations, each within it


def test_the_output_does_not_read_keys_outside_the_window():
    """Keys and values older than the window (or later than the query) do not change a query's output."""
    band_kernel_or_skip()
    q, k, v = _qkv(1, 2, 2, 300, 16, seed=5)
    out = BK.BandAttention.apply(q, k, v, 50)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :150], v2[:, :, :150] = 1e3, -1e3  # before the window of query 199
    k2[:, :, 200:], v2[:, :, 200:] = -1e3, 1e3  # after it
    out2 = BK.BandAttention.apply(q, k2, v2, 50)
    torch.testing.assert_close(out2[:, :, 199], out[:, :, 199], rtol=0, atol=1e-12)
    assert not torch.allclose(out2[:, :, 150], out[:, :, 150])


def test_the_ops_have_shapes_for_tracing():
    """The Meta kernels (torch.compile's fake tensors) give the CPU kernel's output shapes."""
    ops = band_kernel_or_skip()
    q, k = torch.empty(2, 4, 9, 8, device="meta"), torch.empty(2, 2, 9, 8, device="meta")
    out, lse = ops.forward(q, k, k, 3, 64)
    assert out.shape == q.shape and lse.shape == (2, 4, 9)
    dq, dk, dv, dg, dt, ds = ops.backward(q, q, k, k, q, lse, 3, 64, lse, None, lse, 0.5, True, False, True)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    assert dg.shape == ds.shape == (2, 4, 9) and dg.dtype == ds.dtype == torch.float64 and dt.numel() == 0


def test_bad_inputs_are_refused_by_the_kernel():
    ops = band_kernel_or_skip()
    q = torch.randn(1, 3, 8, 4)
    with pytest.raises(RuntimeError, match="Hq a multiple of Hk"):
        ops.forward(q, torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), 3, 64)
    with pytest.raises(RuntimeError, match="float32 or all float64"):
        ops.forward(q.half(), q.half(), q.half(), 3, 64)
    with pytest.raises(RuntimeError, match="soft cap must be finite"):
        ops.forward(q, q, q, 3, 64, None, None, None, -1.0)
    with pytest.raises(RuntimeError, match="sink logits must be"):
        ops.forward(q, q, q, 3, 64, None, None, torch.zeros(1, 3, 8, dtype=torch.float64))


@pytest.mark.parametrize("dtype, kernel", [(torch.float64, True), (torch.float32, True), (torch.bfloat16, False)])
def test_the_general_forward_runs_windows_on_the_kernel(dtype, kernel, monkeypatch):
    """A RoPE-in-a-window scheme calls the C++ kernel once forward and once backward in float32 and
    float64 (bfloat16 keeps the flash path) and equals the float64 reference interpreter."""
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{\nwindow = 9\n}}'
    fast = compile_scheme(src, num_heads=4, head_dim=8).to(dtype)
    ref = compile_scheme(src, num_heads=4, head_dim=8, backend="reference").double()
    seen = spy_band_ops(monkeypatch)
    q, k, v = _qkv(2, 4, 2, 70, 8, seed=3)
    got = _grads(lambda a, b, c: fast(a, b, c), *(t.to(dtype) for t in (q, k, v)))
    want = _grads(ref, q, k, v)
    assert seen == (["forward", "backward"] if kernel else [])
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == torch.float64 else dict(rtol=0.05, atol=0.05)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol)


def test_without_a_compiler_the_flash_path_answers_quietly(monkeypatch, caplog, recwarn, tmp_path):
    """No compiler: no build is tried, one debug-level line says why, no warning, and the same band
    through the flash path; PEDSL_CPU_KERNELS off (in any spelling) never looks for a build."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(CK, "run_build", lambda *a, **kw: pytest.fail("built without a compiler"))
    monkeypatch.setattr(CK, "_state", [])
    monkeypatch.delenv(CK.SWITCH, raising=False)  # the check must run whatever the caller's setting
    caplog.set_level(logging.DEBUG, logger=CK.__name__)
    flash = []
    real = W.FLASH
    monkeypatch.setattr(W, "FLASH", lambda *a, **kw: flash.append(1) or real(*a, **kw))
    q, k, v = _qkv(1, 2, 2, 40, 8, seed=9)
    got = _grads(lambda a, b, c: band_dispatch.banded_attention(a, b, c, 6, None), q, k, v)
    want = _grads(lambda a, b, c: naive_band(a, b, c, window=6), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
    assert not CK.state().loaded and CK.state().reason == "no C++ compiler" and flash
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "no C++ compiler" in caplog.records[0].getMessage()
    assert not recwarn.list
    monkeypatch.setattr(CK, "verify", lambda *a, **kw: pytest.fail("looked for a build although off"))
    for off in ("0", "false", "OFF", " no ", "00"):
        monkeypatch.setattr(CK, "_state", [])
        monkeypatch.setenv(CK.SWITCH, off)
        assert BK.band_ops() is None and CK.state().reason == f"{CK.SWITCH} is off"


def test_the_build_is_named_by_source_flags_and_cpu(monkeypatch, tmp_path):
    """A changed source or header text, flags or compiler builds into a folder of its own instead of rebuilding
    another one's; the same text elsewhere (another checkout, a generated module's copy) shares the build; the
    CPU counts only where the flags make code for the build machine (``-march=native``): the default flags are
    portable."""
    name = CK.extension_name()
    assert name.startswith("pedsl_kernels_") and name == CK.extension_name()
    monkeypatch.setattr(CK, "CFLAGS", CK.CFLAGS + ("-g",))
    assert CK.extension_name() != name
    monkeypatch.undo()
    assert not any("native" in flag for flag in CK.CFLAGS) and "-ffp-contract=off" in CK.CFLAGS
    monkeypatch.setattr(CK, "cpu_identity", lambda: "another cpu")
    assert CK.extension_name() == name
    monkeypatch.setattr(CK, "CFLAGS", CK.CFLAGS + ("-march=native",))
    native = CK.extension_name()
    monkeypatch.setattr(CK, "cpu_identity", lambda: "a third cpu")
    assert CK.extension_name() != native
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "clang++")
    assert CK.extension_name() != name
    monkeypatch.undo()
    for attr in ("SOURCES", "HEADERS"):
        first = getattr(CK, attr)[0]
        copy = tmp_path / attr / first.name
        copy.parent.mkdir()
        copy.write_text(first.read_text(encoding="utf-8"), encoding="utf-8")
        monkeypatch.setattr(CK, attr, (copy, *getattr(CK, attr)[1:]))
        assert CK.extension_name() == name
        copy.write_text(first.read_text(encoding="utf-8") + "\n// changed\n", encoding="utf-8")
        assert CK.extension_name() != name
        monkeypatch.undo()
    assert CK.extension_name() == name
