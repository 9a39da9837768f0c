"""Logit soft-capping (`softcap = c`, Gemma 2's attn_logit_softcapping): the general forward against
the float64 reference interpreter (forward and gradients) with windows, chunks, sinks, documents,
padding and GQA; against Gemma 2's eager attention; decoding against one full forward; the
generated module; and the analysis (probs, streamed far / sink / learned-sink mass)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES, assert_generated_module_matches, fast_and_reference, output_and_grads, float32_bound
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate

H, D = 4, 8


def _pair(base: str, extra: str):
    """``base`` plus ``extra``, compiled for the fast backends and for the reference, with the same
    (perturbed) parameters."""
    return fast_and_reference(base, extra, H, D)


def _qkv(B=2, L=21, Hkv=H, seed=0, grad=False, spread=3.0):
    """Queries scaled by ``spread`` so that the scores reach well past the caps the tests use."""
    g = torch.Generator().manual_seed(seed)
    q = spread * torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64)
    return [t.requires_grad_(grad) for t in (q, k, v)] + [x]


def _kw(mod, x, **more):
    return dict(x=x, **more) if mod.needs_x else more


BASES = ["rope", "alibi", "fox", "rope_accumulated", "acc_learned_qkv", "stick_breaking", "nope", "cope", "t5_bias"]
CAPS = ["softcap = 1.5", "softcap = 0.5\nwindow = 4", "softcap = 2.0\nchunk = 5\nsink = logit",
        "softcap = 1.0\nsink = token"]


def _cases():
    """Without the combinations the language refuses: a sink token beside a value transport, a sink with
    stick-breaking or CoPE."""
    return [(b, e) for b in BASES for e in CAPS
            if not (b == "acc_learned_qkv" and "token" in e) and not (b in ("stick_breaking", "cope") and "sink" in e)]


def _id(case):
    return case.replace("\n", "+").replace(" ", "") if isinstance(case, str) else None


@pytest.mark.parametrize("base, extra", _cases(), ids=_id)
def test_capped_forward_matches_the_reference(base, extra):
    fast, ref = _pair(base, extra)
    assert fast.plan.softcap is not None
    q, k, v, x = _qkv()
    B, L = 2, q.shape[2]
    torch.testing.assert_close(fast(q, k, v, **_kw(fast, x)), ref(q, k, v, **_kw(ref, x)), rtol=1e-9, atol=1e-10)
    docs = torch.tensor([[0] * 2 + [1] * 12 + [2] * 7, [0] * L])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    kw = dict(document_ids=docs, attn_mask=mask)
    torch.testing.assert_close(fast(q, k, v, **_kw(fast, x, **kw)), ref(q, k, v, **_kw(ref, x, **kw)),
                               rtol=1e-9, atol=1e-10)
    _, kg, vg, _ = _qkv(Hkv=2, seed=1)
    torch.testing.assert_close(fast(q, kg, vg, **_kw(fast, x, **kw)), ref(q, kg, vg, **_kw(ref, x, **kw)),
                               rtol=1e-9, atol=1e-10)


def test_the_cap_changes_the_output_and_a_huge_cap_does_not():
    q, k, v, _ = _qkv(L=30)
    plain = compile_scheme(SCHEMES / "rope.pe", num_heads=H, head_dim=D).double()(q, k, v)
    capped, _ = _pair("rope", "softcap = 1.0")
    loose, _ = _pair("rope", "softcap = 1e9")
    assert (capped(q, k, v) - plain).abs().max() > 1e-2
    torch.testing.assert_close(loose(q, k, v), plain, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("base, extra", [("rope", "softcap = 1.0"), ("rope", "softcap = 0.7\nwindow = 4\nsink = logit"),
                                         ("fox", "softcap = 1.0"), ("fox", "softcap = 0.7\nwindow = 4\nsink = logit"),
                                         ("stick_breaking", "softcap = 0.7\nwindow = 4")], ids=_id)
def test_capped_gradients_match_the_reference(base, extra):
    fast, ref = _pair(base, extra)
    outs = []
    for mod in (fast, ref):
        q, k, v, x = _qkv(L=13, grad=True)
        docs = torch.tensor([[0] * 6 + [1] * 7, [0] * 13])
        outs.append(output_and_grads(mod, q, k, v, seed=5, document_ids=docs, **_kw(mod, x))[1])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_capped_attention_matches_gemma2_eager_attention():
    """transformers' Gemma 2 eager attention (scores / cap, tanh, * cap, then the mask and the softmax)
    with its sliding-window mask, against `softcap = c` with `window = N` on NoPE, GQA."""
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    src = f'import "{SCHEMES / "nope.pe"}"\nscheme s extends nope {{\nwindow = 6\nsoftcap = 2.5\n}}'
    mod = compile_scheme(src, num_heads=H, head_dim=D).double()
    q, k, v, _ = _qkv(B=2, L=23, Hkv=2, seed=7)
    L = q.shape[2]
    i = torch.arange(L)
    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 6)
    additive = torch.zeros(L, L, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)

    class Layer(torch.nn.Module):
        num_key_value_groups = 2
        training = False

    hf, _ = gemma2.eager_attention_forward(Layer(), q, k, v, additive[None, None], scaling=D ** -0.5, softcap=2.5)
    # Gemma 2's eager softmax runs in float32 whatever the input: the capped logits (|s| <= 2.5) cast with an
    # absolute error 2.5 u, moving a weight by 2 x 2.5 u relative; the exp, the L-term sum and the division add
    # L + 2; the float64 weighted sum keeps that times max|v|. Dropping the cap (below) errs by > 1e-2.
    bound = float32_bound(L + 2 + 5, v)
    assert float((mod(q, k, v) - hf.transpose(1, 2)).abs().max()) <= bound
    uncapped, _ = gemma2.eager_attention_forward(Layer(), q, k, v, additive[None, None], scaling=D ** -0.5)
    assert (mod(q, k, v) - uncapped.transpose(1, 2)).abs().max() > 1e-2


@pytest.mark.parametrize("base", ["fox", "rope"])  # rope: the one-token fast path must keep the cap too
@pytest.mark.parametrize("extra", ["softcap = 1.0", "softcap = 1.0\nwindow = 6", "softcap = 1.0\nwindow = 6\nsink = logit"],
                         ids=["cap", "window", "window_sink"])
def test_capped_decoding_equals_one_forward(base, extra):
    fast, _ = _pair(base, extra)
    B, L, P = 2, 90, 11
    q, k, v, x = _qkv(B=B, L=L, seed=4)
    with torch.no_grad():
        full = fast(q, k, v, **_kw(fast, x))
        cache = fast.new_cache(B)
        outs = [fast(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=cache, **_kw(fast, x[:, :P]))]
        for t in range(P, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache, **_kw(fast, x[:, s])))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)


def test_generated_capped_module_matches(tmp_path):
    src = f'import "{SCHEMES / "alibi.pe"}"\nscheme s extends alibi {{\nsoftcap = 1.5\nsink = logit\n}}'
    mod = compile_scheme(src, num_heads=H, head_dim=D, d_model=D_MODEL)
    with torch.no_grad():
        for p in mod.parameters():
            p.add_(0.3)
    text = generate(mod.scheme, mod.plan, d_model=D_MODEL)
    assert "SOFTCAP = 1.5" in text
    assert_generated_module_matches(mod, text, tmp_path / "capped.py")


@pytest.mark.parametrize("extra", ["softcap = 1.0", "softcap = 1.0\nwindow = 5\nsink = logit"], ids=["cap", "window"])
def test_analysis_sees_the_cap(extra):
    """probs() and the streamed far / first-token / learned-sink masses agree with the capped forward."""
    from pedsl.study.instruments import far_mass, learned_sink_mass, sink_mass
    from pedsl.study.streaming import streamed_far_sink

    fast, _ = _pair("alibi", extra)
    q, k, v, _ = _qkv(B=1, L=40, seed=6)
    a = fast.probs(q, k)
    torch.testing.assert_close(a.to(v.dtype) @ v, fast(q, k, v), rtol=1e-9, atol=1e-10)
    got = streamed_far_sink(fast, q, k, 3, block=16)
    torch.testing.assert_close(got["far_mass"], far_mass(a, 3), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["sink_mass"], sink_mass(a), rtol=1e-9, atol=1e-12)
    has = "sink" in extra
    torch.testing.assert_close(got["learned_sink_mass"], learned_sink_mass(a, has), rtol=1e-9, atol=1e-12)
    assert (float(got["learned_sink_mass"].min()) > 0) == has
