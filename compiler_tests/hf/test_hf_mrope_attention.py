"""`use_pedsl_attention` on the language models of Qwen2-VL, Qwen2.5-VL and Qwen3-VL, built tiny from configs
(random init, float64), at 3-axis position_ids shaped like an image prompt: a text prefix, an image block
with t constant and (h, w) running over a grid, then text continuing at max + 1 on every axis; and on the full
vision-language classes generating from a prompt with an image."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_helpers import assert_matches_native, depth, float32_table_rounding, float64_native, rounding

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


def rope(family: str, theta: float = 1000.0, sections=(4, 4, 4), **table) -> dict:
    out = {"rope_type": "default", "rope_theta": theta, "mrope_section": list(sections), **table}
    return {**out, "mrope_interleaved": True} if family == "qwen3_vl" else out


def text_config(family: str, **rope_kw) -> dict:
    kw = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": 256,
          "rope_parameters": rope(family, **rope_kw), "bos_token_id": None, "eos_token_id": None}
    return {**kw, "head_dim": HEAD_DIM} if family == "qwen3_vl" else kw


def text_model(family: str, **rope_kw):
    """(the native model's float64 twin, the native model) of a tiny float64 text model: the twin is
    hf_helpers.float64_native, HF's own rotary class rebuilt and run with every float32 it asks for made float64
    (HF computes the phases in float32 even in a float64 model)."""
    cfg = getattr(transformers, FAMILIES[family][0])(**text_config(family, **rope_kw))
    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[family][1])(cfg).to(torch.float64).eval()
    return float64_native(model), model


def assert_twin_is_hfs_table(twin, model, pos: torch.Tensor) -> None:
    """The twin's cos/sin tables are HF's float32 ones within their float32 rounding
    (hf_helpers.float32_table_rounding): the float64 reference is HF's computation, not another formula."""
    rp = model.config.rope_parameters
    x = torch.zeros(1, dtype=torch.float64)
    inv = 1.0 / rp["rope_theta"] ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    bound = float32_table_rounding(float(pos.max()) * float(inv.max()), rp["rope_theta"])
    for exact, hf32 in zip(twin.rotary_emb(x, pos), model.rotary_emb(x, pos)):
        torch.testing.assert_close(hf32, exact, rtol=0, atol=bound)


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
    bound = rounding(depth(model.config, 7), want)
    torch.testing.assert_close(model(input_ids=ids, position_ids=text).last_hidden_state, want, rtol=0, atol=bound)
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


# ---------------------------------------------------------------------- the model's own M-RoPE, imported


def greedy(model, head, ids: torch.Tensor, pos: torch.Tensor, steps: int):
    """Greedy decoding through HF's cache, each new token at the next position on every axis (as HF continues
    text after an image): (tokens, logits of every step)."""
    out = model(input_ids=ids, position_ids=pos, use_cache=True)
    cache, h = out.past_key_values, out.last_hidden_state
    nxt = pos.amax(dim=(0, 2)) + 1  # (B,)
    toks, logits = [], []
    for _ in range(steps):
        lg = head(h[:, -1])
        tok = lg.argmax(-1)
        toks.append(tok)
        logits.append(lg)
        step_pos = nxt[None, :, None].expand(3, -1, 1)
        out = model(input_ids=tok[:, None], position_ids=step_pos, past_key_values=cache, use_cache=True)
        cache, h, nxt = out.past_key_values, out.last_hidden_state, nxt + 1
    return torch.stack(toks, 1), torch.stack(logits, 1)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_imported_m_rope_matches_the_model_at_image_positions(family):
    native, model = text_model(family)
    ids, pos = tokens(2, 11), image_prompt()
    hf32 = model(input_ids=ids, position_ids=pos).last_hidden_state  # HF's own rotary, float32 phases
    use_pedsl_attention(model)  # the model's own scheme: import-hf of its config
    want = native(input_ids=ids, position_ids=pos).last_hidden_state
    assert_twin_is_hfs_table(native, model, pos)
    n = depth(model.config, 11 + 5)
    assert_matches_native(model(input_ids=ids, position_ids=pos).last_hidden_state, hf32, want, n)
    torch.manual_seed(2)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.float64)
    got_toks, got_logits = greedy(model, head, ids, pos, 5)
    want_toks, want_logits = greedy(native, head, ids, pos, 5)
    assert torch.equal(got_toks, want_toks)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=rounding(n + HIDDEN, want_logits))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_another_m_rope_scheme_is_computed_by_pedsl_not_passed_through(family):
    """A scheme with another base and other sections than the model's config equals the native model built
    with those: the rotation comes from the scheme."""
    sections = [2, 5, 5] if family == "qwen2_vl" else [6, 3, 3]
    other, _ = text_model(family, theta=55.0, sections=sections)
    _, model = text_model(family)
    call = "sections" if family == "qwen2_vl" else "interleave"
    use_pedsl_attention(model, f"""scheme m "another M-RoPE" {{
  axes t, h, w
  param base: float = 55.0
  layout halves
  qk: rotate(geometric(base) * {call}(position, {sections}))
}}
""")
    model.load_state_dict(other.state_dict())
    ids, pos = tokens(2, 11), image_prompt()
    want = other(input_ids=ids, position_ids=pos).last_hidden_state
    torch.testing.assert_close(model(input_ids=ids, position_ids=pos).last_hidden_state, want, rtol=0,
                               atol=rounding(depth(model.config, 11), want))


VISION = {
    "qwen2_vl": {"depth": 1, "embed_dim": 16, "hidden_size": HIDDEN, "num_heads": 2},
    "qwen2_5_vl": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "out_hidden_size": HIDDEN, "num_heads": 2,
                   "fullatt_block_indexes": [0]},
    "qwen3_vl": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "out_hidden_size": HIDDEN, "num_heads": 2,
                 "deepstack_visual_indexes": [], "num_position_embeddings": 16},
}
IMAGE, VIDEO, START, END = 60, 61, 62, 63  # special token ids inside the tiny vocabulary


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_through_the_full_vision_language_class_with_an_image(family):
    """HF's generate on the whole VL model with a (random) 4 x 6-patch image: the processor-style prompt, the
    model's own get_rope_index positions (the image block at one t over a 2 x 3 grid, text after it at max + 1),
    the vision tower on its own attention; pedsl in the language model decodes the same tokens."""
    _, _, outer, cls = FAMILIES[family]
    cfg = getattr(transformers, outer)(text_config=text_config(family), vision_config=VISION[family],
                                       image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
                                       vision_end_token_id=END)
    torch.manual_seed(0)
    native = getattr(transformers, cls)(cfg).to(torch.float64).eval()
    model = use_pedsl_attention(copy.deepcopy(native))
    vc, grid = cfg.vision_config, torch.tensor([[1, 4, 6]])
    pixels = torch.randn(int(grid.prod()), 3 * vc.temporal_patch_size * vc.patch_size ** 2, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[5, 6, START] + [IMAGE] * (int(grid.prod()) // vc.spatial_merge_size ** 2) + [END, 7, 8]])
    mm = (ids == IMAGE).int()
    pos, _ = native.model.get_rope_index(ids, mm, image_grid_thw=grid, attention_mask=torch.ones_like(ids))
    assert pos[1, 0].tolist() != pos[2, 0].tolist()  # the image's h and w differ: a real 3-axis prompt
    kw = {"pixel_values": pixels, "image_grid_thw": grid, "mm_token_type_ids": mm, "max_new_tokens": 6,
          "do_sample": False, "pad_token_id": 0, "output_scores": True, "return_dict_in_generate": True}
    a, b, e = (m.generate(ids, **kw) for m in (native, model, float64_native(native)))
    assert torch.equal(b.sequences, a.sequences) and torch.equal(e.sequences, a.sequences)
    # HF's float32 phases: held to the float64 twin within float64 rounding, to HF within the floor they cost
    assert_matches_native(torch.stack(b.scores), torch.stack(a.scores), torch.stack(e.scores),
                          depth(cfg, ids.shape[1] + 6))


SCALED = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.2},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0},
}


@pytest.mark.parametrize("family, table", [("qwen2_5_vl", "yarn"), ("qwen2_vl", "linear"), ("qwen3_vl", "llama3"),
                                           ("qwen3_vl", "yarn")])
def test_an_imported_scaled_m_rope_matches_the_model(family, table):
    """A fixed scaled table over the sections: equal to the native model with its rotary in float64 within
    float64 rounding, hence to HF (float32 phases) within the floor those phases cost, measured here."""
    exact, native = text_model(family, **SCALED[table])
    model = use_pedsl_attention(copy.deepcopy(native))
    ids, pos = tokens(2, 11), image_prompt()
    got, hf32, want = (m(input_ids=ids, position_ids=pos).last_hidden_state for m in (model, native, exact))
    assert_matches_native(got, hf32, want, depth(native.config, 11))
    torch.manual_seed(2)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.float64)
    assert torch.equal(greedy(model, head, ids, pos, 4)[0], greedy(native, head, ids, pos, 4)[0])
