"""Multi-axis positions against the implementations people use, in float64, outputs and gradients:
Hugging Face's Qwen2-VL M-RoPE and Qwen3-VL interleaved M-RoPE (text rotary + apply_rotary_pos_emb),
Qwen2-VL's vision rotary (axial 2-D over the whole head), rotary-embedding-torch's axial frequencies
(rope_2d in the interleaved layout), and the float64 reference backend."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import F32_EPS, SCHEMES, float32_bound
from hf_helpers import float32_table_rounding, inv_freq_rounding
from pedsl.compiler import compile_scheme

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import modeling_qwen2_vl as q2  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as q3  # noqa: E402

F64 = torch.float64


def _qkv(B, H, L, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g, dtype=F64, requires_grad=True) for _ in range(3)]


def _image_positions(B, text, rows, cols, tail, frames=1):
    """Qwen2-VL's get_rope_index layout: text, then a (frames x rows x cols) grid starting at the text's
    end, then text continuing at the largest position + 1: (3, B, L)."""
    t = torch.arange(text)
    pos = [torch.stack([t, t, t])]
    f, r, c = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij")
    pos.append(torch.stack([f.flatten(), r.flatten(), c.flatten()]) + text)
    nxt = int(torch.cat(pos, 1).max()) + 1
    pos.append(torch.arange(tail).expand(3, tail) + nxt)
    return torch.cat(pos, 1)[:, None].expand(3, B, -1).contiguous()


def _hf_attention(q, k, v, cos, sin, apply):
    """HF's rotation (cos, sin (B, L, D)) then causal SDPA."""
    qe, ke = apply(q, k, cos, sin)
    return F.scaled_dot_product_attention(qe, ke, v, is_causal=True)


def _check(mod, hf_out_fn, q, k, v, positions):
    ours = mod(q, k, v, positions=positions)
    theirs = hf_out_fn(q, k, v)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-11)
    w = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    g1 = torch.autograd.grad((ours * w).sum(), (q, k, v))
    g2 = torch.autograd.grad((theirs * w).sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def _qwen_text_cos_sin(rot, positions, base, D):
    """HF's recomposition of a (3, B, L, D/2) float64 frequency table (the rotary class computes its table in
    float32; the assignment of pairs to axes is what is checked here, in float64)."""
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=F64) / D))
    freqs = positions[..., None].to(F64) * inv
    return rot.recomposition_frequencies(freqs.cos().clone()), rot.recomposition_frequencies(freqs.sin().clone())


@pytest.mark.parametrize("D", [16, 32, 128])
def test_mrope_matches_qwen2_vl(D):
    base = 1_000_000.0
    sec = [D // 8, D * 3 // 16, D * 3 // 16]
    cfg = q2.Qwen2VLTextConfig(hidden_size=D * 2, num_attention_heads=2, num_key_value_heads=2, head_dim=D,
                               rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": sec})
    rot = q2.Qwen2VLRotaryEmbedding(cfg)
    assert rot.mrope_section == sec
    mod = compile_scheme(SCHEMES / "mrope.pe", num_heads=2, head_dim=D).double()
    P = _image_positions(2, 3, 3, 4, 3)
    q, k, v = _qkv(2, 2, P.shape[-1], D)
    cos, sin = _qwen_text_cos_sin(rot, P, base, D)
    _check(mod, lambda q, k, v: _hf_attention(q, k, v, cos, sin, q2.apply_rotary_pos_emb), q, k, v, P)
    # and HF's own float32 tables: the same angles up to float32
    cos32, sin32 = rot(torch.zeros(1, dtype=torch.float32), P)
    table = float32_table_rounding(float(P.max()), base)  # float32 phases up to the largest position
    torch.testing.assert_close(cos32.double(), cos, rtol=0, atol=table)
    torch.testing.assert_close(sin32.double(), sin, rtol=0, atol=table)


@pytest.mark.parametrize("D", [32, 64, 128])
def test_mrope_interleaved_matches_qwen3_vl(D):
    base = 5_000_000.0
    s = D * 5 // 32
    sec = [D // 2 - 2 * s, s, s]
    cfg = q3.Qwen3VLTextConfig(hidden_size=D * 2, num_attention_heads=2, num_key_value_heads=2, head_dim=D,
                               rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": sec,
                                                "mrope_interleaved": True})
    rot = q3.Qwen3VLTextRotaryEmbedding(cfg)
    assert rot.mrope_section == sec
    mod = compile_scheme(SCHEMES / "mrope_interleaved.pe", num_heads=2, head_dim=D).double()
    P = _image_positions(2, 2, 3, 3, 2, frames=2)
    q, k, v = _qkv(2, 2, P.shape[-1], D, seed=1)
    cos, sin = _qwen_text_cos_sin(rot, P, base, D)
    _check(mod, lambda q, k, v: _hf_attention(q, k, v, cos, sin, q3.apply_rotary_pos_emb), q, k, v, P)


def test_qwen2_vl_vision_rotary_is_axial_sections_over_the_whole_head():
    """Qwen2-VL's vision tower: D/4 frequencies base^(-2j / (D/2)), the first D/4 pairs read h, the rest w,
    rotate_half over the whole head: sections(position, [D/4, D/4]) with the frequencies repeated."""
    D, base = 32, 10000.0
    cfg = q2.Qwen2VLVisionConfig(embed_dim=D * 2, num_heads=2)
    rot = q2.Qwen2VLVisionRotaryEmbedding(cfg)
    inv = 1.0 / (base ** (torch.arange(0, D // 2, 2, dtype=F64) / (D // 2)))
    freqs = ", ".join(repr(float(x)) for x in torch.cat([inv, inv]))
    text = f"""scheme vision {{
      axes h, w
      qk: rotate(per_pair([{freqs}]) * sections(position, [{D // 4}, {D // 4}]))
    }}"""
    mod = compile_scheme(text, num_heads=2, head_dim=D).double()
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
    hw = torch.stack([rows.flatten(), cols.flatten()])  # (2, N): HF's (h, w) rows
    P = hw[:, None].expand(2, 2, -1).contiguous()
    f = hw.T[:, :, None].to(F64) * inv  # (N, 2, D/4) float64, HF's recomposition
    cos, sin = rot.recomposition_frequencies(f.cos()), rot.recomposition_frequencies(f.sin())
    q, k, v = _qkv(2, 2, P.shape[-1], D, seed=2)

    # apply_rotary_pos_emb_vision is the same rotate_half rotation cast to float32; its float64 twin:
    _check(mod, lambda q, k, v: _hf_attention(q, k, v, cos[None], sin[None], q2.apply_rotary_pos_emb), q, k, v, P)
    qv = q.detach().transpose(1, 2).float()
    hf32 = q2.apply_rotary_pos_emb_vision(qv, qv, cos, sin)[0]
    # float32: q's and the tables' casts, two products and a sum, 5 roundings on |q cos| + |q' sin| <= 2 max|q|
    torch.testing.assert_close(hf32.double(), q2.apply_rotary_pos_emb(q.detach(), q.detach(), cos[None], sin[None])[0]
                               .transpose(1, 2), rtol=0, atol=float32_bound(10, q))
    # HF's own float32 grid
    torch.testing.assert_close(rot.inv_freq.double(), inv, rtol=inv_freq_rounding(base), atol=0)


def test_rope_2d_matches_rotary_embedding_torch_axial_frequencies():
    import rotary_embedding_torch as ret  # a test dependency (the test extra)
    D, base, Hh, Ww = 32, 100.0, 3, 5
    mod = compile_scheme(SCHEMES / "rope_2d.pe", num_heads=2, head_dim=D, params={"base": base}).double()
    assert mod.scheme.layout == "interleaved"  # rotary-embedding-torch's pairs (2k, 2k + 1)
    inv = 1.0 / (base ** (torch.arange(0, D // 2, 2, dtype=F64) / (D // 2)))  # 'lang' frequencies of D/2 per axis
    emb = ret.RotaryEmbedding(dim=D // 2, custom_freqs=inv, cache_if_possible=False)
    freqs = emb.get_axial_freqs(Hh, Ww).reshape(Hh * Ww, D)  # (h, w) -> [h-half, w-half], interleaved pairs
    rows, cols = torch.meshgrid(torch.arange(Hh), torch.arange(Ww), indexing="ij")
    P = torch.stack([rows.flatten(), cols.flatten()])[:, None].expand(2, 2, -1).contiguous()
    q, k, v = _qkv(2, 2, Hh * Ww, D, seed=4)

    def peer(q, k, v):
        qe, ke = ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)
        return F.scaled_dot_product_attention(qe, ke, v, is_causal=True)

    _check(mod, peer, q, k, v, P)


@pytest.mark.parametrize("name", ["rope_2d", "rope_3d", "mrope", "mrope_interleaved"])
def test_text_positions_make_every_axis_the_one_position(name):
    """Positions equal on every axis (text) give the same result as no positions (0..L-1)."""
    mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=32).double()
    A = len(mod.scheme.axes)
    q, k, v = _qkv(2, 2, 9, 32)
    P = torch.arange(9).expand(A, 2, 9)
    torch.testing.assert_close(mod(q, k, v, positions=P), mod(q, k, v), rtol=1e-12, atol=1e-12)


def test_mrope_on_text_is_rope():
    mrope = compile_scheme(SCHEMES / "mrope.pe", num_heads=2, head_dim=32).double()
    rope = compile_scheme(SCHEMES / "rope.pe", num_heads=2, head_dim=32, params={"base": 1e6}).double()
    q, k, v = _qkv(1, 2, 7, 32)
    torch.testing.assert_close(mrope(q, k, v), rope(q, k, v), rtol=1e-12, atol=1e-12)
    assert math.isclose(mrope.scheme.params["base"], 1e6)


def _official_mixed(q, k, v, freqs, t_x, t_y):
    """naive-ai/rope-vit's compute_mixed_cis + apply_rotary_emb (complex multiply on interleaved pairs), in
    float64: freqs (2, H, D/2) for (x, y); t_x the column, t_y the row of each token; then causal SDPA."""
    H, N = freqs.shape[1], t_x.shape[0]
    fx = (t_x.unsqueeze(-1) @ freqs[0].reshape(1, -1)).view(N, H, -1).permute(1, 0, 2)
    fy = (t_y.unsqueeze(-1) @ freqs[1].reshape(1, -1)).view(N, H, -1).permute(1, 0, 2)
    cis = torch.polar(torch.ones_like(fx), fx + fy)  # (H, N, D/2)

    def rot(x):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * cis).flatten(3)

    return F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True)


def test_rope_mixed_matches_the_official_rope_vit_code_with_its_start_and_gradients():
    """The start (init_random_2d_freqs with the scheme's fixed directions a_h), the rotation and the gradients
    of the learned frequencies: pedsl learns magnitudes m with f = m * cos(a_h) (f_y: sin), so
    d/dm = cos(a_h) d/df_x (resp. sin(a_h) d/df_y)."""
    H, D, theta, side = 4, 16, 10.0, 4
    mod = compile_scheme(SCHEMES / "rope_mixed.pe", num_heads=H, head_dim=D).double()
    a = torch.tensor([2 * math.pi * (h + 1) / H + 1 for h in range(H)], dtype=F64)
    mag = 1 / (theta ** (torch.arange(0, D, 4, dtype=F64)[: D // 4] / D))
    fx0 = torch.cat([mag * torch.cos(a)[:, None], mag * torch.cos(math.pi / 2 + a)[:, None]], -1)
    fy0 = torch.cat([mag * torch.sin(a)[:, None], mag * torch.sin(math.pi / 2 + a)[:, None]], -1)
    p = dict(mod.named_parameters())
    key = "learned.sites.phase[{}]__learned{}.value"
    for g, i in (("first", 0), ("second", 0), ("first", 1), ("second", 1)):
        torch.testing.assert_close(p[key.format(g, i)], mag.expand(H, -1), rtol=F32_EPS, atol=0)  # float32 start: one rounding
    m = {(g, i): p[key.format(g, i)].detach() for g in ("first", "second") for i in (0, 1)}  # as rounded
    fx0 = torch.cat([m["first", 0] * torch.cos(a)[:, None], m["second", 0] * torch.cos(math.pi / 2 + a)[:, None]], -1)
    fy0 = torch.cat([m["first", 1] * torch.sin(a)[:, None], m["second", 1] * torch.sin(math.pi / 2 + a)[:, None]], -1)
    idx = torch.arange(side * side)
    t_x, t_y = (idx % side).to(F64), (idx // side).to(F64)
    P = torch.stack([idx // side, idx % side])[:, None].expand(2, 2, -1).contiguous()
    q, k, v = _qkv(2, H, side * side, D, seed=7)
    freqs = torch.stack([fx0, fy0]).requires_grad_()
    ours = mod(q, k, v, positions=P)
    theirs = _official_mixed(q, k, v, freqs, t_x, t_y)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-11)
    w = torch.randn(ours.shape, generator=torch.Generator().manual_seed(8), dtype=F64)
    names = [key.format(g, i) for g in ("first", "second") for i in (0, 1)]
    g_ours = torch.autograd.grad((ours * w).sum(), [q, k, v] + [p[n] for n in names])
    g_theirs = torch.autograd.grad((theirs * w).sum(), [q, k, v, freqs])
    for x, y in zip(g_ours[:3], g_theirs[:3]):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-10)
    gf = g_theirs[3]  # (2, H, D/2): x then y
    half = D // 4
    for n, gm, (axis, sl, ang) in zip(names, g_ours[3:], [(0, slice(0, half), a), (1, slice(0, half), a),
                                                        (0, slice(half, None), a + math.pi / 2),
                                                        (1, slice(half, None), a + math.pi / 2)]):
        trig = torch.cos(ang) if axis == 0 else torch.sin(ang)
        torch.testing.assert_close(gm, gf[axis][:, sl] * trig[:, None], rtol=1e-9, atol=1e-10)
