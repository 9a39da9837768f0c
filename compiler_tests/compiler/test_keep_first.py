"""`keep_first = k` (StreamingLLM's attention sinks beside a window or chunk, LM-Infinite's global tokens): a
statement added through its registry record only. Against a float64 loop (forward and backward), the float64
reference interpreter in every call mode (fresh, documents, padding, GQA, a cached prefill then one-token
decoding), the module `pedsl compile` writes; and no fused kernel claims it (none declares its feature)."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES, assert_generated_module_matches, fast_and_reference, output_and_grads
from pedsl.compiler import compile_scheme
from pedsl.compiler import kernel_support as K
from pedsl.compiler.codegen import generate

H, D = 4, 8


def _qkv(B=2, L=19, Hkv=H, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _loop(q, k, v, window: int, keep: int):
    """Plain causal attention (no transport, scale 1/sqrt(D)) where query i sees key j <= i iff i - j < window
    or j < keep: one softmax per query over the keys it sees, written out."""
    B, Hq, L, _ = q.shape
    rows = []
    for b in range(B):
        for h in range(Hq):
            for i in range(L):
                seen = [j for j in range(i + 1) if i - j < window or j < keep]
                s = torch.stack([(q[b, h, i] * k[b, h, j]).sum() / math.sqrt(D) for j in seen])
                w = torch.softmax(s, 0)
                rows.append(sum(w[n] * v[b, h, j] for n, j in enumerate(seen)))
    return torch.stack(rows).view(B, Hq, L, D)


def test_keep_first_equals_a_float64_loop_forward_and_backward():
    fast, _ = fast_and_reference("nope", "window = 4\nkeep_first = 3", H, D)
    q, k, v = _qkv(L=17, grad=True)
    got = fast(q, k, v)
    want = _loop(q, k, v, 4, 3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mine = torch.autograd.grad((got * weight).sum(), (q, k, v))
    theirs = torch.autograd.grad((want * weight).sum(), (q, k, v))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    plain, _ = fast_and_reference("nope", "window = 4", H, D)
    assert (plain(q, k, v) - got).abs().max() > 1e-2  # the first keys change what the late queries see


CASES = [("rope", "window = 4\nkeep_first = 2"), ("alibi", "window = 5\nkeep_first = 3"),
         ("t5_bias", "chunk = 6\nkeep_first = 2"), ("rope_accumulated", "window = 3\nkeep_first = 1\nsink = logit"),
         ("rope", "window = 4\nkeep_first = 2\nmask = prefix(3)"), ("path", "window = 5\nkeep_first = 2")]


def _id(case):
    return case.replace("\n", "+").replace(" ", "") if isinstance(case, str) else None


@pytest.mark.parametrize("base, extra", CASES, ids=_id)
def test_keep_first_matches_the_reference_fresh_documents_padding_and_gqa(base, extra):
    fast, ref = fast_and_reference(base, extra, H, D)
    assert "keep_first" in K.plan_features(fast.plan)
    q, k, v = _qkv()
    B, L = q.shape[0], q.shape[2]
    x = {"x": torch.randn(B, L, D_MODEL, dtype=torch.float64)} if fast.needs_x else {}  # PaTH's steps read it
    torch.testing.assert_close(fast(q, k, v, **x), ref(q, k, v, **x), rtol=1e-9, atol=1e-10)
    docs = torch.tensor([[0] * 3 + [1] * 11 + [2] * 5, [0] * L])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :4] = False  # left padding: the row's first kept keys are its first real positions
    pos = torch.arange(L).repeat(B, 1)
    pos[1, 4:] = torch.arange(L - 4)
    kw = dict(document_ids=docs, attn_mask=mask, positions=pos, **x)
    torch.testing.assert_close(fast(q, k, v, **kw), ref(q, k, v, **kw), rtol=1e-9, atol=1e-10)
    if base != "path":  # PaTH's transport keeps a key/value head per query head
        _, kg, vg = _qkv(Hkv=2, seed=1)
        torch.testing.assert_close(fast(q, kg, vg, **kw), ref(q, kg, vg, **kw), rtol=1e-9, atol=1e-10)


def test_keep_first_gradients_match_the_reference():
    fast, ref = fast_and_reference("alibi", "window = 3\nkeep_first = 2", H, D)
    outs = []
    for mod in (fast, ref):
        q, k, v = _qkv(L=13, grad=True)
        docs = torch.tensor([[0] * 5 + [1] * 8, [0] * 13])
        outs.append(output_and_grads(mod, q, k, v, seed=5, document_ids=docs)[1])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_no_fused_kernel_claims_it():
    """The feature no declaration takes: the plan keeps none of the kernels its window alone allows."""
    fast, _ = fast_and_reference("rope", "window = 4\nkeep_first = 2", H, D)
    plain, _ = fast_and_reference("rope", "window = 4", H, D)
    windowed = {"flash-window", "band", "decode", "flex"}
    assert windowed & set(plain.plan.kernels) and not windowed & set(fast.plan.kernels)
    assert not [d.name for d in K.KERNELS if "keep_first" in d.takes]


@pytest.mark.parametrize("base", ["rope", "alibi"])
def test_a_cached_prefill_then_one_token_decoding_equals_one_forward(base):
    """Past the cache's trim point (64 dead keys): the first keys stay cached and visible."""
    fast, ref = fast_and_reference(base, "window = 5\nkeep_first = 3", H, D)
    B, L, P = 2, 84, 9
    q, k, v = _qkv(B=B, L=L, seed=4)
    with torch.no_grad():
        full = fast(q, k, v)
        cache = fast.new_cache(B)
        outs = [fast(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=cache)]
        for t in range(P, L):
            s = slice(t, t + 1)
            outs.append(fast(q[:, :, s], k[:, :, s], v[:, :, s], cache=cache))
        torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
        short = slice(0, 20)  # the reference's loops are O(L^2): its prefill and two decoded tokens
        rcache, want = ref.new_cache(B), fast(q[:, :, short], k[:, :, short], v[:, :, short])
        got = [ref(q[:, :, :18], k[:, :, :18], v[:, :, :18], cache=rcache)]
        got += [ref(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=rcache) for t in (18, 19)]
        torch.testing.assert_close(torch.cat(got, 2), want, rtol=1e-9, atol=1e-10)


def test_the_generated_module_keeps_the_first_keys(tmp_path):
    src = f'import "{SCHEMES / "alibi.pe"}"\nscheme s extends alibi {{\nwindow = 4\nkeep_first = 2\n}}'
    mod = compile_scheme(src, num_heads=H, head_dim=D, d_model=D_MODEL)
    text = generate(mod.scheme, mod.plan, d_model=D_MODEL)
    assert "KEEP_FIRST = 2" in text and "'keep_first'" not in text.split("FAST_PATHS = ")[1].split("\n")[0]
    assert_generated_module_matches(mod, text, tmp_path / "kept.py")
