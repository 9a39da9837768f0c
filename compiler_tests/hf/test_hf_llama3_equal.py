"""`llama3` with equal low/high frequency factors (Llama 4 Scout's real rope): pedsl's folded grid against
Hugging Face's own `_compute_llama3_parameters` run in float64, the one wavelength where HF divides 0 by 0
refused, and `import-hf` / `use_pedsl_attention` on a tiny random Llama 4 text model with that rope."""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from compiler_helpers import first_error  # noqa: E402
from hf_helpers import (FLOAT32_STEPS, assert_matches_native, depth, float64_native,  # noqa: E402
                        scaled_float64)
from pedsl.hf import use_pedsl_attention  # noqa: E402
from pedsl.hf.convert import import_config  # noqa: E402
from pedsl.lang.fold import fold_expr  # noqa: E402
from pedsl.lang.parser import parse_module  # noqa: E402
from pedsl.lang.values import StaticEnv  # noqa: E402

SCOUT = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
         "original_max_position_embeddings": 8192, "rope_theta": 500000.0}  # Llama-4-Scout-17B-16E's config.json
EPS64 = float(torch.finfo(torch.float64).eps)


class _Float64Torch:
    """The torch module as `modeling_rope_utils` sees it, with `torch.float` meaning float64: HF's function
    casts its exponents with `dtype=torch.float`, so this runs the function itself in float64."""

    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def hf_table(rp: dict, head_dim: int, monkeypatch) -> torch.Tensor:
    from transformers import modeling_rope_utils as mru

    cfg = transformers.LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                                   rope_parameters=copy.deepcopy(rp))
    monkeypatch.setattr(mru, "torch", _Float64Torch())
    inv, scale = mru._compute_llama3_parameters(cfg)
    assert inv.dtype == torch.float64 and scale == 1.0
    return inv


def pedsl_table(rp: dict, pairs: int) -> list[float]:
    args = (rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"], rp["low_freq_factor"],
            rp["high_freq_factor"])
    e = parse_module(f"scheme s {{ let v = llama3({', '.join(map(repr, args))}) }}").schemes[0].body[0].value
    return list(fold_expr(e, StaticEnv(values={}, pairs=pairs, n=None)).values)


@pytest.mark.parametrize("rp, head_dim", [
    (SCOUT, 128),
    ({**SCOUT, "low_freq_factor": 2.5, "high_freq_factor": 2.5}, 128),
    ({**SCOUT, "original_max_position_embeddings": 64}, 16),
    ({**SCOUT, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "factor": 8.0}, 128),  # Llama 3.1's, a smooth band
])
def test_the_grid_is_hfs_own_table_in_float64(rp, head_dim, monkeypatch):
    want = hf_table(rp, head_dim, monkeypatch)
    got = torch.tensor(pedsl_table(rp, head_dim // 2), dtype=torch.float64)
    # pedsl folds base ** (-2k / dim), HF 1 / base ** (k / dim): a correctly rounded pow is 0.5 ulp, torch's
    # within 1 ulp, the reciprocal 0.5 ulp, the factor's division the same rounding on both sides; the smooth
    # band's blend (Llama 3.1's case) adds at most 4 roundings of one operand each: 8 eps in all.
    torch.testing.assert_close(got, want, rtol=8 * EPS64, atol=0.0)
    # the branch taken is the same on both sides: no wavelength is within that bound of the band's edges
    wavelen = 2 * math.pi / want
    for edge in (rp["original_max_position_embeddings"] / rp["low_freq_factor"],
                 rp["original_max_position_embeddings"] / rp["high_freq_factor"]):
        assert ((wavelen / edge - 1).abs() > 1e-9).all()
    if rp["low_freq_factor"] == rp["high_freq_factor"]:  # no band: each pair kept or divided by the factor
        plain = 1.0 / rp["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ratio = plain / want
        kept = (ratio - 1).abs() < 1e-12
        assert kept.any() and (~kept).any()
        assert torch.allclose(ratio[~kept], torch.full_like(ratio[~kept], rp["factor"]), rtol=1e-12)


def test_the_wavelength_where_hf_divides_zero_by_zero_is_refused(monkeypatch):
    # pair 0 turns once in 2 pi tokens; original / low_freq_factor = 2 pi exactly in float64
    lo = 8192 / (2 * math.pi)
    assert 8192 / lo == 2 * math.pi
    rp = {**SCOUT, "low_freq_factor": lo, "high_freq_factor": lo}
    assert torch.isnan(hf_table(rp, 16, monkeypatch)[0])
    d = first_error(f"scheme s {{ qk: rotate(llama3(500000.0, 16.0, 8192, {lo!r}, {lo!r}) * position) }}\n")
    assert d.code == "E217" and "0 by 0" in d.message


def test_high_below_low_is_still_refused():
    d = first_error("scheme s { qk: rotate(llama3(500000.0, 16.0, 8192, 4.0, 1.0) * position) }\n")
    assert d.code == "E217" and "below low_freq_factor" in d.message


SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, pad_token_id=0, bos_token_id=None, eos_token_id=None)


def _llama4(rp: dict):
    cfg = transformers.Llama4TextConfig(num_hidden_layers=4, intermediate_size_mlp=48, num_local_experts=2,
                                        floor_scale=4, attention_chunk_size=None, rope_parameters=copy.deepcopy(rp),
                                        **SMALL)
    torch.manual_seed(0)
    return scaled_float64(transformers.Llama4ForCausalLM(cfg))


@pytest.mark.parametrize("original", [8192, 16])
def test_a_llama4_text_model_with_scouts_rope_equals_the_native_model(original):
    """Scout's rope as its config gives it (original 8192: of these 4 pairs only the slowest is divided) and
    with the original shrunk to 16 tokens (three of four divided), so that the division reaches the logits."""
    native = _llama4({**SCOUT, "original_max_position_embeddings": original})
    text = import_config(native.config.to_dict())
    assert "llama3(base, factor, original, low_freq_factor, high_freq_factor)" in text
    assert "param high_freq_factor: float (>= low_freq_factor) = 1.0" in text
    ours = use_pedsl_attention(copy.deepcopy(native), text)
    ids = torch.randint(1, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = native(ids).logits
        plain = use_pedsl_attention(copy.deepcopy(native), text.replace(
            "llama3(base, factor, original, low_freq_factor, high_freq_factor)", "geometric(base)"))(ids).logits
        # Llama 4's attention rotates and tunes in float32 (xq.float()): both sides' float64 twins (those steps
        # too run in float64) within float64's chain rounding, the native model within that floor (triangle)
        exact = float64_native(native, also=FLOAT32_STEPS)(ids).logits
        held = float64_native(ours, also=FLOAT32_STEPS)(ids).logits
    assert_matches_native(held, want, exact, depth(native.config, 40))
    if original == 16:  # the division matters: undivided frequencies are far off
        assert (plain - want).abs().max() > 1e-3
