"""The banded O(L N) kernels of sliding windows and chunks (pedsl/ops/window_kernels.py, the flash
path; the C++ kernel that takes windows in process has its own tests in test_band_kernel.py): forward
and gradients against a naive float64 band (N = 1, N >= L, L not a multiple of the block, many blocks),
through a compiled scheme against the float64 reference interpreter (GQA, bfloat16), the key span of
every kernel call, the fall-back where the band by positions is not the band by index, and the
generated module."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from compiler_helpers import SCHEMES, flash_path_only, forbid_single_token_layout, naive_band, spy_band_ops

from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.ops import window_kernels as W

H, D = 4, 8


def _grads(fn, q, k, v, w):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = fn(q, k, v)
    return [o.detach()] + [g.double() for g in torch.autograd.grad((o.double() * w).sum(), [q, k, v])]


def _qkv(B=2, L=21, Hq=H, Hkv=H, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


@pytest.mark.parametrize("block", [4, 128])
@pytest.mark.parametrize("L, N", [(21, 1), (21, 2), (21, 3), (21, 5), (23, 9), (21, 21), (21, 40), (300, 64),
                                  (300, 129), (257, 128), (300, 299)])
@pytest.mark.parametrize("kind", ["window", "chunk"])
def test_banded_kernels_equal_a_naive_band(kind, L, N, block, monkeypatch):
    monkeypatch.setattr(W, "BAND_BLOCK", block)
    q, k, v = _qkv(L=L, seed=L + N)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fast = W.sliding_window_attention if kind == "window" else W.chunked_attention
    got = _grads(lambda a, b, c: fast(a, b, c, N), q, k, v, w)
    want = _grads(lambda a, b, c: naive_band(a, b, c, **{kind: N}), q, k, v, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def _spy(monkeypatch, module=W):
    """Record the key count of every flash kernel call (forward and backward) of ``module``."""
    seen = []
    for name in ("FLASH", "FLASH_BACKWARD"):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kw):
            k = args[1] if _name == "FLASH" else args[2]
            seen.append((_name, k.shape[2]))
            return _real(*args, **kw)

        monkeypatch.setattr(module, name, spy)
    return seen


def _windowed(extra: str, base: str = "rope"):
    src = f'import "{SCHEMES / (base + ".pe")}"\nscheme s extends {base} {{\n{extra}\n}}'
    return (compile_scheme(src, num_heads=H, head_dim=D).double(),
            compile_scheme(src, num_heads=H, head_dim=D, backend="reference").double())


@pytest.mark.parametrize("extra", ["window = 1", "window = 2", "window = 7", "window = 300", "chunk = 6"])
@pytest.mark.parametrize("Hkv", [H, 2])
@pytest.mark.parametrize("kernel", ["c++", "flash"])
def test_a_windowed_rotation_scheme_runs_the_banded_kernel_exactly(extra, Hkv, kernel, monkeypatch):
    """RoPE inside a window (chunk) takes the banded kernels - a window the C++ kernel, or the flash path
    where it is unavailable - and equals the float64 reference interpreter, forward and gradients, with
    grouped key/value heads too; L = 37 is not a multiple of either's block."""
    monkeypatch.setattr(W, "BAND_BLOCK", 4)
    fast, ref = _windowed(extra)
    q, k, v = _qkv(L=37, Hkv=Hkv, seed=2)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    if kernel == "flash":
        flash_path_only(monkeypatch)
    cpp = spy_band_ops(monkeypatch) if kernel == "c++" else []
    seen = _spy(monkeypatch)
    got = _grads(fast, q, k, v, w)
    n = int(extra.split("=")[1])
    windowed = extra.startswith("window") and n < 37
    assert (cpp == ["forward", "backward"]) == (windowed and kernel == "c++")
    assert ({"FLASH", "FLASH_BACKWARD"} <= {s[0] for s in seen}) == (windowed and kernel == "flash")
    want = _grads(ref, q, k, v, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_bfloat16_stays_within_its_rounding_of_the_reference(monkeypatch):
    monkeypatch.setattr(W, "BAND_BLOCK", 16)
    fast, ref = _windowed("window = 24")
    fast = fast.to(torch.bfloat16)
    q, k, v = _qkv(L=200, seed=6)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    seen = _spy(monkeypatch)
    got = _grads(fast, *(t.to(torch.bfloat16) for t in (q, k, v)), w)
    assert seen
    want = _grads(ref, q, k, v, w)
    for a, b in zip(got, want):
        scale = float(b.abs().max())
        assert float((a.double() - b).abs().max()) < 0.03 * scale


@pytest.mark.parametrize("extra, span", [("window = 16", W.BAND_BLOCK + 16 - 1), ("chunk = 48", 48)])
def test_each_banded_call_reads_only_the_keys_it_can_see(extra, span, monkeypatch):
    """O(L N): no kernel call of a windowed (chunked) forward or backward sees more than BAND_BLOCK + N - 1
    (C) keys on the flash path; a chunked call goes through SDPA with the chunks as heads."""
    flash_path_only(monkeypatch)
    fast, _ = _windowed(extra)
    q, k, v = (t.requires_grad_(True) for t in _qkv(B=1, L=1000, seed=3))
    seen = _spy(monkeypatch)
    widths = []
    real_sdpa = W.F.scaled_dot_product_attention

    def sdpa(q, k, v, *a, **kw):
        widths.append(k.shape[2])
        return real_sdpa(q, k, v, *a, **kw)

    monkeypatch.setattr(W.F, "scaled_dot_product_attention", sdpa)
    fast(q, k, v).sum().backward()
    monkeypatch.undo()
    widths += [n for _, n in seen]
    assert widths and max(widths) <= span


def test_where_positions_are_not_consecutive_the_band_falls_back_to_the_masks(monkeypatch):
    """A window counts positions, not tokens: with positions 0, 2, 4, ... (or packed documents) the banded
    kernel does not apply and the general path still equals the reference."""
    flash_path_only(monkeypatch)  # the flash calls tell the band from the masks
    fast, ref = _windowed("window = 5")
    q, k, v = _qkv(L=30, seed=7)
    seen = _spy(monkeypatch)
    pos = (2 * torch.arange(30)).expand(2, 30)
    torch.testing.assert_close(fast(q, k, v, positions=pos), ref(q, k, v, positions=pos), rtol=1e-9, atol=1e-10)
    docs = torch.tensor([[0] * 12 + [1] * 18, [0] * 30])
    torch.testing.assert_close(fast(q, k, v, document_ids=docs), ref(q, k, v, document_ids=docs),
                               rtol=1e-9, atol=1e-10)
    assert not seen
    torch.testing.assert_close(fast(q, k, v, positions=pos + 7), ref(q, k, v, positions=pos + 7), rtol=1e-9,
                               atol=1e-10)
    fast(q, k, v, positions=torch.arange(3, 33).expand(2, 30))  # consecutive from 3: the band by index
    assert seen


def test_the_generated_module_runs_the_same_banded_kernel(tmp_path, monkeypatch):
    mod, ref = _windowed("window = 6")
    path = tmp_path / "banded.py"
    path.write_text(generate(mod.scheme, mod.plan))
    spec = importlib.util.spec_from_file_location("gen_banded", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    seen, real = [], gen.window_attend  # the band's dispatch: the C++ band kernel where built, else the flash path
    monkeypatch.setattr(gen, "window_attend", lambda *a: seen.append(a[-2:]) or real(*a))
    q, k, v = _qkv(L=300, seed=8)
    out = gen.Module().double()(q, k, v)
    assert seen and set(seen) == {(6, None)}
    torch.testing.assert_close(out, ref(q, k, v), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("extra", ["window = 5", "window = 1", "chunk = 4", "window = 70"])
def test_windowed_decoding_takes_the_one_token_fast_path_and_equals_one_forward(extra, monkeypatch):
    """A windowed (chunked) RoPE scheme decodes token by token without the general layout (made to fail
    for one-token calls), equals one full forward with grouped key/value heads, and its cache stays
    bounded by the window plus the batch of dead tokens trimmed at once."""
    from pedsl.compiler import stream

    fast, _ = _windowed(extra)
    assert stream._fast_decode_plan(fast) is not None
    B, L, P = 2, 300, 7
    q, k, v = _qkv(B=B, L=L, Hkv=2, seed=9)
    with torch.no_grad():
        full = fast(q, k, v)
        forbid_single_token_layout(monkeypatch)
        cache = fast.new_cache(B)
        outs, most = [fast(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=cache)], 0
        for t in range(P, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache))
            most = max(most, len(cache))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
    n = int(extra.split("=")[1])
    assert cache.dropped > 0 and most <= n + max(64, n) + 1
