"""PaTH and PaTH-FoX inside a sliding window or chunk through the general forward: the blockwise windowed
kernel (several blocks of queries, windows and chunks not multiples of the block, packed documents,
left padding) against the float64 reference interpreter, forward and gradients (q, k, v and every
parameter: the Householder directions and strengths, the forget gate); decoding with a cache equals
one forward; nothing of (L, L) is allocated at L = 2000, N = 128."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES, fast_and_reference, largest_allocation
from pedsl.compiler import compile_scheme
from pedsl.compiler.general import path as general_path

H, D = 2, 8


def _pair(base: str, extra: str):
    return fast_and_reference(base, extra, H, D)


def _qkvx(B, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    return q, k, v, torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64)


def _small_blocks_and_no_decode_rule(monkeypatch):
    """Blocks of 8 steps (so a short sequence spans several), and a fresh call never runs the decode rule."""
    monkeypatch.setattr(general_path, "PATH_BLOCK", 8)

    def refuse(*a, **kw):
        raise AssertionError("a fresh windowed PaTH call ran the token-by-token decode rule")

    monkeypatch.setattr(general_path, "_path_decode_rule", refuse)


CASES = [("path", "window = 1"), ("path", "window = 11"), ("path_fox", "window = 11"),
         ("path_fox", "window = 16"), ("path_fox", "window = 60"), ("path", "chunk = 7"),
         ("path_fox", "chunk = 7"), ("path_fox", "chunk = 8\nsink = token"), ("path_fox", "window = 5\nsink = logit")]


@pytest.mark.parametrize("base, extra", CASES, ids=[f"{b}-{e}".replace("\n", "+").replace(" ", "") for b, e in CASES])
def test_windowed_path_matches_the_reference_with_gradients(base, extra, monkeypatch):
    """L = 36 in blocks of 8; documents shorter and longer than the window; left padding."""
    _small_blocks_and_no_decode_rule(monkeypatch)
    fast, ref = _pair(base, extra)
    B, L = 2, 36
    docs = torch.tensor([[0] * 4 + [1] * 23 + [2] * 9, [0] * L])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :5] = False
    outs = []
    for mod in (fast, ref):
        q, k, v, x = _qkvx(B, L)
        o = mod(q, k, v, x=x, document_ids=docs, attn_mask=mask)
        wgt = torch.randn(o.shape, generator=torch.Generator().manual_seed(5), dtype=o.dtype)
        params = list(mod.parameters())
        grads = torch.autograd.grad((o * wgt).sum(), [q, k, v, *params], allow_unused=True, materialize_grads=True)
        outs.append((o, grads, [n for n, _ in mod.named_parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-9, atol=1e-10)
    assert outs[0][2] == outs[1][2]
    for name, a, b in zip(["q", "k", "v", *outs[0][2]], outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9, msg=lambda m, n=name: f"{n}: {m}")
    if base == "path_fox":  # the forget gate's parameters learn through the window (N > 1)
        gate = [g for n, g in zip(outs[0][2], outs[0][1][3:]) if "bias" in n]
        assert gate and any(float(g.abs().max()) > 0 for g in gate)


@pytest.mark.parametrize("extra", ["window = 70", "chunk = 50\nsink = logit"])
def test_windowed_path_fox_decoding_equals_one_forward(extra, monkeypatch):
    """A prefill of 100 tokens through the windowed kernel, then one token at a time past several windows:
    the cache holds only what the window can still see."""
    monkeypatch.setattr(general_path, "PATH_BLOCK", 16)
    fast, _ = _pair("path_fox", extra)
    B, L, P = 2, 260, 100
    q, k, v, x = (t.detach() for t in _qkvx(B, L, seed=4))
    with torch.no_grad():
        full = fast(q, k, v, x=x)
        cache = fast.new_cache(B)
        outs = [fast(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=cache, x=x[:, :P])]
        most = 0
        for t in range(P, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache, x=x[:, s]))
            most = max(most, len(cache))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
    assert cache.dropped > 0 and most <= 2 * 70 + 1


def test_windowed_path_fox_allocates_nothing_of_the_square_of_the_length():
    """Forward and backward of the module at L = 2000, N = 128: the largest allocation is O(L N)."""
    src = f'import "{SCHEMES / "path_fox.pe"}"\nscheme s extends path_fox {{ window = 128 }}'
    mod = compile_scheme(src, num_heads=H, head_dim=16, d_model=D_MODEL)
    B, L = 1, 2000
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, 16, generator=g).requires_grad_(True) for _ in range(3))
    x = torch.randn(B, L, D_MODEL, generator=g)
    most = largest_allocation(lambda: mod(q, k, v, x=x).sum().backward())
    assert most < 4 * B * H * L * L / 4  # a quarter of one float32 (H, L, L) score tensor
    assert float(k.grad.abs().max()) > 0


GENERATED = [("path_fox", ""), ("path", "window = 11"), ("path_fox", "chunk = 8\nsink = token")]


@pytest.mark.parametrize("base, extra", GENERATED, ids=[f"{b}-{e}".replace("\n", "+").replace(" ", "") or b
                                                       for b, e in GENERATED])
def test_generated_path_module_runs_the_blockwise_kernels_with_the_same_gradients(base, extra, tmp_path,
                                                                                  monkeypatch):
    """A module written by `pedsl compile` carries PaTH's kernels: a fresh call never runs the token-by-token
    decode rule (whose autograd graph holds every moved key, O(L^2 D)), and its output and gradients are the
    in-process module's. L = 150: three blocks of the full kernel, many of the windowed one; left padding."""
    import importlib.util

    from pedsl.compiler.codegen import generate

    fast, _ = _pair(base, extra)
    file = tmp_path / "generated_path.py"
    file.write_text(generate(fast.scheme, fast.plan, d_model=D_MODEL), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("generated_path", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module()
    gen.load_state_dict(fast.state_dict())
    gen.double()
    monkeypatch.setattr(module, "PATH_BLOCK", 8)

    def refuse(*a, **kw):
        raise AssertionError("the generated module ran PaTH's decode rule on a fresh sequence")

    monkeypatch.setattr(module, "_path_decode_rule", refuse)
    B, L = 2, 150
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :5] = False
    outs = []
    for mod in (gen, fast):
        q, k, v, x = _qkvx(B, L, seed=4)
        o = mod(q, k, v, x=x, attn_mask=mask)
        wgt = torch.randn(o.shape, generator=torch.Generator().manual_seed(6), dtype=o.dtype)
        outs.append((o, torch.autograd.grad((o * wgt).sum(), [q, k, v, *mod.parameters()])))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-9, atol=1e-10)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
