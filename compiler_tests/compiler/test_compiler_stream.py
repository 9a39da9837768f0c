"""The general forward (positions, documents, masks, GQA, cache) of every library scheme.

Oracles: the reference backend's naive float64 interpreter (explicit products and sums per (i, j),
explicit masks) for the full general call; and, independently of it, the one-sequence forward:
a packed row equals its documents run one by one, a left-padded row equals the row unpadded, GQA
equals k and v repeated per query head, and a prefill plus decoding (one token, chunks of 3) with
a cache equals one full forward.
"""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import D_MODEL
from compiler_helpers import SCHEMES, as_axes, forbid_single_token_layout, library
from pedsl.compiler import compile_scheme
from pedsl.errors import CompileError, PedslError, ShapeError

F64 = torch.float64


def _mod(path, backend="auto", heads=4, params=None):
    hd = 32 if path.stem == "longrope" else 16
    return compile_scheme(path, backend=backend, num_heads=heads, d_model=D_MODEL, head_dim=hd, params=params).double()


def _data(mod, B, L, Hkv, seed=1, grad=False):
    g = torch.Generator().manual_seed(seed)
    D = mod.head_dim
    q = torch.randn(B, mod.heads, L, D, generator=g, dtype=F64)
    k = torch.randn(B, Hkv, L, D, generator=g, dtype=F64)
    v = torch.randn(B, Hkv, L, D, generator=g, dtype=F64)
    x = torch.randn(B, L, D_MODEL, generator=g, dtype=F64)
    tok = torch.randint(0, 256, (B, L), generator=g)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, (x if mod.needs_x else None), (tok if mod.needs_tokens else None)


def _sl(t, a, b):
    return None if t is None else t[:, a:b]


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_general_call_matches_the_reference(path):
    """Offsets, gaps in the positions (accumulated quantities count tokens, docs/semantics.md §2b), packed
    documents, left padding and GQA (Hq 4, Hkv 2) at once, every backend: output and gradients equal the
    naive float64 interpreter."""
    ref = _mod(path, "reference")
    B, L = 3, 9
    docs = torch.tensor([[0] * 9, [0, 0, 0, 1, 1, 1, 1, 2, 2], [5] * 9])
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[2, :3] = False
    pos = torch.tensor([[3, 4, 5, 8, 9, 12, 13, 14, 20], [0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 0, 0] + list(range(6))])
    pos = as_axes(ref, pos)  # a scheme with several axes: (A, B, L)
    q, k, v, x, tok = _data(ref, B, L, 2, grad=True)
    kw = dict(x=x, tokens=tok, positions=pos, document_ids=docs, attn_mask=mask)
    want = ref(q, k, v, **kw)
    wgt = torch.randn(want.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    gw = torch.autograd.grad((want * wgt).sum(), (q, k, v))
    ran = []
    for backend in ("sdpa", "masked", "blockwise"):
        try:
            m = _mod(path, backend)
        except CompileError:
            continue
        ran.append(backend)
        m.load_state_dict(ref.state_dict())
        out = m(q, k, v, **kw)
        torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
        for a, b in zip(torch.autograd.grad((out * wgt).sum(), (q, k, v)), gw):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    # a distance table (T5, DPB, KERPLE, FIRE, Sandwich) has no blockwise scan: it runs on the other two
    assert "blockwise" in ran or (ran == ["sdpa", "masked"] and any(b.kind in ("distance-table", "axis-distance") for b in ref.biases))
    if ref.plan.mask == "causal":  # padded queries see no key: zeros, not NaN (a bidirectional one sees the row's)
        assert want[2, :, :3].abs().max() == 0


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_packed_padded_and_gqa_equal_separate_runs(path):
    m = _mod(path)
    lens = (3, 4, 2)
    L = sum(lens)
    q, k, v, x, tok = _data(m, 1, L, 1)
    docs = torch.tensor([[d for d, n in enumerate(lens) for _ in range(n)]])
    packed = m(q, k, v, x=x, tokens=tok, document_ids=docs)
    s = 0
    for n in lens:  # each document alone, through the fused one-sequence path (MQA: k, v repeated)
        rep = lambda t: t[:, :, s:s + n].expand(-1, m.heads, -1, -1)  # noqa: E731
        alone = m(q[:, :, s:s + n], rep(k), rep(v), x=_sl(x, s, s + n), tokens=_sl(tok, s, s + n))
        torch.testing.assert_close(packed[:, :, s:s + n], alone, rtol=1e-9, atol=1e-10)
        s += n
    # left padding: row 1 is row 0's last 5 tokens behind 4 pads
    q, k, v, x, tok = _data(m, 2, 9, 2, seed=3)
    for t in (q, k, v):
        t[1, :, 4:] = t[0, :, 4:]
    for t in (x, tok):
        if t is not None:
            t[1, 4:] = t[0, 4:]
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :4] = False
    padded = m(q, k, v, x=x, tokens=tok, attn_mask=mask)
    alone = m(q[:1, :, 4:], k[:1, :, 4:], v[:1, :, 4:], x=_sl(x, 4, 9)[:1] if x is not None else None,
              tokens=_sl(tok, 4, 9)[:1] if tok is not None else None)
    torch.testing.assert_close(padded[1:, :, 4:], alone, rtol=1e-9, atol=1e-10)
    if m.plan.mask == "causal":  # a bidirectional padded query sees the row's keys
        assert padded[1, :, :4].abs().max() == 0
    # GQA with 2 and 1 key/value heads == k, v repeated per query head
    for hkv in (2, 1):
        q, k, v, x, tok = _data(m, 2, 6, hkv, seed=4)
        r = m.heads // hkv
        torch.testing.assert_close(m(q, k, v, x=x, tokens=tok),
                                   m(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), x=x, tokens=tok),
                                   rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_prefill_then_decode_equals_one_forward(path):
    """Prefill 5 tokens, then one token at a time and chunks of 3, with GQA (Hkv 2): outputs equal the
    full forward; the prefill's gradients equal the full forward's for its rows. The other backends
    that accept the scheme: chunks of 3 equal their full forward."""
    # a prefix-LM's prefix inside the first call of every split below (a call may not split it)
    params = {"train_length": 64} if path.stem == "dynamic_ntk" else {"prefix": 3} if path.stem == "prefix_lm" else None
    m = _mod(path, params=params)
    if m.plan.mask == "bidirectional":  # nothing to decode: refused (test_masks.py)
        with pytest.raises(PedslError, match="nothing to decode"):
            m.new_cache(2)
        return
    B, L, P = 2, 11, 5
    q, k, v, x, tok = _data(m, B, L, 2, grad=True)
    full = m(q, k, v, x=x, tokens=tok)
    wgt = torch.randn(B, m.heads, P, m.head_dim, generator=torch.Generator().manual_seed(5), dtype=F64)
    g_full = torch.autograd.grad((full[:, :, :P] * wgt).sum(), (q, k, v))
    for step in (1, 3):
        c = m.new_cache(B)
        pre = m(q[:, :, :P], k[:, :, :P], v[:, :, :P], x=_sl(x, 0, P), tokens=_sl(tok, 0, P), cache=c)
        if step == 1:
            g_pre = torch.autograd.grad((pre * wgt).sum(), (q, k, v))
            for a, b in zip(g_pre, g_full):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
        outs = [pre.detach()]
        with torch.no_grad():
            for s in range(P, L, step):
                e = min(L, s + step)
                outs.append(m(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], x=_sl(x, s, e), tokens=_sl(tok, s, e),
                              cache=c))
        assert len(c) == L
        torch.testing.assert_close(torch.cat(outs, 2), full.detach(), rtol=1e-9, atol=1e-10)
    # every other backend that accepts the scheme: chunks of 3 against its own full forward
    for backend in ("sdpa", "masked", "blockwise"):
        try:
            mb = _mod(path, backend, params=params)
        except CompileError:
            continue
        if mb.backend == m.backend:
            continue
        mb.load_state_dict(m.state_dict())
        c = mb.new_cache(B)
        with torch.no_grad():
            outs = [mb(q[:, :, s:s + 3], k[:, :, s:s + 3], v[:, :, s:s + 3], x=_sl(x, s, s + 3),
                       tokens=_sl(tok, s, s + 3), cache=c) for s in range(0, L, 3)]
            torch.testing.assert_close(torch.cat(outs, 2), mb(q, k, v, x=x, tokens=tok), rtol=1e-9, atol=1e-10)


def test_decoding_a_packed_padded_batch_matches_the_reference():
    """Decoding continues each row's document and skips padding, as the reference does."""
    for name in ("acc_random_alibi", "path_fox", "rope"):
        ref = _mod(SCHEMES / f"{name}.pe", "reference")
        m = _mod(SCHEMES / f"{name}.pe")
        m.load_state_dict(ref.state_dict())
        q, k, v, x, tok = _data(m, 2, 8, 1, seed=6)
        docs = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [0] * 8])
        mask = torch.ones(2, 8, dtype=torch.bool)
        mask[1, :2] = False
        want = ref(q, k, v, x=x, tokens=tok, document_ids=docs, attn_mask=mask)
        c = m.new_cache(2)
        outs = [m(q[:, :, :4], k[:, :, :4], v[:, :, :4], x=_sl(x, 0, 4), tokens=_sl(tok, 0, 4),
                  document_ids=docs[:, :4], attn_mask=mask[:, :4], cache=c)]
        for s in range(4, 8):  # decoding: the document and positions continue by default
            outs.append(m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], x=_sl(x, s, s + 1),
                          tokens=_sl(tok, s, s + 1), cache=c, attn_mask=mask[:, : s + 1]))  # (B, cached + 1)
        torch.testing.assert_close(torch.cat(outs, 2), want, rtol=1e-9, atol=1e-10)


def test_dynamic_ntk_cached_keys_keep_the_table_they_were_rotated_with():
    """Past the original length the table changes with n: as in Hugging Face, a cached key keeps the
    rotation of the table in force when it was cached; the new query and key use the current table."""
    m = _mod(SCHEMES / "dynamic_ntk.pe", heads=2, params={"train_length": 8})
    L, P = 12, 6
    q, k, v, _, _ = _data(m, 1, L, 2)
    c = m.new_cache(1)
    outs = [m(q[:, :, :P], k[:, :, :P], v[:, :, :P], cache=c)]
    for s in range(P, L):
        outs.append(m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], cache=c))
    t = m.transforms[0]
    D = m.head_dim
    # by hand: key j rotated with the table of n = max(P, j + 1); query i with the table of n = max(P, i + 1)
    def rot(x, n, p):
        cos, sin = m.rope_tables(t, n, torch.device("cpu"), F64)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos[p] - x2 * sin[p], x2 * cos[p] + x1 * sin[p]], -1)
    for i in range(L):
        qi = rot(q[0, :, i], max(P, i + 1), i)
        keys = torch.stack([rot(k[0, :, j], max(P, j + 1), j) for j in range(i + 1)], 1)  # (H, i+1, D)
        a = torch.softmax((keys @ qi.unsqueeze(-1)).squeeze(-1) / D ** 0.5, -1)
        torch.testing.assert_close(torch.cat(outs, 2)[0, :, i], (a.unsqueeze(-1) * v[0, :, : i + 1]).sum(1))
    full = m(q, k, v)
    assert (torch.cat(outs, 2) - full).abs().max() > 1e-6  # and it is not the one-shot forward past n = 8


def test_masks_and_fully_masked_rows():
    m = _mod(SCHEMES / "alibi.pe")
    ref = _mod(SCHEMES / "alibi.pe", "reference")
    q, k, v, _, _ = _data(m, 2, 6, 4)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(7)) > 0.4
    mask[0, 0, 3] = False  # a query that sees nothing
    out = m(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref(q, k, v, attn_mask=mask), rtol=1e-9, atol=1e-10)
    assert out[0, :, 3].abs().max() == 0 and not out.isnan().any()
    add = torch.zeros(2, 1, 6, 6, dtype=F64).masked_fill(~mask, torch.finfo(F64).min)  # HF's additive form
    torch.testing.assert_close(m(q, k, v, attn_mask=add), out)
    # queries behind their keys without a cache: the last Lq tokens
    torch.testing.assert_close(m(q[:, :, 4:], k, v), m(q, k, v)[:, :, 4:])


def test_errors_name_the_argument():
    m = _mod(SCHEMES / "rope.pe")
    q, k, v, _, _ = _data(m, 2, 5, 4)
    with pytest.raises(ShapeError, match="does not divide q's 4 heads"):
        m(q, k[:, :3], v[:, :3])
    with pytest.raises(ShapeError, match="k and v must have one shape"):
        m(q, k, v[:, :, :4])
    with pytest.raises(ShapeError, match="q has 5 positions but k and v only 4"):
        m(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ShapeError, match="positions go backwards inside a document: row 1, token 3"):
        m(q, k, v, positions=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 1, 4]]))
    # a new document may restart its positions
    m(q, k, v, positions=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]), document_ids=torch.tensor([[0] * 5, [0, 0, 0, 1, 1]]))
    with pytest.raises(ShapeError, match="positions must be an integer tensor"):
        m(q, k, v, positions=torch.zeros(2, 5))
    with pytest.raises(ShapeError, match="attn_mask has shape"):
        m(q, k, v, attn_mask=torch.ones(2, 7, dtype=torch.bool))
    with pytest.raises(ShapeError, match="float mask"):
        m(q, k, v, attn_mask=torch.full((2, 1, 5, 5), 0.5))
    c = m.new_cache(3)
    with pytest.raises(ShapeError, match="batch size 3, this call has 2"):
        m(q, k, v, cache=c)
    other = _mod(SCHEMES / "alibi.pe")
    with pytest.raises(ShapeError, match="cache was made by another module .scheme 'alibi'"):
        m(q, k, v, cache=other.new_cache(2))
    c = m.new_cache(2)
    m(q, k, v, cache=c, positions=torch.arange(5).expand(2, 5))
    with pytest.raises(ShapeError, match="position 2 after 4 .the cache's last token"):
        m(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache=c, positions=torch.tensor([[2], [5]]))
    with pytest.raises(ShapeError, match="new_cache: batch_size"):
        m.new_cache(0)


def test_path_decoding_applies_pending_steps_lazily(monkeypatch):
    """Decoding keeps PaTH steps as one pending product and applies it every PATH_FLUSH tokens (here 3);
    a call with gradients after pending steps first brings the cached keys up to date."""
    from pedsl.compiler.general import path as general_path

    monkeypatch.setattr(general_path, "PATH_FLUSH", 3)
    m = _mod(SCHEMES / "path_fox.pe", heads=2)
    q, k, v, x, _ = _data(m, 2, 12, 2)
    full = m(q, k, v, x=x)
    c = m.new_cache(2)
    outs = [m(q[:, :, :2], k[:, :, :2], v[:, :, :2], x=x[:, :2], cache=c)]
    with torch.no_grad():
        for s in range(2, 10):
            outs.append(m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], x=x[:, s:s + 1], cache=c))
    assert c.path_pending is not None  # steps waiting for the next flush
    kg = k[:, :, 10:].clone().requires_grad_()  # the autograd path
    outs.append(m(q[:, :, 10:], kg, v[:, :, 10:], x=x[:, 10:], cache=c))
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)


ROPE_QKV = """
scheme rope_qkv_partial "RoPE on half the channels of q, k and v, with a log-length temperature" {
  param train_length: int (>= 8) = 16
  layout halves
  channels {
    rot = quarters(1, 3)
    plain = rest
  }
  let w = geometric(10000.0)
  qkv on rot: rotate(w * position)
  temperature = log_length(train_length)
  allow frayed_frequencies
}
"""


@pytest.mark.parametrize("name", ["rope", "rope_id", "yarn_wavelength", "rope_qkv"])
def test_decode_fast_path_equals_the_general_path(name, tmp_path, monkeypatch):
    """RoPE-family decoding takes the per-token fast path (no layout work: layout() is made to fail
    for one-token calls) and equals the general path token for token, interleaved with chunked calls
    (which take the general path), with GQA; value rotation, partial channels and temperature included."""
    import pedsl.compiler.stream as stream

    if name == "rope_qkv":
        src = tmp_path / "rope_qkv.pe"
        src.write_text(ROPE_QKV)
    else:
        src = SCHEMES / f"{name}.pe"
    m = _mod(src)
    assert stream._fast_decode_plan(m) is not None
    B, L, P = 2, 14, 4
    q, k, v, _, _ = _data(m, B, L, 2, seed=3)
    full = m(q, k, v)
    forbid_single_token_layout(monkeypatch)
    c = m.new_cache(B)
    outs, s = [], 0
    with torch.no_grad():
        for n in (P, 1, 1, 3, 1, 2, 1, 1):
            outs.append(m(q[:, :, s:s + n], k[:, :, s:s + n], v[:, :, s:s + n], cache=c))
            s += n
    assert s == L and len(c) == L
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)
    # the cache's layout buffers stay those of the general path: positions 0..L-1, one document, no padding
    assert c.get("pos").tolist() == [list(range(L))] * B
    assert bool(c.get("valid").all()) and not bool(c.get("doc").any())


def test_decode_fast_path_declines_what_it_does_not_cover():
    """Biases, accumulated angles, PaTH and length-dependent tables keep the general path; so does a
    decoding call that records gradients."""
    import pedsl.compiler.stream as stream

    for name in ("alibi", "acc_random_qk", "path", "dynamic_ntk", "rope_id_alibi"):
        assert stream._fast_decode_plan(_mod(SCHEMES / f"{name}.pe")) is None, name
    m = _mod(SCHEMES / "rope.pe")
    q, k, v, _, _ = _data(m, 1, 6, 4, seed=2, grad=True)
    c = m.new_cache(1)
    m(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache=c)
    assert stream.decode_step(m, q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], c) is None  # gradients: general path
    o = m(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], cache=c)
    assert o.requires_grad
    torch.testing.assert_close(o, m(q, k, v)[:, :, 5:], rtol=1e-9, atol=1e-10)


def test_decode_fast_path_half_precision_is_the_general_path_bit_for_bit():
    """bfloat16: the fast path rotates in float32 with float32 tables and rounds once, as the general
    path does, so outputs and cached keys are identical (a bf16 table or bf16 arithmetic differs)."""
    for name in ("rope", "rope_id"):
        fast = compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=16, d_model=D_MODEL).to(torch.bfloat16)
        slow = compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=16, d_model=D_MODEL).to(torch.bfloat16)
        slow._fast_decode = False  # the general path
        g = torch.Generator().manual_seed(4)
        q, k, v = (torch.randn(2, 4, 10, 16, generator=g).to(torch.bfloat16) for _ in range(3))
        outs = {}
        for tag, m in (("fast", fast), ("slow", slow)):
            c = m.new_cache(2)
            with torch.no_grad():
                o = [m(q[:, :, :3], k[:, :, :3], v[:, :, :3], cache=c)]
                o += [m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], cache=c) for s in range(3, 10)]
            outs[tag] = (torch.cat(o, 2), c.get("k"))
        assert torch.equal(outs["fast"][0], outs["slow"][0]) and torch.equal(outs["fast"][1], outs["slow"][1])


def test_decode_fast_path_rows_at_different_positions(monkeypatch):
    """Rows that share a position take the cached-position branch of the fast path (one table row,
    no tensor op for the position); rows at different positions (a prefill given per-row positions)
    gather one row each. Both equal the general path: outputs, cached keys and cached positions, also
    after a chunked (general) call and a reset of ``last_pos`` in between."""
    import pedsl.compiler.stream as stream

    seen = []
    real = stream._next_positions
    monkeypatch.setattr(stream, "_next_positions", lambda c: (lambda r: seen.append(r[1]) or r)(real(c)))
    for offsets, shared in (([0, 0], True), ([0, 5], False)):
        fast, slow = _mod(SCHEMES / "rope.pe"), _mod(SCHEMES / "rope.pe")
        slow._fast_decode = False  # the general path
        q, k, v, _, _ = _data(fast, 2, 12, 2, seed=5)
        pos = torch.arange(4)[None] + torch.tensor(offsets)[:, None]
        outs = {}
        for tag, m in (("fast", fast), ("slow", slow)):
            seen.clear()
            c = m.new_cache(2)
            with torch.no_grad():
                o = [m(q[:, :, :4], k[:, :, :4], v[:, :, :4], positions=pos, cache=c)]
                o += [m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], cache=c) for s in (4, 5, 6)]
                o.append(m(q[:, :, 7:9], k[:, :, 7:9], v[:, :, 7:9], cache=c))  # general: new last_pos
                c.last_pos = c.last_pos.clone()  # as a caller restoring a saved state would
                o += [m(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1], cache=c) for s in (9, 10, 11)]
            outs[tag] = (torch.cat(o, 2), c.get("k"), c.get("pos"))
            if tag == "fast":
                assert len(seen) == 6 and all((p is not None) == shared for p in seen)
        for a, b in zip(outs["fast"], outs["slow"]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert outs["fast"][2][1, -1].item() == 11 + offsets[1]
