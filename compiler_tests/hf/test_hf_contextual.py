"""xpos and stick_breaking inside a Hugging Face model (use_pedsl_attention's general path): decoding
with HF's cache equals one full forward; export-hf refuses both with the reason."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import SCHEMES
from pedsl.errors import PedslError
from pedsl.hf import use_pedsl_attention
from pedsl.hf.rope import export_rope
from pedsl.lang.api import load

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["xpos", "stick_breaking"])
def test_decoding_in_a_llama_equals_the_full_forward(name):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    m = transformers.LlamaForCausalLM(cfg).double().eval()
    use_pedsl_attention(m, SCHEMES / f"{name}.pe")
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        full = m(ids).logits
        out = m(ids[:, :6], use_cache=True)
        steps, pkv = [out.logits], out.past_key_values
        for t in range(6, 12):
            out = m(ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            steps.append(out.logits)
            pkv = out.past_key_values
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, why", [("xpos", "per-pair decay"), ("stick_breaking", "softmax")])
def test_export_hf_refuses_with_the_reason(name, why):
    with pytest.raises(PedslError, match=why):
        export_rope(load(SCHEMES / f"{name}.pe"))
