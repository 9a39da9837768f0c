"""`use_pedsl_attention` on the language models of Qwen2-VL, Qwen2.5-VL and Qwen3-VL, built tiny from configs
(random init, float64), at 3-axis position_ids shaped like an image prompt: a text prefix, an image block
with t constant and (h, w) running over a grid, then text continuing at max + 1 on every axis."""

from __future__ import annotations

import copy

import pytest
import torch

from pedsl.errors import InteropError
from pedsl.hf import use_pedsl_attention

transformers = pytest.importorskip("transformers")

HEADS, HEAD_DIM, HIDDEN, VOCAB = 2, 24, 48, 64
FAMILIES = {
    "qwen2_vl": ("Qwen2VLTextConfig", "Qwen2VLTextModel", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": ("Qwen2_5_VLTextConfig", "Qwen2_5_VLTextModel", "Qwen2_5_VLConfig",
                   "Qwen2_5_VLForConditionalGeneration"),
    "qwen3_vl": ("Qwen3VLTextConfig", "Qwen3VLTextModel", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
}


def rope(family: str, theta: float = 1000.0, sections=(4, 4, 4)) -> dict:
    out = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(sections)}
    return {**out, "mrope_interleaved": True} if family == "qwen3_vl" else out


def text_config(family: str, **rope_kw) -> dict:
    kw = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": 256,
          "rope_parameters": rope(family, **rope_kw), "bos_token_id": None, "eos_token_id": None}
    return {**kw, "head_dim": HEAD_DIM} if family == "qwen3_vl" else kw


def float64_rotary(rotary, theta: float) -> None:
    """Make HF's rotary embedding compute in float64 (it casts phases to float32, 1e-7 off): HF's formula and its
    own recomposition_frequencies (which pair reads which axis), with inv_freq in float64."""
    D = 2 * rotary.inv_freq.numel()
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)

    def forward(x, position_ids):
        pos = position_ids if position_ids.dim() == 3 else position_ids[None]
        freqs = pos.expand(3, -1, -1)[..., None].to(torch.float64) * inv
        return (rotary.recomposition_frequencies(freqs.cos()).to(x.dtype),
                rotary.recomposition_frequencies(freqs.sin()).to(x.dtype))

    rotary.forward = forward


def text_model(family: str, **rope_kw):
    """(native with a float64 rotary, a deep copy with HF's own) of a tiny float64 text model."""
    cfg = getattr(transformers, FAMILIES[family][0])(**text_config(family, **rope_kw))
    torch.manual_seed(0)
    native = getattr(transformers, FAMILIES[family][1])(cfg).to(torch.float64).eval()
    model = copy.deepcopy(native)
    float64_rotary(native.rotary_emb, cfg.rope_parameters["rope_theta"])
    return native, model


def image_prompt(B: int = 2, grid=(2, 3), prefix: int = 3, suffix: int = 2) -> torch.Tensor:
    """(3, B, L) position_ids: text 0..prefix-1, an h x w image at t = prefix, text from max + 1 (rows offset by b)."""
    gh, gw = grid
    rows = [[i] * 3 for i in range(prefix)]
    rows += [[prefix, prefix + h, prefix + w] for h in range(gh) for w in range(gw)]
    start = max(max(r) for r in rows) + 1
    rows += [[start + i] * 3 for i in range(suffix)]
    pos = torch.tensor(rows).T
    return torch.stack([pos + b for b in range(B)], 1)


def tokens(B: int, L: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, L), generator=torch.Generator().manual_seed(1))


ONE_AXIS_ROPE = """scheme plain "one-axis RoPE at the model's base" {
  param base: float = 1000.0
  layout halves
  qk: rotate(geometric(base) * position)
}
"""


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_one_axis_rope_runs_on_text_positions_and_refuses_an_image(family):
    """On text every axis holds the same position, so M-RoPE is RoPE: a one-axis scheme matches the model there;
    at an image's differing (t, h, w) it reads no single position: refused, never a silently different answer."""
    native, model = text_model(family)
    use_pedsl_attention(model, ONE_AXIS_ROPE)
    ids = tokens(2, 7)
    text = torch.arange(7)[None, None].expand(3, 2, 7)
    want = native(input_ids=ids, position_ids=text).last_hidden_state
    torch.testing.assert_close(model(input_ids=ids, position_ids=text).last_hidden_state, want, rtol=0, atol=1e-10)
    with pytest.raises(InteropError, match="differ between axes"):
        model(input_ids=tokens(2, 11), position_ids=image_prompt())


def test_a_scheme_outside_hfs_family_is_refused_on_a_3_axis_model():
    _, model = text_model("qwen2_vl")
    alibi = 'scheme a "ALiBi" {\n  bias = -slopes(heads) * distance\n}\n'
    with pytest.raises(InteropError, match="multi-axis positions to the rotary embedding only"):
        use_pedsl_attention(model, alibi)


def test_the_vision_tower_keeps_its_own_attention():
    family = "qwen2_vl"
    cfg = getattr(transformers, FAMILIES[family][2])(
        text_config=text_config(family), vision_config={"depth": 1, "embed_dim": 16, "hidden_size": HIDDEN,
                                                        "num_heads": 2})
    model = getattr(transformers, FAMILIES[family][3])(cfg)
    before = model.config.vision_config._attn_implementation
    use_pedsl_attention(model, ONE_AXIS_ROPE)
    assert model.config.get_text_config()._attn_implementation == "pedsl"
    assert model.config.vision_config._attn_implementation == before
