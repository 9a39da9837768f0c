"""Multi-axis positions at run time: the shape of ``positions`` (diagnostics), decoding after an image
(every axis continues at the largest position + 1, as Hugging Face's rope_deltas), half precision, and
the generated module. (Documents, padding, GQA and every backend against the reference: the library-wide
tests of test_compiler_stream.py and test_compiler_differential.py, which give these schemes (A, B, L).)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import SCHEMES, run_cli
from pedsl.compiler import compile_scheme
from pedsl.errors import ShapeError

F64 = torch.float64


def _qkv(B, Hq, Hkv, L, D, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, L, D, generator=g, dtype=dtype),
            *(torch.randn(B, Hkv, L, D, generator=g, dtype=dtype) for _ in range(2)))


def _prompt_with_image(B, text, rows, cols):
    """(3, B, L): text at 0..text-1, then a rows x cols image at t = text, h = text + r, w = text + c."""
    t = torch.arange(text).expand(3, text)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    img = torch.stack([torch.zeros(rows * cols, dtype=torch.long), r.flatten(), c.flatten()]) + text
    return torch.cat([t, img], 1)[:, None].expand(3, B, -1).contiguous()


@pytest.mark.parametrize("name", ["mrope", "mrope_interleaved", "rope_3d"])
def test_decoding_after_an_image_continues_every_axis_past_the_largest_position(name):
    """Prefill text + image with (3, B, L) positions, then decode with no positions (one token, then a chunk):
    equal to one forward whose new tokens sit at max(prefill positions) + 1, + 2, ... on every axis."""
    mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=32).double()
    B, P = 2, _prompt_with_image(2, 3, 3, 4)
    Lp, extra = P.shape[-1], 4
    q, k, v = _qkv(B, 4, 2, Lp + extra, 32)
    nxt = int(P.max()) + 1
    full_pos = torch.cat([P, (nxt + torch.arange(extra)).expand(3, B, extra)], -1)
    full = mod(q, k, v, positions=full_pos)
    cache = mod.new_cache(B)
    outs = [mod(q[:, :, :Lp], k[:, :, :Lp], v[:, :, :Lp], positions=P, cache=cache)]
    for a, b in ((Lp, Lp + 1), (Lp + 1, Lp + extra)):
        outs.append(mod(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], cache=cache))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-11)
    assert int(cache.last_pos[0]) == nxt + extra - 1
    # the reference backend agrees through its own cache of raw inputs
    ref = compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=32, backend="reference").double()
    cache = ref.new_cache(B)
    outs = [ref(q[:, :, :Lp], k[:, :, :Lp], v[:, :, :Lp], positions=P, cache=cache)]
    outs.append(ref(q[:, :, Lp:], k[:, :, Lp:], v[:, :, Lp:], cache=cache))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-11)


def test_decoding_with_positions_per_axis_matches_one_forward():
    """Chunks that give their own (3, B, chunk) positions (a second image while decoding) equal one forward."""
    mod = compile_scheme(SCHEMES / "mrope.pe", num_heads=2, head_dim=16).double()
    P = torch.cat([_prompt_with_image(1, 2, 2, 3), _prompt_with_image(1, 0, 2, 2) + 9], -1)
    L = P.shape[-1]
    q, k, v = _qkv(1, 2, 2, L, 16, seed=3)
    full = mod(q, k, v, positions=P)
    cache = mod.new_cache(1)
    outs = [mod(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions=P[..., a:b], cache=cache)
            for a, b in ((0, 5), (5, 6), (6, L))]
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("bad, words", [
    (lambda B, L: torch.zeros(2, B, L, dtype=torch.long), "(A, B, L) = (3, 2, 6)"),
    (lambda B, L: torch.zeros(B, L, dtype=torch.long), "3 position axes (t, h, w)"),
    (lambda B, L: torch.zeros(3, B, L + 1, dtype=torch.long), "got (3, 2, 7)"),
    (lambda B, L: torch.zeros(3, B, L), "torch.float32"),
    (lambda B, L: [[0] * L] * B, "got list"),
])
def test_positions_of_the_wrong_shape_are_a_shape_error_with_a_hint(bad, words):
    mod = compile_scheme(SCHEMES / "mrope.pe", num_heads=2, head_dim=16)
    q, k, v = _qkv(2, 2, 2, 6, 16, dtype=torch.float32)
    with pytest.raises(ShapeError) as info:
        mod(q, k, v, positions=bad(2, 6))
    assert words in str(info.value)
    assert "expand(3, 2, 6)" in info.value.hint


def test_a_one_axis_scheme_takes_one_row_of_axis_positions():
    mod = compile_scheme(SCHEMES / "rope.pe", num_heads=2, head_dim=16).double()
    q, k, v = _qkv(2, 2, 2, 6, 16)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]])
    torch.testing.assert_close(mod(q, k, v, positions=pos[None]), mod(q, k, v, positions=pos))
    with pytest.raises(ShapeError, match="one position axis"):
        mod(q, k, v, positions=torch.stack([pos, pos]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_with_axis_positions_is_as_accurate_as_a_hand_written_layer(dtype):
    """mrope at L = 1024 (a 32 x 32 image after text) in half precision: error against float64 within 2x of
    a hand-written layer (q, k rotated exactly from the rounded inputs, rounded once, SDPA in dtype)."""
    D, H = 32, 2
    mod = compile_scheme(SCHEMES / "mrope.pe", num_heads=H, head_dim=D)
    P = _prompt_with_image(1, 0, 32, 32)
    q, k, v = (t.to(dtype) for t in _qkv(1, H, H, P.shape[-1], D, seed=5, dtype=torch.float32))
    exact = mod.double()(q.double(), k.double(), v.double(), positions=P)
    ours = mod.to(dtype)(q, k, v, positions=P).double()
    sec = [D // 2 - 2 * (D * 3 // 16), D * 3 // 16, D * 3 // 16]
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor(sec))
    inv = 1e6 ** (-torch.arange(D // 2, dtype=F64) * 2 / D)
    ang = P[:, 0].T[:, axis].to(F64) * inv  # (L, D/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(x):
        x = x.double()
        return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

    base = F.scaled_dot_product_attention(rot(q).to(dtype), rot(k).to(dtype), v, is_causal=True).double()
    err, err_base = (ours - exact).abs().max(), (base - exact).abs().max()
    assert err <= 2 * err_base, (float(err), float(err_base))


def test_generated_module_takes_axis_positions_and_decodes(tmp_path):
    from compiler_helpers import assert_generated_module_matches
    from pedsl.compiler.codegen import generate

    mod = compile_scheme(SCHEMES / "mrope_interleaved.pe", num_heads=2, head_dim=32)
    src = generate(mod.scheme, mod.plan)
    assert "AXES = ('t', 'h', 'w')" in src
    assert_generated_module_matches(mod, src, tmp_path / "mrope_i.py", lengths=(5, 23))
    import importlib.util

    spec = importlib.util.spec_from_file_location("mrope_i_dec", tmp_path / "mrope_i.py")
    gen_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_mod)
    gen = gen_mod.Module().double()
    P = _prompt_with_image(1, 2, 2, 3)
    q, k, v = _qkv(1, 2, 2, P.shape[-1] + 2, 32)
    c1, c2 = gen.new_cache(1), mod.new_cache(1)
    Lp = P.shape[-1]
    for m, c in ((gen, c1), (mod, c2)):
        m(q[:, :, :Lp], k[:, :, :Lp], v[:, :, :Lp], positions=P, cache=c)
    torch.testing.assert_close(gen(q[:, :, Lp:], k[:, :, Lp:], v[:, :, Lp:], cache=c1),
                               mod(q[:, :, Lp:], k[:, :, Lp:], v[:, :, Lp:], cache=c2), rtol=1e-10, atol=1e-11)


def test_check_reports_axis_errors_with_exit_1(tmp_path):
    f = tmp_path / "bad.pe"
    f.write_text('scheme s {\n  axes t, h, w\n  qk: rotate(geometric(10000) * sections(position, [4, 6, 5]))\n}\n')
    code, out, err = run_cli("check", str(f))
    assert code == 1
    assert "E232" in out + err and "add up to 15 pairs" in out + err


MIXED = """scheme mixed "per-head frequencies mixing both axes (RoPE-Mixed's form, static)" {
  axes h, w
  param base: float (> 1) = 100.0
  qk: rotate(geometric(base) * (position.h * (1 + slopes(heads)) + position.w * (2 - slopes(heads))))
}
"""


def _naive_mixed(q, k, v, P, base=100.0):
    """Per head h, pair k: phase = w_k ((1 + s_h) p_h + (2 - s_h) p_w), halves pairs, rotated by naive loops."""
    B, H, L, D = q.shape
    s = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], dtype=F64)
    w = base ** (-torch.arange(D // 2, dtype=F64) * 2 / D)
    out_q, out_k = q.clone(), k.clone()
    for b in range(B):
        for h in range(H):
            for t in range(L):
                for j in range(D // 2):
                    ph = w[j] * ((1 + s[h]) * P[0, b, t] + (2 - s[h]) * P[1, b, t])
                    c, sn = torch.cos(ph), torch.sin(ph)
                    for x, o in ((q, out_q), (k, out_k)):
                        a, bb = x[b, h, t, j], x[b, h, t, j + D // 2]
                        o[b, h, t, j], o[b, h, t, j + D // 2] = a * c - bb * sn, bb * c + a * sn
    return F.scaled_dot_product_attention(out_q, out_k, v, is_causal=True)


def test_per_head_phases_mixing_axes_match_naive_loops_with_gqa_decoding_and_codegen(tmp_path):
    from compiler_helpers import assert_generated_module_matches
    from pedsl.compiler.codegen import generate

    mod = compile_scheme(MIXED, num_heads=4, head_dim=8).double()
    assert mod.plan.transports[0].table == "per token"
    P = _prompt_with_image(2, 1, 2, 3)[1:]  # (h, w) of a 2 x 3 image after one text token
    q, k, v = _qkv(2, 4, 4, P.shape[-1], 8, seed=6)
    torch.testing.assert_close(mod(q, k, v, positions=P), _naive_mixed(q, k, v, P), rtol=1e-10, atol=1e-11)
    # no positions: every axis at 0..L-1 (the fused path)
    P0 = torch.arange(P.shape[-1]).expand(2, 2, -1)
    torch.testing.assert_close(mod(q, k, v), _naive_mixed(q, k, v, P0), rtol=1e-10, atol=1e-11)
    # GQA: k, v of 2 heads, each query head rotating its own copy
    kv2 = k[:, ::2], v[:, ::2]
    rep = [t.repeat_interleave(2, 1) for t in kv2]
    torch.testing.assert_close(mod(q, *kv2, positions=P), mod(q, *rep, positions=P), rtol=1e-10, atol=1e-11)
    # prefill + decoding equals one forward
    full = mod(q, *kv2, positions=P)
    c = mod.new_cache(2)
    outs = [mod(q[:, :, :4], kv2[0][:, :, :4], kv2[1][:, :, :4], positions=P[..., :4], cache=c),
            mod(q[:, :, 4:], kv2[0][:, :, 4:], kv2[1][:, :, 4:], positions=P[..., 4:], cache=c)]
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-10, atol=1e-11)
    ref = compile_scheme(MIXED, num_heads=4, head_dim=8, backend="reference").double()
    torch.testing.assert_close(ref(q, k, v, positions=P), mod(q, k, v, positions=P), rtol=1e-10, atol=1e-11)
    assert_generated_module_matches(mod, generate(mod.scheme, mod.plan), tmp_path / "mixed.py", lengths=(3, 12))
