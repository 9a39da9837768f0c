"""xPos (docs/semantics.md §2c) against the implementations people use and against itself.

Peers: rotary-embedding-torch's ``RotaryEmbedding(use_xpos=True)`` and x-transformers'
``RotaryEmbedding(use_xpos=True)`` (the one behind ``rotary_xpos``), both in float64. Neither has
trained parameters: their float32 buffers (frequencies, decays) are replaced by the same formula
in float64 (``_exact``), and the pedsl scheme takes their settings (``base``, ``xpos_scale_base`` -> gamma,
their 0.4 -> zeta, interleaved pairs) and the peer's rotated q and k must equal pedsl's, the centre
n // 2 included; the attention output must equal SDPA over the peer's q and k. The float64
reference interpreter checks output and gradients with a strong decay (gamma = 3) at offset
positions, and a cache (one token at a time, re-centred every few tokens) equals a full forward,
also in float32 where an uncentred scale would overflow.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import D_MODEL, F32_EPS, SCHEMES, float32_bound
from hf_helpers import inv_freq_rounding
from pedsl.compiler import compile_scheme
from pedsl.lang.api import check

F64 = torch.float64
XPOS = SCHEMES / "xpos.pe"


def _mod(backend="auto", gamma=512.0, base=10000.0, hd=16, heads=2, dtype=F64):
    return compile_scheme(XPOS, backend=backend, num_heads=heads, d_model=D_MODEL, head_dim=hd,
                          params={"gamma": gamma, "base": base}).to(dtype)


def _exact(freqs, decays):
    """The peer's frequencies and decays in float64: both peers build them in float32 (then ``.double()``
    keeps the rounding), pedsl folds them in float64; this is the peer's own formula, recomputed."""
    d = 2 * freqs.numel()
    k2 = torch.arange(0, d, 2, dtype=F64)
    want_f, want_z = 10000.0 ** (-k2 / d), (k2 + 0.4 * d) / (1.4 * d)
    # the peers' float32 power 10000^(-k/d) within inv_freq_rounding; the decay's three roundings within 4 eps32
    rel_f, rel_z = inv_freq_rounding(10000.0), 4 * F32_EPS
    assert torch.allclose(freqs.double(), want_f, rtol=rel_f, atol=0)
    assert torch.allclose(decays.double(), want_z, rtol=rel_z, atol=0)
    return want_f, want_z


def _qkv(B=2, H=2, L=11, D=16, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, D, generator=g, dtype=F64).to(dtype) for _ in range(3))


@pytest.mark.parametrize("gamma", [512.0, 6.0])
def test_rotated_q_and_k_equal_rotary_embedding_torch(gamma):
    from rotary_embedding_torch import RotaryEmbedding

    peer = RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=int(gamma), cache_if_possible=False).double()
    peer.freqs.data, peer.scale = _exact(peer.freqs, peer.scale)
    q, k, v = _qkv(L=13)
    pq, pk = peer.rotate_queries_and_keys(q, k)
    m = _mod(gamma=gamma)
    mq, mk, _, _ = m.transform_qkv(q, k, v)
    torch.testing.assert_close(mq, pq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mk, pk, rtol=1e-12, atol=1e-12)
    want = F.scaled_dot_product_attention(pq, pk, v, is_causal=True)
    for backend in ("sdpa", "masked", "reference"):
        torch.testing.assert_close(_mod(backend, gamma=gamma)(q, k, v), want, rtol=1e-10, atol=1e-12)


def test_attention_equals_x_transformers_rotary_xpos():
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

    peer = RotaryEmbedding(16, use_xpos=True, scale_base=5).double()
    peer.inv_freq, peer.scale = _exact(peer.inv_freq, peer.scale)
    q, k, v = _qkv(L=12)
    freqs, scale = peer.forward(torch.arange(12, dtype=F64))  # float64 positions: its exponents in float64
    pq, pk = apply_rotary_pos_emb(q, freqs, scale), apply_rotary_pos_emb(k, freqs, scale ** -1.0)
    want = F.scaled_dot_product_attention(pq, pk, v, is_causal=True)
    m = _mod(gamma=5.0)
    mq, mk, _, _ = m.transform_qkv(q, k, v)
    torch.testing.assert_close(mq, pq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mk, pk, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m(q, k, v), want, rtol=1e-10, atol=1e-12)
    # the general path (offset positions: x-transformers' forward takes any positions)
    pos = torch.arange(7, 19).expand(2, 12)
    freqs, scale = peer.forward(torch.arange(7, 19, dtype=F64))
    pq, pk = apply_rotary_pos_emb(q, freqs, scale), apply_rotary_pos_emb(k, freqs, scale ** -1.0)
    want = F.scaled_dot_product_attention(pq, pk, v, is_causal=True)
    torch.testing.assert_close(m(q, k, v, positions=pos), want, rtol=1e-10, atol=1e-12)


def test_forward_and_gradients_equal_the_reference_with_a_strong_decay():
    ref = _mod("reference", gamma=3.0, base=50.0)
    q, k, v = (t.requires_grad_() for t in _qkv(B=2, L=9))
    pos = torch.tensor([list(range(4, 13)), [0, 1, 2, 0, 1, 2, 3, 4, 5]])
    docs = torch.tensor([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 1, 1]])
    wgt = torch.randn(2, 2, 9, 16, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = ref(q, k, v, positions=pos, document_ids=docs)
    gw = torch.autograd.grad((want * wgt).sum(), (q, k, v))
    for backend in ("sdpa", "masked"):
        m = _mod(backend, gamma=3.0, base=50.0)
        for kw in ({"positions": pos, "document_ids": docs}, {}):
            out = m(q, k, v, **kw)
            exp = want if kw else ref(q, k, v)
            torch.testing.assert_close(out, exp, rtol=1e-9, atol=1e-10)
            if kw:
                for a, b in zip(torch.autograd.grad((out * wgt).sum(), (q, k, v)), gw):
                    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_decoding_with_a_cache_equals_a_full_forward(dtype):
    """gamma = 4 and 270 tokens (scales within 2^+-63 with a cache whose centre lags n // 2 by up to gamma):
    the centre moves (the cache re-centres its keys) many times; in float32 an uncentred scale
    zeta_0^(-269 / 4) = 2^122 would overflow with most keys', the centred ones stay finite."""
    L, pre = 270, 40
    m = _mod("sdpa", gamma=4.0, base=100.0, dtype=dtype)
    q, k, v = _qkv(B=1, L=L, dtype=dtype)
    full = m(q, k, v)
    assert torch.isfinite(full).all()
    cache = m.new_cache(1)
    outs = [m(q[:, :, :pre], k[:, :, :pre], v[:, :, :pre], cache=cache)]
    for t in range(pre, L):
        outs.append(m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache))
    got = torch.cat(outs, dim=2)
    assert cache.centres[0] >= (L - 4) // 2 - 4  # re-centred along the way
    if dtype == F64:
        torch.testing.assert_close(got, full, rtol=1e-9, atol=1e-10)
        return
    # the float32 chain: the score's 16 channels, the rotation's phase (position x frequency, up to L), the two
    # scales zeta^(+-(n - c) / gamma) (exponent up to 2^63: 63 ln 2 ~ 44 in each), the softmax's and weighted
    # sum's L, the inputs' rounding; cache and full forward each within it of float64, twice it of each other
    want = _mod("sdpa", gamma=4.0, base=100.0)(*(t.double() for t in (q, k, v)))
    bound = float32_bound(16 + 3 * L + 2 * 44 + 2, want)
    assert float((full.double() - want).abs().max()) <= bound
    assert float((got - full).abs().max()) <= 2 * bound


def test_compiled_module_equals_the_in_process_one(tmp_path):
    from compiler_helpers import assert_generated_module_matches
    from pedsl.compiler.codegen import generate

    m = _mod(gamma=3.0)
    src = generate(m.scheme, m.plan)
    assert "3.0, (0.2857" in src  # gamma and the pairs' decays are literals of the Transform record
    assert_generated_module_matches(m, src, tmp_path / "xpos_mod.py")


@pytest.mark.parametrize("text, code, where", [
    ("qk: xpos(geometric(10000.0) * position, gamma = 0)", "E217", "gamma"),
    ("qk: xpos(geometric(10000.0) * position, zeta = -1)", "E217", "zeta"),
    ("qkv: xpos(geometric(10000.0) * position)", "E204", "value rotation"),
    ("qk: xpos(geometric(10000.0) * position, gamma = position)", "E204", "gamma"),
    ("qk: xpos(linear(x, to = pair) * position)", "E204", "phase"),
])
def test_bad_xpos_is_a_positioned_diagnostic(tmp_path, text, code, where):
    f = tmp_path / "bad.pe"
    f.write_text('scheme bad "bad" {\n  ' + text + "\n}\n")
    diags = check(f)
    assert diags and diags[0].code == code and where in diags[0].message, [d.render() for d in diags]
    assert diags[0].line == 2
