"""Differential attention (docs/semantics.md §1b) against its formula and against Hugging Face's DiffLlama.

Two independent oracles: the definition written here as float64 loops (for each pair of heads (h, h + H/2),
two softmaxes over the visible keys, weights ``a_h - lambda a_{h + H/2}`` applied to each head's own value,
``lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init``), for outputs and the gradients of q, k, v and the
learned lambda rows; and the reference backend's naive interpreter with packed documents, padding, given
positions, grouped key/value heads, a rotation and a bias. Cached decoding equals the full forward; rows past
one block of queries, the streamed instruments and the generated module agree. The peer: a tiny random
``DiffLlamaForCausalLM`` in float64 whose every attention layer is replaced by pedsl's ``rope_differential``
(the same projections and lambda weights; the pair's RMS norm and the (1 - lambda_init) scale are the
model's, written here as DiffLlama writes them) gives the same logits.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from compiler_helpers import (
    D_MODEL, SCHEMES, assert_generated_module_matches, assert_packed_padded_call_matches, module_from_text,
    rnd,
)
from pedsl.compiler import compile_scheme
from pedsl.lang.api import check, load

F64 = torch.float64

ROPE_ALIBI = """
scheme d_rope "differential attention over a rotation and a bias" {
  qk: rotate(geometric(100.0) * position)
  bias = -slopes(heads) * distance
  normalize = differential(lambda_init = 0.3)
  EXTRA
}
"""


def _mod(text, backend="auto", heads=4, hd=8, tmp=None):
    return module_from_text(text, tmp, backend, heads, hd)


def _rand(*shape, seed):
    return rnd(*shape, seed=seed)


def formula(q, k, v, lam_rows, lambda_init, window=None):
    """The definition as loops over pairs, queries i and keys j <= i (within ``window``), float64; query head
    h reads key/value head ``h // (Hq / Hk)``."""
    B, H, L, D = q.shape
    rep, half = H // k.shape[1], H // 2
    q1, k1, q2, k2 = lam_rows
    lam = torch.exp(sum(q1[c] * k1[c] for c in range(D))) - torch.exp(sum(q2[c] * k2[c] for c in range(D))) \
        + lambda_init
    rows = {}
    for b in range(B):
        for i in range(L):
            keys = [j for j in range(i + 1) if window is None or i - j < window]

            def weights(h):
                e = [torch.exp((q[b, h, i] * k[b, h // rep, j]).sum() / math.sqrt(D)) for j in keys]
                return [x / sum(e) for x in e]

            for h in range(half):
                w = [a - lam * c for a, c in zip(weights(h), weights(h + half))]
                for g in (h, h + half):  # both heads of the pair: the same weights, each its own value
                    rows[b, g, i] = sum(wj * v[b, g // rep, j] for wj, j in zip(w, keys))
    return torch.stack([torch.stack([torch.stack([rows[b, h, i] for i in range(L)]) for h in range(H)])
                        for b in range(B)])


@pytest.mark.parametrize("hkv, window", [(2, None), (1, None), (4, 3)])
def test_the_general_call_equals_the_formula_forward_and_backward(tmp_path, hkv, window):
    """Even key/value heads pair among themselves; one (odd) is repeated per query head first."""
    extra = "" if window is None else f"window = {window}"
    m = _mod('scheme d "alone" {\n  normalize = differential(lambda_init = 0.3)\n  ' + extra + "\n}\n", tmp=tmp_path)
    with torch.no_grad():
        m.differential_lambda.copy_(0.3 * _rand(4, 8, seed=9))
    q = (2 * _rand(2, 4, 7, 8, seed=1)).requires_grad_()
    k, v = (_rand(2, hkv, 7, 8, seed=s).requires_grad_() for s in (2, 3))
    got, want = m(q, k, v), formula(q, k, v, m.differential_lambda, 0.3, window)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if hkv > 1:  # the pair's heads read different values (one key/value head: the same value)
        assert float((want[:, :2] - want[:, 2:]).detach().abs().max()) > 0.1
    wgt = _rand(*want.shape, seed=4)
    wrt = (q, k, v, m.differential_lambda)
    for a, b in zip(torch.autograd.grad((got * wgt).sum(), wrt), torch.autograd.grad((want * wgt).sum(), wrt)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_documents_padding_positions_and_gqa_equal_the_reference(tmp_path):
    text = ROPE_ALIBI.replace("EXTRA", "")
    m, ref = _mod(text, tmp=tmp_path), _mod(text, "reference", tmp=tmp_path)
    ref.load_state_dict(m.state_dict())
    assert_packed_padded_call_matches(m, ref)


@pytest.mark.parametrize("shape", ["", "window = 4", "mask = bidirectional"])
def test_cached_decoding_and_masks_equal_the_reference(tmp_path, shape):
    """A token decoded after a cached prefill weighs its keys as the full forward does (the cache holds each
    key/value head widened by its partner's); a bidirectional mask runs on the same blocks."""
    text = ROPE_ALIBI.replace("EXTRA", shape).replace("  bias = -slopes(heads) * distance\n", "" if "mask" in shape
                                                                                      else "  bias = -slopes(heads) * distance\n")
    m, ref = _mod(text, tmp=tmp_path), _mod(text, "reference", tmp=tmp_path)
    ref.load_state_dict(m.state_dict())
    q, k, v = _rand(2, 4, 13, 8, seed=1), _rand(2, 2, 13, 8, seed=2), _rand(2, 2, 13, 8, seed=3)
    full = m(q, k, v)
    torch.testing.assert_close(full, ref(q, k, v), rtol=1e-10, atol=1e-12)
    if "mask" in shape:
        return
    cache = m.new_cache(2)
    steps = [m(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache=cache)]
    steps += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)


def test_rows_past_one_block_of_queries_equal_the_dense_formula(tmp_path):
    """300 queries: two blocks of the general path; against the formula written densely in float64, and the
    module's attention matrix (``probs``) is the pair's weights."""
    m = _mod('scheme d "alone" {\n  normalize = differential(lambda_init = 0.3)\n}\n', heads=2, tmp=tmp_path)
    q, k, v = (_rand(1, 2, 300, 8, seed=s) for s in (1, 2, 3))
    causal = torch.ones(300, 300, dtype=torch.bool).tril()
    a = torch.softmax(((q @ k.transpose(-1, -2)) / math.sqrt(8)).masked_fill(~causal, -math.inf), -1)
    r = m.differential_lambda.detach().double()
    lam = torch.exp(r[0] @ r[1]) - torch.exp(r[2] @ r[3]) + 0.3
    w = a[:, :1] - lam * a[:, 1:]
    torch.testing.assert_close(m(q, k, v), w @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.probs(q, k), w.expand(1, 2, 300, 300), rtol=1e-10, atol=1e-12)


def test_streamed_instruments_equal_the_dense_ones():
    from pedsl.study import instruments as ins
    from pedsl.study.streaming import streamed_far_sink

    mod = compile_scheme(SCHEMES / "rope_differential.pe", head_dim=16, num_heads=2, d_model=D_MODEL,
                         requires_grad=False).double()
    q, k = (2 * _rand(2, 2, 70, 16, seed=s) for s in (1, 2))
    a = mod.probs(q, k)
    got = streamed_far_sink(mod, q, k, 8, block=16)
    torch.testing.assert_close(got["far_mass"], ins.far_mass(a, 8), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["sink_mass"], ins.sink_mass(a), rtol=1e-9, atol=1e-12)


def test_compiled_module_equals_the_in_process_one(tmp_path):
    from pedsl.compiler.codegen import generate

    m = _mod(ROPE_ALIBI.replace("EXTRA", ""), tmp=tmp_path)
    src = generate(m.scheme, m.plan)
    assert "NORMALIZE = 'differential'" in src and "LAMBDA_INIT = 0.3" in src
    assert_generated_module_matches(m, src, tmp_path / "d_mod.py")


def test_lambda_init_is_diffllamas_per_layer_and_no_kernel_takes_it():
    from transformers.models.diffllama.modeling_diffllama import lambda_init_fn

    for layer in (0, 1, 5):
        s = load(SCHEMES / "rope_differential.pe", {"layer_index": layer})
        assert s.normalize == "differential" and s.lambda_init == pytest.approx(lambda_init_fn(layer), abs=1e-15)
    assert compile_scheme(SCHEMES / "rope_differential.pe", num_heads=2, head_dim=16).plan.kernels == ()


@pytest.mark.parametrize("text, code, where", [
    ("normalize = differential(lambda_init = n)", "E242", "known when the scheme is checked"),
    ("normalize = differential(0.5)", "E242", "normalize takes"),
    ("sink = logit\n  normalize = differential", "E242", "cannot go with sink = logit"),
    ("param heads: int = 3\n  normalize = differential", "E264", "even number of heads, not 3"),
    ("qkv: rotate(geometric(100.0) * position)\n  normalize = differential", "E264", "transport of the values"),
])
def test_bad_differential_is_a_positioned_diagnostic(tmp_path, text, code, where):
    f = tmp_path / "bad.pe"
    f.write_text('scheme bad "bad" {\n  ' + text + "\n}\n")
    diags = check(f)
    assert diags and diags[0].code == code and where in diags[0].message, [d.render() for d in diags]
    assert diags[0].line == text.count("\n") + 2


def _pedsl_attention(attn, mod):
    """DiffLlamaAttention.forward with pedsl's attention: HF's projections, pedsl's rotation and differential
    weights, then DiffLlama's model part (the pair's outputs side by side, RMS norm, (1 - lambda_init), o_proj)."""
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        B, L, _ = hidden_states.shape
        shape = (B, L, -1, self.head_dim)
        q, k, v = (p(hidden_states).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = mod(q, k, v)  # (B, H, L, D): head i and i + H/2 of a pair
        H = o.shape[1]
        pair = o.view(B, 2, H // 2, L, self.head_dim).permute(0, 3, 2, 1, 4).reshape(B, L, H // 2, 2 * self.head_dim)
        out = (1 - self.lambda_init) * self.groupnorm(pair)
        return self.o_proj(out.reshape(B, L, -1)), None
    return types.MethodType(forward, attn)


def _rope_in_float64(self, x, position_ids):
    """DiffLlama's default rope table (base 500, head_dim 8) formed in float64 (Hugging Face forms it in float32)."""
    inv = 1.0 / 500.0 ** (torch.arange(0, 8, 2, dtype=F64) / 8)
    freqs = position_ids[..., None].to(F64) * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _hf_lambdas(a) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffLlama's exp(lambda_q1 . lambda_k1) and exp(lambda_q2 . lambda_k2) as its forward computes them (the
    dot products summed in float32), in float64."""
    return tuple(torch.exp(torch.sum(x * y, dim=-1, dtype=torch.float32)).double()
                 for x, y in ((a.lambda_q1, a.lambda_k1), (a.lambda_q2, a.lambda_k2)))


def _as_rows(lam1: torch.Tensor, lam2: torch.Tensor, D: int) -> torch.Tensor:
    """Rows (q1, k1, q2, k2) whose exp(q1 . k1), exp(q2 . k2) are lam1, lam2 (to float64 rounding)."""
    rows = torch.zeros(4, D, dtype=F64)
    rows[0, 0], rows[1, 0], rows[2, 0], rows[3, 0] = torch.log(lam1), 1.0, torch.log(lam2), 1.0
    return rows


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_diffllama_logits_equal_with_pedsl_attention(kv_heads):
    """Every layer's attention replaced by rope_differential at that layer index: the logits agree in float64.
    DiffLlama sums lambda's dot products in float32, so the lambda rows pedsl takes are its float64 vectors
    (checked within float32's rounding of that sum) for the lambda's formula, and rows giving DiffLlama's own
    rounded exponentials for the logits."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    from compiler_helpers import F32_EPS
    from pedsl.compiler.scores import differential_lambda

    torch.manual_seed(0)
    cfg = DiffLlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=8, lambda_std_dev=0.3,
                          max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    model = DiffLlamaForCausalLM(cfg).double().eval()
    model.model.rotary_emb.forward = types.MethodType(_rope_in_float64, model.model.rotary_emb)
    tokens = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(tokens).logits
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        mod = compile_scheme(SCHEMES / "rope_differential.pe", num_heads=4, head_dim=8,
                             params={"base": 500.0, "layer_index": i}).double()
        assert mod.plan.lambda_init == pytest.approx(a.lambda_init, abs=1e-15)
        lam1, lam2 = _hf_lambdas(a)
        with torch.no_grad():
            mod.differential_lambda.copy_(torch.stack([a.lambda_q1, a.lambda_k1, a.lambda_q2, a.lambda_k2]))
            ours = differential_lambda(mod.differential_lambda, mod.plan.lambda_init)
            # float32 rounds each of the 8 products' sum and the exponential: |d lambda_i| <= lambda_i (8 + 1) eps
            # (1 + sum |x y|)
            bound = sum(float(lam) * 9 * F32_EPS * (1 + float((x * y).abs().sum()))
                        for lam, x, y in ((lam1, a.lambda_q1, a.lambda_k1), (lam2, a.lambda_q2, a.lambda_k2)))
            assert abs(float(ours - (lam1 - lam2 + a.lambda_init))) <= bound
            mod.differential_lambda.copy_(_as_rows(lam1, lam2, 8))
        a.forward = _pedsl_attention(a, mod)
        layer.pedsl_attention = mod
    with torch.no_grad():
        got = model(tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    assert float(want.std()) > 0.01
