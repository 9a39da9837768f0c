"""Multi-head latent attention (pedsl/hf/mla.py, pedsl/hf/value_width.py): the rotary on the last
qk_rope_head_dim channels of a wider query/key head, interleaved or rotate_half, YaRN's softmax mscale as the
scheme's temperature, values of another width - against a naive float64 reference and the native DeepSeek-V3."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from pedsl.compiler import compile_scheme
from pedsl.errors import InteropError, PedslError
from pedsl.hf import import_config
from pedsl.lang.api import load
from compiler_tests.compiler_helpers import float32_bound, float64_bound

transformers = pytest.importorskip("transformers")
from tools import hf_sweep  # noqa: E402

NOPE, ROPE = 8, 8
YARN = {"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0,
        "mscale_all_dim": 1.0}


def _scheme(layout: str, value_step: bool = False) -> str:
    step = "qkv" if value_step else "qk"
    return f"""scheme mla_test "the last {ROPE} channels rotated" {{
  param heads: int = 2
  param head_dim: int = {NOPE + ROPE}
  param rope_head_dim: int = {ROPE}
  param base: float = 100.0
  layout {layout}
  channels {{
    plain = range(0, head_dim - rope_head_dim)
    rot = rest
  }}
  {step} on rot: rotate(geometric(base) * position)
}}
"""


def _naive(q, k, v, layout: str, base: float = 100.0):
    """Causal softmax attention, one score at a time: q and k's last ROPE channels turned pair by pair (pairs
    (2p, 2p + 1) interleaved, (p, p + ROPE/2) in halves) by position * base ** (-2p / ROPE), scores / sqrt(D)."""
    B, H, L, D = q.shape
    out = torch.zeros(B, H, L, v.shape[-1], dtype=q.dtype)

    def turned(x, pos):
        x = x.clone()
        for p in range(ROPE // 2):
            a, b = (NOPE + 2 * p, NOPE + 2 * p + 1) if layout == "interleaved" else (NOPE + p, NOPE + p + ROPE // 2)
            ang = pos * base ** (-2 * p / ROPE)
            xa, xb = x[a].clone(), x[b].clone()
            x[a], x[b] = xa * math.cos(ang) - xb * math.sin(ang), xb * math.cos(ang) + xa * math.sin(ang)
        return x

    for b in range(B):
        for h in range(H):
            for i in range(L):
                qi = turned(q[b, h, i], i)
                s = torch.stack([turned(k[b, h, j], j) @ qi / math.sqrt(D) for j in range(i + 1)])
                w = torch.softmax(s, 0)
                out[b, h, i] = sum(w[j] * v[b, h, j] for j in range(i + 1))
    return out


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("value_dim", [12, 20])
def test_last_channels_rotated_with_values_of_another_width_equal_the_naive_reference(layout, value_dim):
    """Forward and backward in float64: the scheme import-hf writes for MLA, run on values of v_head_dim channels
    (one padded slice below D, two slices above it) through value_width.attend, against the naive loops."""
    from pedsl.hf.value_width import attend

    g = torch.Generator().manual_seed(3)
    L, D = 7, NOPE + ROPE
    q, k = (torch.randn(1, 2, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 2, L, value_dim, generator=g, dtype=torch.float64, requires_grad=True)
    mod = compile_scheme(load(_scheme(layout)), num_heads=2, head_dim=D, requires_grad=False)
    got = attend(mod, q, k, v, positions=torch.arange(L)[None])
    want = _naive(q, k, v, layout)
    assert got.shape == want.shape
    depth = 4 * (L + D)  # a score's D channels, the softmax and weighted sum over L keys, the rotation (4 terms)
    assert float((got - want).detach().abs().max()) <= float64_bound(depth, want)
    up = torch.randn(want.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((got * up).sum(), (q, k, v))
    refs = torch.autograd.grad((want * up).sum(), (q, k, v))
    for a, b in zip(grads, refs):
        assert float((a - b).abs().max()) <= float64_bound(2 * depth, b)  # the backward chain: twice as deep


def test_values_of_another_width_are_refused_for_a_scheme_that_turns_the_values():
    from pedsl.hf.value_width import attend

    mod = compile_scheme(load(_scheme("interleaved", value_step=True)), num_heads=2, head_dim=16, requires_grad=False)
    q = torch.randn(1, 2, 4, 16, dtype=torch.float64)
    with pytest.raises(InteropError, match="v_head_dim") as err:
        attend(mod, q, q, torch.randn(1, 2, 4, 12, dtype=torch.float64), positions=torch.arange(4)[None])
    assert err.value.code == "E964"


# ---------------------------------------------------------------------- import-hf


def _config(**fields) -> dict:
    cfg = transformers.DeepseekV3Config(**{**hf_sweep.SMALL, **hf_sweep.EXTRA["deepseek_v3"], **fields})
    return json.loads(cfg.to_json_string())


@pytest.mark.parametrize("interleave", [True, False])
def test_import_hf_writes_the_whole_head_and_rotates_its_last_channels(interleave):
    text = import_config(_config(rope_interleave=interleave))
    sch = load(text)
    assert sch.head_dim == NOPE + ROPE and f"rope_head_dim: int (>= 2, <= head_dim) = {ROPE}" in text
    assert f"layout {'interleaved' if interleave else 'halves'}" in text
    assert list(sch.group("rot").channels) == list(range(NOPE, NOPE + ROPE))
    # YaRN with mscale_all_dim: HF's softmax scale times yarn_get_mscale(4, 1) ** 2, the scheme's temperature
    assert "temperature = (0.1 * mscale_all_dim * log(factor) + 1)" in text
    plain = import_config(_config(rope_parameters={"rope_type": "default", "rope_theta": 5e4}))
    assert "temperature" not in plain


def test_sparse_attention_and_untaught_mla_keys_are_refused_by_name():
    cfg = json.loads(transformers.DeepseekV32Config(**hf_sweep.SMALL).to_json_string())
    with pytest.raises(PedslError, match="deepseek_v32.*index_topk"):
        import_config(cfg)
    llama = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "qk_rope_head_dim": 8}
    with pytest.raises(PedslError, match="qk_rope_head_dim"):
        import_config(llama)


def test_kimi_linear_mla_layers_are_nope_over_the_whole_head():
    cfg = transformers.KimiLinearConfig(**{**hf_sweep.SMALL, **hf_sweep.EXTRA["kimi_linear"]})
    sch = load(import_config(json.loads(cfg.to_json_string())))
    assert not sch.transports and sch.head_dim == NOPE + ROPE


# ---------------------------------------------------------------------- the native model


def _deepseek(**fields):
    cfg = transformers.DeepseekV3Config(**_config(first_k_dense_replace=4, **fields))  # dense MLPs: float64 runs
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model


def _logits(model, tok, mask):
    with torch.no_grad():
        return model(input_ids=tok, attention_mask=mask).logits[mask.bool()]


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_v3_equals_the_native_model_and_a_wrong_scheme_does_not(interleave):
    """Float64 model, HF's rotary tables in float32 (its own): within the float32 bound of the logits' chain of
    roundings (tools.hf_sweep.depth); the same scheme without the YaRN temperature, or with the other layout, moves
    the logits by far more."""
    from pedsl.hf import use_pedsl_attention

    native = _deepseek(rope_interleave=interleave)
    tok, mask = hf_sweep.batches(native.config.vocab_size)
    want = _logits(native, tok, mask)
    bound = float32_bound(hf_sweep.depth(native.config, tok.shape[1]), want)
    ours = use_pedsl_attention(copy.deepcopy(native))
    assert float((_logits(ours, tok, mask) - want).abs().max()) <= bound
    text = import_config(json.loads(native.config.to_json_string()))
    other = "halves" if interleave else "interleaved"
    for wrong in ("\n".join(ln for ln in text.split("\n") if "temperature" not in ln),
                  text.replace(f"layout {'interleaved' if interleave else 'halves'}", f"layout {other}")):
        moved = use_pedsl_attention(copy.deepcopy(native), wrong)
        assert float((_logits(moved, tok, mask) - want).abs().max()) > 100 * bound


def test_a_scheme_of_its_own_on_deepseek_v3_reads_the_whole_head():
    """use_pedsl_attention(model, "rope") loads the library scheme over the qk_nope + qk_rope head (the config's
    head_dim is the rotary's width only), so its rotation covers every query/key channel."""
    from pedsl.hf import use_pedsl_attention
    from pedsl.hf.attention import _ATTR

    model = use_pedsl_attention(_deepseek(), "rope")
    layer = next(m for m in model.modules() if hasattr(m, _ATTR))
    assert getattr(layer, _ATTR).module.head_dim == NOPE + ROPE


def test_sarvam_mla_runs_deepseek_v3_and_equals_the_native_model():
    """Sarvam's MLA config (its own class, DeepSeek-V3's model): import-hf writes DeepSeek-V3's interleaved MLA
    scheme with YaRN's temperature, and the model under use_pedsl_attention stays within the float32 bound of the
    native one's logits; with the other layout, or without the temperature, they move by more."""
    from pedsl.hf import use_pedsl_attention

    cfg = transformers.SarvamMLAConfig(**{**hf_sweep.SMALL, **hf_sweep.EXTRA["sarvam_mla"], "rope_parameters": YARN,
                                          "first_k_dense_replace": 4})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    native = transformers.AutoModelForCausalLM.from_config(cfg).double().eval()
    assert type(native).__name__ == "DeepseekV3ForCausalLM"
    with torch.no_grad():  # larger scores, so that a wrong temperature shows
        for p in native.parameters():
            if p.dim() == 2:
                p.mul_(4)
    text = import_config(json.loads(cfg.to_json_string()))
    assert "layout interleaved" in text and "temperature = (0.1 * mscale_all_dim * log(factor) + 1)" in text
    tok, mask = hf_sweep.batches(cfg.vocab_size)
    want = _logits(native, tok, mask)
    bound = float32_bound(hf_sweep.depth(native.config, tok.shape[1]), want)
    assert float((_logits(use_pedsl_attention(copy.deepcopy(native)), tok, mask) - want).abs().max()) <= bound
    cold = "\n".join(ln for ln in text.split("\n") if "temperature" not in ln)
    for wrong, margin in ((text.replace("layout interleaved", "layout halves"), 10), (cold, 4)):
        assert float((_logits(use_pedsl_attention(copy.deepcopy(native), wrong), tok, mask) - want).abs().max()) > \
            margin * bound
