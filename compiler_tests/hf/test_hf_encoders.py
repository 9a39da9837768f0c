"""Encoders against their Hugging Face peers, tiny random models, same weights, float64: the library's
t5_encoder against the self-attention of a `T5EncoderModel` (`_relative_position_bucket(bidirectional=True)`;
the plain distance's bidirectional buckets refused under a non-causal mask, E255); modernbert_global /
modernbert_local in HF's layer map driving every attention of a `ModernBertModel`; pixtral_vision and
qwen2_vl_vision driving `PixtralVisionModel` and Qwen2-VL's vision tower over packed images. The drivers are
this file's: `use_pedsl_attention` serves causal decoders and refuses is_causal=False."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from compiler_helpers import SCHEMES, first_error  # noqa: E402
from hf_helpers import depth, float64_native, rounding, scaled_float64  # noqa: E402
from pedsl.compiler import compile_scheme  # noqa: E402
from pedsl.lang.builtin_defs.learned import bucket_of  # noqa: E402


def _t5_attention(buckets: int, max_distance: int):
    cfg = transformers.T5Config(vocab_size=32, d_model=24, d_kv=6, d_ff=32, num_heads=4, num_layers=1,
                                relative_attention_num_buckets=buckets, relative_attention_max_distance=max_distance,
                                attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(cfg).to(torch.float64).eval()
    att = model.encoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        att.relative_attention_bias.weight.normal_()
    return att


@pytest.mark.parametrize("buckets, max_distance, L", [(32, 128, 150), (8, 20, 40)])
def test_t5_encoder_equals_hf_t5_self_attention(buckets, max_distance, L):
    """L past max_distance reaches the last bucket of each half; gradients of the table and the inputs too."""
    att = _t5_attention(buckets, max_distance)
    H, D = att.n_heads, att.key_value_proj_dim
    mod = compile_scheme(SCHEMES / "t5_encoder.pe", num_heads=H, head_dim=D,
                         params={"buckets": buckets, "max_distance": max_distance}).double()
    table = mod.learned.sites["bias[0]__table0"].weight
    with torch.no_grad():
        table.copy_(att.relative_attention_bias.weight)
    x = torch.randn(2, L, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    want = att(x)[0]
    q, k, v = (p(x).view(2, L, H, D).transpose(1, 2) for p in (att.q, att.k, att.v))
    # T5 scores q . k unscaled (its init folds 1 / sqrt(d) into q): pedsl divides by sqrt(D), so q comes in
    # multiplied by sqrt(D), a float64 rounding of 1 ulp per element
    got = att.o(mod(q * math.sqrt(D), k, v).transpose(1, 2).reshape(2, L, H * D))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    gx_want, gt_want = torch.autograd.grad(want, (x, att.relative_attention_bias.weight), g)
    gx_got, gt_got = torch.autograd.grad(got, (x, table), g)
    torch.testing.assert_close(gx_got, gx_want, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(gt_got, gt_want, rtol=1e-11, atol=1e-11)
    # both halves are read: keys after the query take the upper buckets
    rel = torch.arange(L)[None, :] - torch.arange(L)[:, None]
    hf = att._relative_position_bucket(rel, bidirectional=True, num_buckets=buckets, max_distance=max_distance)
    assert hf.max() == buckets - 1 and (hf[rel > 0] >= buckets // 2).all()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_bucket_of_a_signed_distance_is_hfs(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    d = torch.arange(-3000, 3000)
    hf = T5Attention._relative_position_bucket(-d, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert [bucket_of(float(x), 32, 128, bidirectional) for x in d.tolist()] == hf.tolist()


def test_the_plain_distance_under_a_bidirectional_mask_is_refused():
    d = first_error("scheme s {\n  mask = bidirectional\n  bias = table(bucket(distance, bidirectional = true), "
                    "to = head)\n}\n")
    assert d.code == "E255" and "distance.t" in d.hint
    # a symmetric table (bidirectional = false) reads |i - j| as documented: accepted
    text = "scheme s {\n  mask = bidirectional\n  bias = table(bucket(distance), to = head)\n}\n"
    assert compile_scheme(text, num_heads=2, head_dim=8) is not None


# ---------------------------------------------------------------------- ModernBERT
def _layered(width: int, pattern: str = "[modernbert_global, modernbert_local * 2]") -> str:
    """The library's two ModernBERT layers in HF's layer map (global_attn_every_n_layers = 3)."""
    return ('import "modernbert_global.pe"\nimport "modernbert_local.pe"\n'
            f"scheme modernbert {{\n  layers {{\n    pattern = {pattern}\n  }}\n}}\n"), {"width": width}


def _modernbert():
    cfg = transformers.ModernBertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                        num_attention_heads=4, local_attention=16, pad_token_id=0,
                                        attn_implementation="eager")
    torch.manual_seed(0)
    return scaled_float64(transformers.ModernBertModel(cfg))


def _drive(model, scheme) -> None:
    """Each layer's attention through the pedsl part its `layers` rule names: HF's Wqkv and Wo around it."""
    from pedsl.lang.api import load

    text, params = scheme
    sch = load(text, params)
    names = sch.layers.assign(len(model.layers))
    H = model.config.num_attention_heads
    D = model.config.hidden_size // H
    for layer, name in zip(model.layers, names):
        mod = compile_scheme(sch.layers.parts[name], num_heads=H, head_dim=D).double()

        def forward(hidden, *args, _att=layer.attn, _mod=mod, **kw):
            B, L, _ = hidden.shape
            q, k, v = _att.Wqkv(hidden).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
            return _att.Wo(_mod(q, k, v).transpose(1, 2).reshape(B, L, H * D)), None

        layer.attn.forward = forward


def test_modernbert_layers_equal_hf_modernbert_model():

    native = _modernbert()
    assert native.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"] * 2
    assert native.config.sliding_window == 8  # HF's half window: |i - j| <= 8, pedsl's window = 9
    # HF's rotary tables and its eager softmax (dtype=torch.float32) in float64
    exact = float64_native(native, also=("Attention",))
    ours = float64_native(native)
    _drive(ours, _layered(9))
    ids = torch.randint(1, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = exact(ids).last_hidden_state, ours(ids).last_hidden_state
        native_out = native(ids).last_hidden_state
    # float64 throughout on both sides: float64's rounding of the model's longest chain (hf_helpers.depth)
    torch.testing.assert_close(got, want, rtol=0.0, atol=rounding(depth(native.config, 40), want))
    assert (native_out - want).abs().max() < 1e-4  # the float64 twin is the model (its float32 steps aside)
    # the window and the two bases matter: a global part everywhere is far off
    swapped = float64_native(native)
    _drive(swapped, (_layered(9, "[modernbert_global]")[0], {}))
    with torch.no_grad():
        assert (swapped(ids).last_hidden_state - want).abs().max() > 1e-3


def test_the_library_modernbert_layers_have_hfs_defaults():
    from pedsl.lang.api import load

    cfg = transformers.ModernBertConfig()
    local, glob = load(SCHEMES / "modernbert_local.pe"), load(SCHEMES / "modernbert_global.pe")
    assert local.window == cfg.sliding_window + 1 == 65 and glob.window is None
    assert local.params["base"] == cfg.rope_parameters["sliding_attention"]["rope_theta"]
    assert glob.params["base"] == cfg.rope_parameters["full_attention"]["rope_theta"]
    assert local.layout == glob.layout == "halves"  # HF's rotate_half
    assert cfg.layer_types[:6] == ["full_attention", "sliding_attention", "sliding_attention"] * 2


# ---------------------------------------------------------------------- vision towers: 2-D RoPE both ways
def _vision_drive(attentions, name: str, H: int, D: int, qkv, out, positions, docs) -> None:
    """Each attention module's forward through the library scheme ``name``: HF's projections around pedsl's
    module, the patches' (h, w) positions (2, 1, N) and one document per image (or frame)."""
    mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=H, head_dim=D).double()
    for att in attentions:
        def forward(*args, _att=att, **kw):
            hidden = args[0] if args else kw["hidden_states"]
            packed = hidden.dim() == 2  # Qwen2-VL's (N, C) packed patches; Pixtral's (1, N, C)
            x = hidden[None] if packed else hidden
            q, k, v = qkv(_att, x)
            o = out(_att, mod(q, k, v, positions=positions, document_ids=docs).transpose(1, 2).reshape(
                *x.shape[:2], H * D))
            return o[0] if packed else (o, None)

        att.forward = forward


def test_pixtral_vision_equals_hf_pixtral_vision_model():

    cfg = transformers.PixtralVisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, head_dim=16, num_channels=3, image_size=64,
                                           patch_size=8, attn_implementation="eager")
    torch.manual_seed(0)
    native = scaled_float64(transformers.PixtralVisionModel(cfg))
    exact = float64_native(native, also=("Attention",))  # its float32 phases and eager softmax in float64
    ours = float64_native(native)
    sizes = [(32, 48), (40, 24)]  # 4 x 6 and 5 x 3 patches, packed into one sequence
    pix = torch.randn(2, 3, 40, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grids = [(h // 8, w // 8) for h, w in sizes]
    hw = [torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")).reshape(2, -1) for h, w in grids]
    positions = torch.cat(hw, 1)[:, None]  # (2, 1, N)
    docs = torch.cat([torch.full((h * w,), i) for i, (h, w) in enumerate(grids)])[None]
    H, D = 4, 16

    def qkv(att, x):
        return (p(x).view(*x.shape[:2], H, D).transpose(1, 2) for p in (att.q_proj, att.k_proj, att.v_proj))

    _vision_drive([layer.attention for layer in ours.transformer.layers], "pixtral_vision", H, D, qkv,
                  lambda att, o: att.o_proj(o), positions, docs)
    with torch.no_grad():
        want, got = exact(pix, image_sizes=sizes).last_hidden_state, ours(pix, image_sizes=sizes).last_hidden_state
        qwen = float64_native(native)
        _vision_drive([layer.attention for layer in qwen.transformer.layers], "qwen2_vl_vision", H, D, qkv,
                      lambda att, o: att.o_proj(o), positions, docs)
        other = qwen(pix, image_sizes=sizes).last_hidden_state
    n = 2 * (5 * 64 + D + 2 * docs.shape[1] + 96) + 64  # hf_helpers.depth's chain for this tower
    torch.testing.assert_close(got, want, rtol=0.0, atol=rounding(n, want))
    assert (other - want).abs().max() > 1e-3  # Qwen2-VL's grid (no odd frequencies on w) is another model


def test_qwen2_vl_vision_equals_hf_qwen2_vl_vision_tower():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (Qwen2VisionTransformerPretrainedModel,
                                                                get_vision_position_ids)

    cfg = transformers.Qwen2VLVisionConfig(depth=2, embed_dim=64, hidden_size=64, num_heads=4, mlp_ratio=2,
                                           in_channels=3, patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                                           attn_implementation="eager")
    torch.manual_seed(0)
    native = scaled_float64(Qwen2VisionTransformerPretrainedModel(cfg))
    exact = float64_native(native, also=("Attention",))  # its float32 rotation (q.float()) in float64
    ours = float64_native(native)
    grid = torch.tensor([[1, 4, 6], [2, 4, 4]])  # an image and a two-frame video: three frames
    N = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    x = torch.randn(N, 3 * 2 * 4 * 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    positions = get_vision_position_ids(grid, 2).t()[:, None]  # HF's merge-block order, (2, 1, N)
    frames = [h * w for t, h, w in grid.tolist() for _ in range(t)]
    docs = torch.cat([torch.full((n,), i) for i, n in enumerate(frames)])[None]
    H, D = 4, 16

    def qkv(att, x):
        return att.qkv(x).view(*x.shape[:2], 3, H, D).permute(2, 0, 3, 1, 4)

    _vision_drive([blk.attn for blk in ours.blocks], "qwen2_vl_vision", H, D, qkv, lambda att, o: att.proj(o),
                  positions, docs)
    with torch.no_grad():
        want, got = exact(x, grid_thw=grid).last_hidden_state, ours(x, grid_thw=grid).last_hidden_state
    n = 2 * (5 * 64 + D + 2 * N + 128) + 64
    torch.testing.assert_close(got, want, rtol=0.0, atol=rounding(n, want))


@pytest.mark.parametrize("config, scheme", [("ModernBertConfig", "modernbert_local"), ("T5Config", "t5_encoder"),
                                            ("PixtralVisionConfig", "pixtral_vision"),
                                            ("Qwen2VLVisionConfig", "qwen2_vl_vision")])
def test_import_hf_refuses_the_encoders_naming_the_library_scheme(config, scheme):
    from pedsl.errors import InteropError
    from pedsl.hf.convert import import_config

    with pytest.raises(InteropError) as err:
        import_config(getattr(transformers, config)().to_dict())
    assert "attends bidirectionally" in str(err.value) and scheme in str(err.value)
