"""CoPE (``contextual = cope(...)``, docs/semantics.md §1c) against the paper's formula and x-transformers.

Two independent oracles:

* the reference backend's naive float64 loop of the formula (``pedsl.ops.reference.cope_loop``: for
  every (i, j) the sum of ``sigmoid(s(i, t))`` over the visible keys t = j..i, clamped, and the two
  neighbouring rows of ``q_i . e`` mixed by the fractional part), for outputs and gradients (q, k, v
  and the embedding) with packed documents, padding, given positions, GQA, a bias, per-head
  embeddings, a window and stick-breaking weights;
* x-transformers' ``CoPE`` inside its ``Attend`` (the peer, a test-only dependency) in float64 at a
  length past one block of queries. Loading the peer's parameters: its ``pos_emb`` ``(max_pos, dim_head)``
  is pedsl's ``contextual_embedding`` as it is (``load_state_dict({"contextual_embedding": cope.pos_emb})``);
  ``Attend(scale = dim_head ** -0.5)`` is pedsl's scale. Attend computes its softmax in float32 whatever
  the input's dtype, so the test gives it a float64 softmax (``attn_fn``) to compare at 1e-12.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES, run_cli
from pedsl.compiler import compile_scheme

F64 = torch.float64

WITH_BIAS = """
scheme cope_alibi "CoPE beside ALiBi" {
  bias = -slopes(heads) * distance
  contextual = cope(max_pos = 5, shared = SHARED)
  EXTRA
}
"""


def _mod(text_or_path, backend="auto", heads=4, hd=8, tmp=None):
    path = text_or_path
    if tmp is not None:
        path = tmp / "s.pe"
        path.write_text(text_or_path)
    return compile_scheme(path, backend=backend, num_heads=heads, d_model=D_MODEL, head_dim=hd).double()


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _same_embedding(*mods, seed=7, scale=0.7):
    e = _rand(*mods[0].contextual_embedding.shape, seed=seed) * scale
    with torch.no_grad():
        for m in mods:
            m.contextual_embedding.copy_(e)


@pytest.mark.parametrize("shared, extra", [("true", ""), ("false", ""), ("true", "window = 4"),
                                           ("true", "normalize = stick_breaking")])
def test_general_call_equals_the_formula_loop(tmp_path, shared, extra):
    text = WITH_BIAS.replace("SHARED", shared).replace("EXTRA", extra)
    ref, m = _mod(text, "reference", tmp=tmp_path), _mod(text, tmp=tmp_path)
    _same_embedding(ref, m)
    B, L = 3, 9
    docs = torch.tensor([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 2, 2], [5] * 9])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[2, :3] = False
    pos = torch.tensor([list(range(3, 12)), [0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 0, 0] + list(range(6))])
    q = _rand(B, 4, L, 8, seed=1).mul(2).requires_grad_()
    k, v = (_rand(B, 2, L, 8, seed=s).requires_grad_() for s in (2, 3))
    kw = dict(positions=pos, document_ids=docs, attn_mask=mask)
    want, got = ref(q, k, v, **kw), m(q, k, v, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    wgt = _rand(*want.shape, seed=4)
    gw = torch.autograd.grad((want * wgt).sum(), (q, k, v, ref.contextual_embedding))
    gg = torch.autograd.grad((got * wgt).sum(), (q, k, v, m.contextual_embedding))
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    assert gw[3].abs().max() > 0  # the embedding is trained
    assert want[2, :, :3].abs().max() == 0  # padded queries: no key, zeros


def test_the_contextual_term_changes_the_output(tmp_path):
    """Not a no-op: a non-zero embedding moves the output off plain NoPE attention (zero at first)."""
    m = _mod(SCHEMES / "cope.pe")
    q, k, v = (_rand(1, 4, 10, 8, seed=s) for s in (1, 2, 3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(m(q, k, v), plain, rtol=1e-12, atol=1e-12)
    _same_embedding(m)
    assert (m(q, k, v) - plain).abs().max() > 1e-3


def _x_transformers_attend(H, D, max_pos):
    xt = pytest.importorskip("x_transformers.x_transformers")
    attend = pytest.importorskip("x_transformers.attend")
    cope = xt.CoPE(dim=D, heads=H, max_pos=max_pos).double()
    with torch.no_grad():
        cope.pos_emb.copy_(_rand(max_pos, D, seed=11))
    att = attend.Attend(heads=H, causal=True, cope=cope, scale=D ** -0.5).double()
    att.attn_fn = lambda s: s.softmax(dim=-1)  # the peer's softmax runs in float32; float64 to compare
    return att, cope


@pytest.mark.parametrize("max_pos", [4, 16])
def test_equals_x_transformers_cope_past_one_block_with_gradients(max_pos):
    """L = 300 > one block of 256 queries; max_pos 4 clamps most counts, 16 interpolates most."""
    H, D, L = 2, 8, 300
    att, cope = _x_transformers_attend(H, D, max_pos)
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=H, head_dim=D, params={"max_pos": max_pos}).double()
    m.load_state_dict({"contextual_embedding": cope.pos_emb.detach()}, strict=False)
    q, k, v = (_rand(1, H, L, D, seed=s).requires_grad_() for s in (1, 2, 3))
    want, _ = att(q, k, v)
    got = m(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    wgt = _rand(*want.shape, seed=4)
    gw = torch.autograd.grad((want * wgt).sum(), (q, k, v, cope.pos_emb))
    gg = torch.autograd.grad((got * wgt).sum(), (q, k, v, m.contextual_embedding))
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_decoding_with_a_cache_equals_the_full_forward():
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=4, head_dim=8).double()
    _same_embedding(m)
    q = _rand(2, 4, 40, 8, seed=1) * 2
    k, v = (_rand(2, 2, 40, 8, seed=s) for s in (2, 3))  # GQA: 2 key/value heads
    full = m(q, k, v)
    cache = m.new_cache(2)
    steps = [m(q[:, :, :17], k[:, :, :17], v[:, :, :17], cache=cache)]
    steps += [m(q[:, :, 17:20], k[:, :, 17:20], v[:, :, 17:20], cache=cache)]
    steps += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(20, 40)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 0.06), (torch.float16, 0.01), (torch.float32, 1e-5)])
def test_low_precision_stays_close_to_float64(dtype, tol):
    """The gates, their suffix sums and the softmax run in float32 at least; q.k and q.e in the dtype."""
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=4, head_dim=16)
    with torch.no_grad():
        m.contextual_embedding.copy_(_rand(*m.contextual_embedding.shape, seed=5).float() * 0.5)
    q, k, v = (_rand(2, 4, 300, 16, seed=s) for s in (1, 2, 3))
    want = m.double()(q, k, v)
    got = m.to(dtype)(*(t.to(dtype) for t in (q, k, v)))
    assert got.dtype == dtype
    err = (got.double() - want).abs().max().item()
    assert err < tol * max(1.0, want.abs().max().item()), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_within_twice_the_error_of_x_transformers_at_that_precision(dtype):
    """The hand-written layer at the same precision: x-transformers' Attend with CoPE, run in the dtype
    (its softmax in float32, as it does); both against the float64 forward of one set of parameters."""
    H, D, L = 4, 16, 300
    att, cope = _x_transformers_attend(H, D, 16)
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=H, head_dim=D).double()
    m.load_state_dict({"contextual_embedding": cope.pos_emb.detach()}, strict=False)
    att.attn_fn = lambda s: s.softmax(dim=-1, dtype=torch.float32)
    q, k, v = (_rand(2, H, L, D, seed=s) for s in (1, 2, 3))
    with torch.no_grad():
        want = m(q, k, v)
        low = [t.to(dtype) for t in (q, k, v)]
        ours = (m.to(dtype)(*low).double() - want).abs().max().item()
        peer = (att.to(dtype)(*low)[0].double() - want).abs().max().item()
    assert ours <= 2 * peer, (ours, peer)


def test_memory_is_blockwise_and_backward_recomputes():
    """At L = 1024 with gradients no (B, H, L, L) tensor is kept for the backward pass: the saved tensors
    hold O(L x block), not the 1024 x 1024 scores."""
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=2, head_dim=8)
    q, k, v = (torch.randn(1, 2, 1024, 8, requires_grad=True) for _ in range(3))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = m(q, k, v)
    assert max(sizes) < 2 * 1024 * 1024  # one (1, 2, 1024, 1024) would be 2M
    o.sum().backward()
    assert torch.isfinite(m.contextual_embedding.grad).all()


def test_probs_are_the_forward_weights():
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=2, head_dim=8).double()
    _same_embedding(m)
    q, k, v = (_rand(1, 2, 12, 8, seed=s) for s in (1, 2, 3))
    a = m.probs(q, k)
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 2, 12, dtype=F64))
    torch.testing.assert_close(a @ v, m(q, k, v), rtol=1e-10, atol=1e-12)


def test_generated_module_equals_the_compiled_one(tmp_path):
    code, _, err = run_cli("compile", str(SCHEMES / "cope.pe"), "-o", str(tmp_path), "--heads", "4",
                           "--head-dim", "8", "-P", "max_pos=6")
    assert code == 0, err
    spec = importlib.util.spec_from_file_location("standalone_cope_gen", tmp_path / "cope.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gen = mod.Module().double()
    m = compile_scheme(SCHEMES / "cope.pe", num_heads=4, head_dim=8, params={"max_pos": 6}).double()
    _same_embedding(m)
    gen.load_state_dict(m.state_dict())
    q, k, v = (_rand(2, 4, 20, 8, seed=s) for s in (1, 2, 3))
    docs = torch.tensor([[0] * 20, [0] * 7 + [1] * 13])
    torch.testing.assert_close(gen(q, k, v, document_ids=docs), m(q, k, v, document_ids=docs), rtol=1e-12, atol=1e-12)
