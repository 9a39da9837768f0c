"""xpos, stick_breaking and cope inside a Hugging Face model (use_pedsl_attention's general path): decoding
with HF's cache equals one full forward; export-hf refuses them with the reason. CoPE gives every layer
its own embedding (pedsl_scheme is then a ModuleList, one compiled module per layer)."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import assert_matches_native, depth, float64_native, rounding

from compiler_helpers import SCHEMES
from pedsl.errors import PedslError
from pedsl.hf import use_pedsl_attention
from pedsl.hf.rope import export_rope
from pedsl.lang.api import load

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["xpos", "stick_breaking", "cope"])
def test_decoding_in_a_llama_equals_the_full_forward(name):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    m = transformers.LlamaForCausalLM(cfg).double().eval()
    use_pedsl_attention(m, SCHEMES / f"{name}.pe")
    with torch.no_grad():  # CoPE's embedding starts at zero: give it values, so decoding reads it
        for p_name, p in m.named_parameters():
            if "contextual_embedding" in p_name:
                p.normal_()
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        full = m(ids).logits
        out = m(ids[:, :6], use_cache=True)
        steps, pkv = [out.logits], out.past_key_values
        for t in range(6, 12):
            out = m(ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            steps.append(out.logits)
            pkv = out.past_key_values
    # float64 both ways, summed in different orders: float64's rounding of the logits' chain
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=rounding(depth(cfg, 12), full))


@pytest.mark.parametrize("name, why", [("xpos", "per-pair decay"), ("stick_breaking", "softmax"),
                                       ("cope", "CoPE")])
def test_export_hf_refuses_with_the_reason(name, why):
    with pytest.raises(PedslError, match=why):
        export_rope(load(SCHEMES / f"{name}.pe"))


def test_cope_in_a_llama_has_an_embedding_per_layer_that_trains_and_changes_generation():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    m = transformers.LlamaForCausalLM(cfg).double().eval()
    use_pedsl_attention(m, SCHEMES / "cope.pe")
    embs = {n: p for n, p in m.named_parameters() if "contextual_embedding" in n}
    assert sorted(embs) == ["pedsl_scheme.0.contextual_embedding", "pedsl_scheme.1.contextual_embedding"]
    ids = torch.randint(0, 64, (2, 10))
    m(ids, labels=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in embs.values())
    with torch.no_grad():
        for p in embs.values():
            p.normal_(std=3.0)
        out = m.generate(ids[:, :4], max_new_tokens=6, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
        again = m(out.sequences[:, :-1]).logits[:, 3:]
    # greedy generation with HF's cache scores each new token as one full forward of the prefix does
    # (generate hands its logits back in float32)
    bound = rounding(depth(cfg, 10), again, float32_output=True)
    torch.testing.assert_close(torch.stack(out.logits, 1).double(), again, rtol=0, atol=bound)


def test_remapped_positions_in_a_llama_decode_as_the_full_forward_and_differ_from_rope():
    """ReRoPE through use_pedsl_attention: HF's rotary path cannot carry it (export refuses), so the layers run
    pedsl's general path; decoding equals the full forward, and past the window the logits leave RoPE's."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    base = transformers.LlamaForCausalLM(cfg).double().eval()
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        rope = base(ids).logits
        exact = float64_native(base)(ids).logits
    text = f'import "{SCHEMES / "rerope.pe"}"\nscheme s extends rerope {{\n  param reach: int = 4\n}}\n'
    m = use_pedsl_attention(base, text)
    with torch.no_grad():
        full = m(ids).logits
        out = m(ids[:, :6], use_cache=True)
        steps, pkv = [out.logits], out.past_key_values
        for t in range(6, 12):
            out = m(ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            steps.append(out.logits)
            pkv = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)
    # every key within the window: RoPE's float64 twin within float64's chain rounding, and HF's model (float32
    # inverse frequencies) within the floor they cost (triangle inequality)
    assert_matches_native(full[:, :4], rope[:, :4], exact[:, :4], depth(base.config, 12))
    assert (full[:, 6:] - rope[:, 6:]).abs().max() > 1e-4
