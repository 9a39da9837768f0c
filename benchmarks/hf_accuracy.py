"""How close pedsl's YaRN and LongRoPE are to Hugging Face transformers', before and after issue 14.

    python -m benchmarks.hf_accuracy          # about 10 s on one core; needs transformers

YaRN at the Qwen-style shape of the issue (head_dim 128, rope_theta 1e6, factor 4, original 32768):

- per frequency: max |w_pedsl - w_HF| / w_HF over the 64 pairs, HF's inv_freq from its own
  ``_compute_yarn_parameters`` (float32);
- end to end: one causal attention (2 heads, L = 2048, q, k, v ~ N(0, 1), float64) through HF's
  rotary embedding and SDPA against pedsl's compiled module; the max over query positions of
  ||o_pedsl - o_HF|| / ||o_HF||. HF computes its phases in float32 (position x ~6e-8 rad of
  rounding), which is what remains after the fix.

"Before" is the paper's wavelength-ratio ramp with the attention factor as a temperature on the
whole logit (the old yarn.pe, now yarn_wavelength.pe); "after" is yarn.pe, imported from the same
config with ``pedsl import-hf``. LongRoPE at Phi-3-mini's shape (head_dim 96, 48 short and 48 long
factors, original 4096, max 131072): the old library scheme could not express it (one 16-entry
list, head_dim 32 only); the imported scheme is compared the same way below and past the original.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _hf_attention(cfg, q, k, v):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    rot = LlamaRotaryEmbedding(cfg)
    L = q.shape[2]
    cos, sin = rot(q, torch.arange(L)[None])
    qr, kr = apply_rotary_pos_emb(q, k, cos.to(q.dtype), sin.to(q.dtype))
    return F.scaled_dot_product_attention(qr, kr, v, is_causal=True), rot.inv_freq.double()


def _pedsl(scheme_text_or_path, heads, head_dim, params=None):
    import pedsl
    from pedsl.compiler import compile_scheme

    s = pedsl.load(scheme_text_or_path, heads=heads, head_dim=head_dim, params=params)
    return s, compile_scheme(s, num_heads=heads, head_dim=head_dim, backend="sdpa")


def _freqs(mod, L):
    (t,) = mod.transforms
    ph = mod.evaluator.run(t.expr, mod._ctx(L, group=t), t.site)
    return ph.align(("pos", "pair")).expand(L, len(t.channels) // 2)[1]


def _compare(cfg, mod, L, heads, head_dim, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, L, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    q = q * scale
    o_hf, w_hf = _hf_attention(cfg, q, k, v)
    with torch.no_grad():
        o = mod(q, k, v)
    rel = ((o - o_hf).norm(dim=-1) / o_hf.norm(dim=-1)).max().item()
    w = _freqs(mod, L)
    return (w - w_hf).abs().div(w_hf).max().item(), rel


def main() -> None:
    from transformers import LlamaConfig

    from pedsl.hf import import_config

    torch.set_num_threads(1)
    H, D, L = 2, 128, 2048
    rp = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=131072,
                      rope_parameters=dict(rp))
    _, before = _pedsl("import \"yarn_wavelength.pe\"\nscheme y extends yarn_wavelength {}\n", H, D,
                       {"base": 1e6, "factor": 4.0, "original": 32768})
    _, after = _pedsl(import_config({**cfg.to_dict(), "model_type": "qwen2"}), H, D)
    print(f"YaRN (head_dim {D}, theta 1e6, factor 4, original 32768), L = {L}")
    for name, mod in (("before (wavelength ramp, temperature)", before), ("after (HF's index ramp, scale)", after)):
        fw, att = _compare(cfg, mod, L, H, D)
        print(f"  {name:40s} max rel. freq. diff {fw:.2e}   max rel. attention-output diff {att:.2e}")
    # LongRoPE, Phi-3-mini's shape with made-up but typical factor lists
    D = 96
    short = [1.0 + 0.05 * math.sqrt(i) for i in range(48)]
    long = [1.0 + 0.5 * i for i in range(48)]
    rp = {"rope_type": "longrope", "short_factor": short, "long_factor": long, "rope_theta": 10000.0}
    cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=131072,
                      original_max_position_embeddings=4096, rope_parameters=dict(rp))
    _, mod = _pedsl(import_config({**cfg.to_dict(), "model_type": "phi3"}), H, D)
    print(f"LongRoPE (head_dim {D}, 48 + 48 factors, original 4096, max 131072)")
    for L in (2048, 4608):
        fw, att = _compare(cfg, mod, L, H, D)
        print(f"  L = {L:5d} ({'short' if L <= 4096 else 'long'} factors)          max rel. freq. diff {fw:.2e}   "
              f"max rel. attention-output diff {att:.2e}")


if __name__ == "__main__":
    main()
