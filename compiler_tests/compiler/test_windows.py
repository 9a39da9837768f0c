"""Sliding windows, chunks and learned sinks (docs/semantics.md §11): the blockwise general forward
against the float64 reference interpreter (forward and gradients) at the boundaries, against an
explicit band mask, decoding against one full forward with a cache that stays bounded, the
generated module, and the sink logit against GPT-OSS's eager attention."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES, assert_generated_module_matches, fast_and_reference, output_and_grads
from pedsl.compiler import compile_scheme
from pedsl.compiler.general import attention as general_attention
from pedsl.compiler.general import token_axis
from pedsl.compiler.codegen import generate

H, D = 4, 8


def _pair(base: str, extra: str, **kw):
    """The scheme ``base`` plus ``extra``, compiled for the fast backends and for the reference, with the
    same (perturbed, so that sinks and learned values are not at their initial values) parameters."""
    return fast_and_reference(base, extra, H, D, **kw)


def _qkv(B=2, L=21, Hkv=H, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=torch.float64)
    return [t.requires_grad_(grad) for t in (q, k, v)] + [x]


def _kw(mod, x, **more):
    return dict(x=x, **more) if mod.needs_x else more


BASES = ["rope", "alibi", "fox", "path", "rope_accumulated", "acc_learned_qkv"]
SHAPES = ["window = 1", "window = 3", "window = 64", "chunk = 1", "chunk = 4", "chunk = 64",
          "sink = logit", "sink = token", "window = 5\nsink = logit", "chunk = 6\nsink = token"]


def _cases(bases, shapes):
    """(base, extra) pairs, without sink = token on a value transport (refused: the language tests)."""
    return [(b, e) for b in bases for e in shapes if not (b == "acc_learned_qkv" and "token" in e)]


def _id(case):
    return case.replace("\n", "+").replace(" ", "") if isinstance(case, str) else None


@pytest.mark.parametrize("base, extra", _cases(BASES, SHAPES), ids=_id)
def test_general_forward_matches_the_reference_at_the_boundaries(base, extra):
    """N = 1, N within the sequence and N >= L; packed documents shorter and longer than N, left
    padding, GQA: every output equals the naive float64 interpreter's."""
    fast, ref = _pair(base, extra)
    q, k, v, x = _qkv()
    B, L = 2, q.shape[2]
    torch.testing.assert_close(fast(q, k, v, **_kw(fast, x)), ref(q, k, v, **_kw(ref, x)), rtol=1e-9, atol=1e-10)
    docs = torch.tensor([[0] * 2 + [1] * 12 + [2] * 7, [0] * L])  # documents shorter and longer than N
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    kw = dict(document_ids=docs, attn_mask=mask)
    torch.testing.assert_close(fast(q, k, v, **_kw(fast, x, **kw)), ref(q, k, v, **_kw(ref, x, **kw)),
                               rtol=1e-9, atol=1e-10)
    _, kg, vg, _ = _qkv(Hkv=2, seed=1)  # GQA: two key/value heads for four query heads
    torch.testing.assert_close(fast(q, kg, vg, **_kw(fast, x, **kw)), ref(q, kg, vg, **_kw(ref, x, **kw)),
                               rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("base", ["rope", "fox", "path"])
@pytest.mark.parametrize("extra", ["window = 4\nsink = logit", "chunk = 5\nsink = token"],
                         ids=["window+logit", "chunk+token"])
def test_gradients_match_the_reference(base, extra):
    fast, ref = _pair(base, extra)
    outs = []
    for mod in (fast, ref):
        q, k, v, x = _qkv(L=13, grad=True)
        docs = torch.tensor([[0] * 6 + [1] * 7, [0] * 13])
        outs.append(output_and_grads(mod, q, k, v, seed=5, document_ids=docs, **_kw(mod, x))[1])
    assert len(outs[0]) == len(outs[1])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    if "sink" in extra:  # the sink's parameters learn
        assert any(float(g.abs().max()) > 0 for g in outs[0][3:])


def test_window_and_chunk_equal_the_same_band_as_an_explicit_mask():
    """Independent of the reference: a window (chunk) equals the scheme without it under the same
    band given as a (B, 1, L, L) attention mask."""
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ window = 5 }}'
    win = compile_scheme(src, num_heads=H, head_dim=D).double()
    full = compile_scheme(SCHEMES / "rope.pe", num_heads=H, head_dim=D).double()
    q, k, v, _ = _qkv(L=300)  # several query blocks
    i = torch.arange(300)
    band = ((i[:, None] - i[None, :]) < 5)[None, None].expand(2, 1, 300, 300)
    torch.testing.assert_close(win(q, k, v), full(q, k, v, attn_mask=band), rtol=1e-10, atol=1e-11)
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ chunk = 7 }}'
    chunk = compile_scheme(src, num_heads=H, head_dim=D).double()
    same = ((i[:, None] // 7) == (i[None, :] // 7))[None, None].expand(2, 1, 300, 300)
    torch.testing.assert_close(chunk(q, k, v), full(q, k, v, attn_mask=same), rtol=1e-10, atol=1e-11)
    assert not torch.allclose(win(q, k, v), full(q, k, v))


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_band_false_takes_the_window_or_chunk_from_the_mask_alone(backend):
    """``band=False``: the mask carries the chunk (here chunks shifted by 3 in row 1, as Hugging Face starts a
    left-padded row's chunks at its first token), so the module equals the scheme without a chunk under that
    mask, while its own band over the positions would cut the shifted chunks; no mask: a ShapeError."""
    from pedsl.errors import ShapeError
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ chunk = 4 }}'
    chunk = compile_scheme(src, num_heads=H, head_dim=D, backend=backend).double()
    full = compile_scheme(SCHEMES / "rope.pe", num_heads=H, head_dim=D, backend=backend).double()
    q, k, v, _ = _qkv(L=13)
    i = torch.arange(13)
    shift = torch.tensor([0, 3])[:, None, None]
    m = ((i[:, None] >= i[None, :]) & ((i[:, None] - shift) // 4 == (i[None, :] - shift) // 4))[:, None]
    got = chunk(q, k, v, attn_mask=m, band=False)
    torch.testing.assert_close(got, full(q, k, v, attn_mask=m), rtol=1e-10, atol=1e-11)
    assert (chunk(q, k, v, attn_mask=m) - got)[1].abs().max() > 1e-3  # the band over positions differs
    with pytest.raises(ShapeError, match="band=False"):
        chunk(q, k, v, band=False)


def test_each_block_reads_only_the_keys_it_can_see(monkeypatch):
    """O(L N): every SDPA call of a windowed forward by blocks of queries (the path of packed documents,
    padding and masks; a fresh call of one document runs the C++ kernel where it is built, which reads
    BLOCK + N - 1 keys per block by construction: test_bias_kernel.py) sees at most WINDOW_BLOCK + N - 1 keys."""
    widths = []
    real = general_attention.attend
    monkeypatch.setattr(general_attention, "rows_attend", lambda *a, **kw: None)

    def spy(q, k, v, mask, bias, *args, **kwargs):
        widths.append(k.shape[2])
        return real(q, k, v, mask, bias, *args, **kwargs)

    monkeypatch.setattr(general_attention, "attend", spy)
    src = f'import "{SCHEMES / "alibi.pe"}"\nscheme s extends alibi {{ window = 16 }}'
    mod = compile_scheme(src, num_heads=H, head_dim=D).double()
    q, k, v, _ = _qkv(B=1, L=1000)
    q.requires_grad_(True)
    mod(q, k, v).sum().backward()
    assert widths and max(widths) <= general_attention.WINDOW_BLOCK + 16 - 1
    assert len(widths) == -(-1000 // general_attention.WINDOW_BLOCK)


@pytest.mark.parametrize("base, extra", _cases(["rope", "fox", "path", "rope_accumulated", "acc_learned_qkv"],
                                               ["window = 6", "chunk = 5\nsink = logit", "window = 3\nsink = token"]),
                         ids=_id)
def test_decoding_equals_one_forward_and_the_cache_stays_bounded(base, extra):
    fast, _ = _pair(base, extra)
    B, L, P = 2, 200, 17
    q, k, v, x = _qkv(B=B, L=L, seed=4)
    with torch.no_grad():
        full = fast(q, k, v, **_kw(fast, x))
        cache = fast.new_cache(B)
        outs = [fast(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=cache, **_kw(fast, x[:, :P]))]
        most = 0
        for t in range(P, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache, **_kw(fast, x[:, s])))
            most = max(most, len(cache))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
    assert cache.dropped > 0 and most <= 6 + 64 + 1  # at most the width plus the batch of dead tokens
    assert max(b.shape[token_axis(b)] for b in cache._buf.values()) <= 128


def test_a_full_length_mask_reads_past_the_dropped_tokens():
    """An attn_mask over every token so far (Hugging Face's) still fits once the cache has dropped some."""
    src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ window = 4 }}'
    mod = compile_scheme(src, num_heads=H, head_dim=D).double()
    q, k, v, _ = _qkv(B=1, L=150, seed=2)
    cache = mod.new_cache(1)
    with torch.no_grad():
        full = mod(q, k, v)
        mod(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache=cache)
        for t in range(1, 150):
            s = slice(t, t + 1)
            o = mod(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache, attn_mask=torch.ones(1, t + 1, dtype=torch.bool))
    assert cache.dropped > 0
    torch.testing.assert_close(o, full[:, :, -1:], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("extra", ["window = 4\nsink = logit", "chunk = 3\nsink = token"])
def test_generated_module_matches(extra, tmp_path):
    src = f'import "{SCHEMES / "fox.pe"}"\nscheme s extends fox {{\n{extra}\n}}'
    mod = compile_scheme(src, num_heads=H, head_dim=D, d_model=D_MODEL)
    with torch.no_grad():
        for p in mod.parameters():
            p.add_(0.3)
    assert_generated_module_matches(mod, generate(mod.scheme, mod.plan, d_model=D_MODEL), tmp_path / "windowed.py")


def test_sink_logit_matches_gpt_oss_eager_attention():
    """GPT-OSS's eager_attention_forward (sinks concatenated to the scaled, masked logits, dropped after
    the softmax) with its sliding-window mask, against `sink = logit` with `window = N` on NoPE."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    src = f'import "{SCHEMES / "nope.pe"}"\nscheme s extends nope {{\nwindow = 5\nsink = logit\n}}'
    mod = compile_scheme(src, num_heads=H, head_dim=D).double()
    with torch.no_grad():
        mod.sink_logit.copy_(torch.tensor([-1.0, 0.0, 2.0, 5.0]))
    q, k, v, _ = _qkv(B=2, L=23, Hkv=2, seed=7)
    L = q.shape[2]
    i = torch.arange(L)
    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 5)  # transformers' sliding_window_overlay
    additive = torch.zeros(L, L, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)

    class Layer(torch.nn.Module):
        num_key_value_groups = 2
        training = False
        sinks = mod.sink_logit.detach()

    hf, _ = gpt_oss.eager_attention_forward(Layer(), q, k, v, additive[None, None], scaling=D ** -0.5)
    torch.testing.assert_close(mod(q, k, v), hf.transpose(1, 2), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("extra", ["window = 5\nsink = logit", "chunk = 6\nsink = token"])
def test_analysis_sees_the_window_and_the_sink(extra):
    """probs() (rows sum to one minus the sink's share) and the streamed far/sink masses of `pedsl
    analyze` agree with the forward."""
    from pedsl.study.instruments import far_mass, sink_mass
    from pedsl.study.streaming import streamed_far_sink

    fast, _ = _pair("alibi", extra)
    q, k, v, _ = _qkv(B=1, L=40, seed=6)
    a = fast.probs(q, k)
    out = a.to(v.dtype) @ v
    if "token" in extra:  # the sink token's value, by the weight the rows leave
        out = out + (1 - a.sum(-1, keepdim=True)) * fast.sink_value.detach().double()[None, :, None, :]
    torch.testing.assert_close(out, fast(q, k, v), rtol=1e-9, atol=1e-10)
    got = streamed_far_sink(fast, q, k, 3, block=16)
    torch.testing.assert_close(got["far_mass"], far_mass(a, 3), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["sink_mass"], sink_mass(a), rtol=1e-9, atol=1e-12)
