"""Content-position terms (``relative = shaw / transformer_xl / deberta``, docs/semantics.md §3b).

Oracles: the papers' formulas written here as plain float64 loops over (i, j) (:func:`naive`: Shaw's
``q_i . (k_j + a[clip(j - i, -K, K)])``, Transformer-XL's ``(q_i + u) . k_j + (q_i + v) . R(i - j) W_R`` with R
the sinusoid, DeBERTa's ``q_i . k_j + q_i . Kr[r] + k_j . Qr[r]`` over ``sqrt(3 D)``) for outputs and the
gradients of q, k, v and every table; the reference interpreter (its own entry-by-entry loop) in every call mode
(packed documents, padding, given positions, GQA, cached prefill and decoding); the generated module.
"""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import (SCHEMES, assert_generated_module_matches, assert_packed_padded_call_matches,
                              first_error, float64_bound, packed_padded_call, rnd)
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.errors import CompileError

F64 = torch.float64
FORMS = {"shaw": "shaw", "transformer_xl": "transformer_xl", "deberta": "deberta_v2"}
PARAMS = {"shaw": {"max_distance": 3}, "transformer_xl": {"dim": 6}, "deberta": {"buckets": 4, "max_distance": 8}}


def _module(form, heads=4, hd=8, **kw):
    m = compile_scheme(SCHEMES / f"{FORMS[form]}.pe", num_heads=heads, head_dim=hd, params=PARAMS[form], **kw)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7)
    return m.double()


def _bucket(d: int, buckets: int, top: int) -> int:
    """DeBERTa-v2's log bucket, from the paper's formula (float32, as Hugging Face computes it)."""
    mid = buckets // 2
    if abs(d) <= mid:
        return d
    f = torch.float32
    t = torch.log(torch.tensor(abs(d) / mid, dtype=f)) / torch.log(torch.tensor((top - 1) / mid, dtype=f))
    return int(math.copysign(math.ceil(float(t * (mid - 1))) + mid, d))


def naive(form, m, q, k, v, causal=True):
    """Attention with the form's terms, one (i, j) at a time, float64; one sequence at positions 0..L-1."""
    B, H, L, D = q.shape
    P = PARAMS[form]
    out = torch.zeros(B, H, L, D, dtype=F64)
    for i in range(L):
        cols = []
        for j in range(L if not causal else i + 1):
            qi, kj = q[:, :, i], k[:, :, j]
            if form == "shaw":
                K = P["max_distance"]
                s = (qi * (kj + m.relative_keys[min(max(j - i, -K), K) + K])).sum(-1) / math.sqrt(D)
            elif form == "transformer_xl":
                E = P["dim"]
                w = [10000.0 ** (-2 * n / E) for n in range(E // 2)]
                R = torch.tensor([math.sin((i - j) * x) for x in w] + [math.cos((i - j) * x) for x in w], dtype=F64)
                pk = torch.einsum("e,ehd->hd", R, m.relative_keys)
                s = ((qi + m.relative_u) * kj).sum(-1) + ((qi + m.relative_v) * pk).sum(-1)
                s = s / math.sqrt(D)
            else:
                S = P["buckets"]
                r = min(max(_bucket(i - j, S, P["max_distance"]) + S, 0), 2 * S - 1)
                s = (qi * kj).sum(-1) + (qi * m.relative_keys[r]).sum(-1) + (kj * m.relative_queries[r]).sum(-1)
                s = s / math.sqrt(3 * D)
            cols.append(s)
        a = torch.softmax(torch.stack(cols, -1), -1)
        out[:, :, i] = torch.einsum("bhj,bhjd->bhd", a, v[:, :, :a.shape[-1]])
    return out


@pytest.mark.parametrize("form", list(FORMS))
def test_equals_the_formula_loop_forward_and_backward(form):
    m = _module(form)
    L = 11  # DeBERTa: distances past max_distance 8 (clamped buckets); Shaw: past K = 3
    q, k, v = (rnd(2, 4, L, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    causal = form != "deberta"
    want, got = naive(form, m, q, k, v, causal), m(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    tables = [p for p in m.parameters()]
    w = rnd(*want.shape, seed=4)
    gw = torch.autograd.grad((want * w).sum(), [q, k, v, *tables])
    gg = torch.autograd.grad((got * w).sum(), [q, k, v, *tables])
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert all(t.abs().max() > 0 for t in gw[3:])  # every table is trained


@pytest.mark.parametrize("form", list(FORMS))
def test_equals_the_reference_packed_padded_and_gqa(form):
    fast = _module(form)
    ref = compile_scheme(SCHEMES / f"{FORMS[form]}.pe", num_heads=4, head_dim=8, params=PARAMS[form],
                         backend="reference").double()
    ref.load_state_dict(fast.state_dict())
    if form != "deberta":
        assert_packed_padded_call_matches(fast, ref)
        return
    # both ways a padded query still sees its document's later tokens: no zero rows to assert
    q, k, v, kw = packed_padded_call()
    want, got = ref(q, k, v, **kw), fast(q, k, v, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    tables = list(fast.parameters())
    wgt = rnd(*want.shape, seed=4)
    gw = torch.autograd.grad((want * wgt).sum(), (q, k, v, *ref.parameters()))
    for a, b in zip(torch.autograd.grad((got * wgt).sum(), (q, k, v, *tables)), gw):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("form", ["shaw", "transformer_xl"])
def test_prefill_then_decoding_equals_the_full_forward_and_the_reference(form):
    m = _module(form)
    ref = compile_scheme(SCHEMES / f"{FORMS[form]}.pe", num_heads=4, head_dim=8, params=PARAMS[form],
                         backend="reference").double()
    ref.load_state_dict(m.state_dict())
    q = rnd(2, 4, 14, 8, seed=1)
    k, v = (rnd(2, 2, 14, 8, seed=s) for s in (2, 3))  # GQA: two key/value heads
    full = m(q, k, v)
    torch.testing.assert_close(full, ref(q, k, v), rtol=1e-10, atol=1e-12)
    cache = m.new_cache(2)
    steps = [m(q[:, :, :9], k[:, :, :9], v[:, :, :9], cache=cache)]
    steps += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(9, 14)]
    got = torch.cat(steps, dim=2)
    assert (got - full).abs().max() <= float64_bound(14 * 8, full)


def test_bidirectional_deberta_sees_later_keys_in_its_document():
    """Both ways: a key after the query changes its output; a key of another document does not."""
    m = _module("deberta")
    q, k, v = (rnd(1, 4, 10, 8, seed=s) for s in (1, 2, 3))
    docs = torch.tensor([[0] * 6 + [1] * 4])
    base = m(q, k, v, document_ids=docs)
    later = v.clone()
    later[:, :, 5] += 1.0
    assert (m(q, k, later, document_ids=docs)[:, :, 0] - base[:, :, 0]).abs().max() > 1e-3
    other = v.clone()
    other[:, :, 8] += 1.0
    torch.testing.assert_close(m(q, k, other, document_ids=docs)[:, :, :6], base[:, :, :6], rtol=0, atol=0)


@pytest.mark.parametrize("form", list(FORMS))
def test_generated_module_equals_the_compiled_one(form, tmp_path):
    m = compile_scheme(SCHEMES / f"{FORMS[form]}.pe", num_heads=4, head_dim=8, params=PARAMS[form])
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    src = generate(m.scheme, m.plan)
    assert_generated_module_matches(m, src, tmp_path / f"{form}_gen.py", lengths=(3, 30))


def test_probs_are_the_forward_weights():
    m = _module("transformer_xl")
    q, k, v = (rnd(1, 4, 12, 8, seed=s) for s in (1, 2, 3))
    a = m.probs(q, k)
    torch.testing.assert_close(a @ v, m(q, k, v), rtol=1e-10, atol=1e-12)


def test_memory_is_blockwise():
    """At L = 1024 with gradients no (B, H, L, L) tensor is kept for the backward pass."""
    m = compile_scheme(SCHEMES / "transformer_xl.pe", num_heads=2, head_dim=8, params={"dim": 8})
    q, k, v = (torch.randn(1, 2, 1024, 8, requires_grad=True) for _ in range(3))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = m(q, k, v)
    assert max(sizes) < 2 * 1024 * 1024  # one (1, 2, 1024, 1024) would be 2M
    o.sum().backward()
    assert torch.isfinite(m.relative_keys.grad).all() and m.relative_u.grad.abs().max() > 0


def test_flex_refuses_with_its_reason():
    with pytest.raises(CompileError) as exc:
        compile_scheme(SCHEMES / "shaw.pe", backend="flex", requires_grad=False)
    assert exc.value.code == "E406" and "content-position terms" in str(exc.value)


@pytest.mark.parametrize("text, code, words", [
    ("scheme s { relative = shaw(4) }", "E223", "by name"),
    ("scheme s { relative = shw(max_distance = 4) }", "E223", "did you mean 'shaw'"),
    ("scheme s { relative = transformer_xl(dim = 7) }", "E223", "even"),
    ("scheme s { relative = deberta(buckets = 8, max_distance = 5) }", "E223", "must exceed"),
    ("scheme s { relative = deberta(buckets = 8, max_distance = 64, c2p = false, p2c = false) }", "E223", "no term"),
    ("scheme s { param K: float = 2.5\n relative = shaw(max_distance = K) }", "E223", "integer"),
    ("scheme s { qk: rotate(geometric(10000) * position)\n relative = shaw(max_distance = 4) }", "E224", "transport"),
    ("scheme s { temperature = 2\n relative = shaw(max_distance = 4) }", "E224", "temperature"),
    ("scheme s { normalize = sigmoid\n relative = shaw(max_distance = 4) }", "E224", "normaliser"),
    ("scheme s { sink = logit\n relative = shaw(max_distance = 4) }", "E224", "sink"),
])
def test_the_checker_refuses_with_the_reason(text, code, words):
    err = first_error(text)
    assert err.code == code and words in err.message, err.render()


@pytest.mark.parametrize("backend", ["sdpa", "masked", "blockwise"])
def test_every_backend_runs_it_as_the_reference(backend):
    """No fused kernel declares the terms: every backend's calls run the general path, equal to the reference."""
    m = _module("shaw", backend=backend)
    ref = compile_scheme(SCHEMES / "shaw.pe", num_heads=4, head_dim=8, params=PARAMS["shaw"],
                         backend="reference").double()
    ref.load_state_dict(m.state_dict())
    assert m.plan.kernels == ()
    q, k, v = (rnd(2, 4, 9, 8, seed=s) for s in (1, 2, 3))
    torch.testing.assert_close(m(q, k, v), ref(q, k, v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("extra", ["bias = -slopes(heads) * distance\nwindow = 5", "softcap = 2.0\nchunk = 4",
                                   "bias = table(bucket(distance, buckets = 8, max_distance = 16), to = head)"])
def test_composes_with_biases_windows_and_caps_as_the_reference(extra, tmp_path):
    src = f'import "{SCHEMES / "transformer_xl.pe"}"\nscheme s extends transformer_xl {{\n{extra}\n}}'
    fast = compile_scheme(src, num_heads=4, head_dim=8, params={"dim": 6})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ref = compile_scheme(src, num_heads=4, head_dim=8, params={"dim": 6}, backend="reference")
    ref.load_state_dict(fast.state_dict())
    assert_packed_padded_call_matches(fast.double(), ref.double())
