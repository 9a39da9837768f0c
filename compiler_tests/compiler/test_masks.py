"""The mask statement (docs/semantics.md §11a) against naive float64 references, forward and backward.

The references here are written from the definition, entry by entry, independently of the reference
interpreter and of pedsl.compiler.general.masks: which pairs (i, j) are visible (j <= i in one document, both
ways where the mask says, never to padding), a softmax over them of q_i . k_j / sqrt(D) plus ALiBi's bias
-m_h |p_i - p_j| (the encoder form). The library's RoPE forms are compared with the reference interpreter
(test_kernel_paths.py runs every call mode) and, below, with non-causal SDPA of the rotated queries and keys.
Then the refusals: decoding a bidirectional scheme, a call splitting a cached span, span_ids where the mask
reads none, and the statements whose meaning holds only for keys at or before the query (E244).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import SCHEMES, fast_and_reference, output_and_grads, rnd
from pedsl.compiler import compile_scheme
from pedsl.errors import PedslError, ShapeError

B, H, L, D = 2, 4, 9, 8
SPAN_IDS = torch.tensor([[0, 1, 1, 1, 0, 2, 2, 0, 0], [3, 3, 0, 0, 5, 5, 5, 5, 0]])


def _visible(kind: str, prefix: int, pos, docs, valid, spans, window) -> torch.Tensor:
    """(B, L, L) bool from the definition: j <= i, or both ways where the mask says; one document; key valid;
    padding in no span; a window |p_i - p_j| < window (non-causal) or p_i - p_j < window (causal)."""
    out = torch.zeros(B, L, L, dtype=torch.bool)
    for b in range(B):
        for i in range(L):
            for j in range(L):
                if kind == "bidirectional":
                    both = True
                elif kind == "prefix":
                    both = bool(pos[b, i] < prefix and pos[b, j] < prefix and valid[b, i] and valid[b, j])
                elif kind == "spans":
                    both = bool(spans[b, i] != 0 and spans[b, i] == spans[b, j] and valid[b, i] and valid[b, j])
                else:
                    both = False
                ok = (j <= i or both) and docs[b, i] == docs[b, j] and bool(valid[b, j])
                if window is not None:
                    d = int(pos[b, i] - pos[b, j])
                    ok = ok and (abs(d) if kind != "causal" else d) < window
                out[b, i, j] = ok
    return out


def _positions(docs, valid):
    """Each token's index inside its document among the unpadded tokens (the module's default positions)."""
    pos = torch.zeros(B, L, dtype=torch.long)
    for b in range(B):
        count, doc = 0, None
        for t in range(L):
            if valid[b, t]:
                count = 0 if docs[b, t] != doc else count
                doc = docs[b, t]
                pos[b, t] = count
                count += 1
    return pos


def _naive(q, k, v, seen, pos, alibi: bool):
    """Softmax over the visible keys of q.k / sqrt(D) (plus -m_h |p_i - p_j|), key/value head h // (H / Hkv);
    a query with no visible key gives zeros. Loops, float64."""
    r = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    rows = []
    for b in range(B):
        for h in range(H):
            slope = 2 ** (-8 * (h + 1) / H)
            for i in range(L):
                keys = [j for j in range(L) if seen[b, i, j]]
                if not keys:
                    rows.append(((b, h, i), None))
                    continue
                s = torch.stack([(q[b, h, i] * k[b, h // r, j]).sum() / math.sqrt(D)
                                 - (slope * abs(int(pos[b, i] - pos[b, j])) if alibi else 0.0) for j in keys])
                w = torch.softmax(s, 0)
                rows.append(((b, h, i), sum(w[n] * v[b, h // r, j] for n, j in enumerate(keys))))
    return torch.stack([torch.zeros(D, dtype=torch.float64) if o is None else o for _, o in rows]).view(out.shape)


def _module(mask: str, extra: str = ""):
    base = "alibi" if "alibi" in extra else "nope"
    src = f'import "{SCHEMES / (base + ".pe")}"\nscheme s extends {base} {{\n  mask = {mask}\n{extra.replace("alibi", "")}\n}}'
    return compile_scheme(src, num_heads=H, head_dim=D).double()


CASES = [  # (mask, extra statements, call: documents / padding / gqa, window)
    ("bidirectional", "", "", None), ("bidirectional", "alibi", "padding", None),
    ("bidirectional", "window = 3", "documents", 3), ("bidirectional", "alibi", "gqa", None),
    ("prefix(4)", "", "", None), ("prefix(4)", "alibi", "documents", None), ("prefix(3)", "", "padding", None),
    ("prefix(4)", "window = 2", "gqa", 2), ("spans", "", "", None), ("spans", "alibi", "padding", None),
    ("spans", "chunk = 4", "documents", None), ("spans", "window = 3", "gqa", 3),
]


@pytest.mark.parametrize("mask, extra, call, window", CASES,
                         ids=[f"{m}-{e or 'nope'}-{c or 'fresh'}" for m, e, c, _ in CASES])
def test_mask_matches_the_definition_forward_and_backward(mask, extra, call, window):
    mod = _module(mask, extra)
    kind = mask.split("(")[0]
    prefix = int(mask[7:-1]) if kind == "prefix" else 0
    docs = torch.tensor([[0] * 5 + [1] * 4, [0] * 3 + [1] * 6]) if call == "documents" else torch.zeros(B, L, dtype=torch.long)
    valid = torch.ones(B, L, dtype=torch.bool)
    if call == "padding":
        valid[1, :2] = False
    kv_heads = 2 if call == "gqa" else H
    q = rnd(B, H, L, D, seed=1).requires_grad_()
    k, v = (rnd(B, kv_heads, L, D, seed=s).requires_grad_() for s in (2, 3))
    kw = {}
    if call == "documents":
        kw["document_ids"] = docs
    if call == "padding":
        kw["attn_mask"] = valid
    if kind == "spans":
        kw["span_ids"] = SPAN_IDS
    pos = _positions(docs, valid)
    seen = _visible(kind, prefix, pos, docs, valid, SPAN_IDS, window)
    if "chunk" in extra:  # the chunk of 4 positions
        seen &= (pos[:, :, None] // 4) == (pos[:, None, :] // 4)
    out, grads = output_and_grads(mod, q, k, v, **kw)
    want = _naive(q, k, v, seen, pos, "alibi" in extra)
    weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want_grads = torch.autograd.grad((want * weight).sum(), [q, k, v])
    torch.testing.assert_close(out, want.detach(), rtol=1e-9, atol=1e-10)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    if kind != "causal":  # the mask changes the answer: not the causal one
        causal = _naive(q, k, v, _visible("causal", 0, pos, docs, valid, SPAN_IDS, window), pos, "alibi" in extra)
        assert (out - causal.detach()).abs().max() > 1e-3


@pytest.mark.parametrize("base", ["rope", "rope_2d", "rope_mixed"])
def test_bidirectional_rope_is_non_causal_sdpa_of_the_rotated_queries(base):
    """One fresh sequence runs the fused non-causal path; it equals SDPA (is_causal=False) of q and k rotated
    by the causal scheme's own module (the rotation is the same; only the mask differs)."""
    fast, ref = fast_and_reference(base, "mask = bidirectional", H, D)
    assert "bidirectional" in fast.plan.kernels
    causal = compile_scheme(SCHEMES / f"{base}.pe", num_heads=H, head_dim=D).double()
    causal.load_state_dict(fast.state_dict())
    q, k, v = (rnd(B, H, L, D, seed=s) for s in (4, 5, 6))
    qt, kt, _, _ = causal.transform_qkv(q, k, v)
    torch.testing.assert_close(fast(q, k, v), F.scaled_dot_product_attention(qt, kt, v), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(fast(q, k, v), ref(q, k, v), rtol=1e-9, atol=1e-10)


def test_decoding_after_a_prefilled_prefix_equals_one_forward():
    for mask, kw in (("prefix(5)", {}), ("spans", {"span_ids": torch.tensor([[1] * 4 + [0] * 5, [0, 2, 2, 2, 0, 0, 0, 0, 0]])})):
        fast, ref = fast_and_reference("rope", f"mask = {mask}", H, D)
        q, k, v = (rnd(B, H, L, D, seed=s) for s in (4, 5, 6))
        full = ref(q, k, v, **kw)
        for mod in (fast, ref):
            cache = mod.new_cache(B)
            outs = [mod(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache=cache, **{n: t[:, :6] for n, t in kw.items()})]
            for t in range(6, L):
                outs.append(mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache,
                                **{n: s[:, t:t + 1] for n, s in kw.items()}))
            torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-9, atol=1e-10)


def test_a_bidirectional_scheme_has_no_cache():
    fast, ref = fast_and_reference("rope", "mask = bidirectional", H, D)
    for mod in (fast, ref):
        with pytest.raises(ShapeError, match="nothing to decode"):
            mod.new_cache(B)


def test_the_cache_itself_refuses_a_bidirectional_module():
    """The one refusal is the cache's (general.masks.cache_refusal), which reads the module's mask: a
    SchemeAttention has one (a module without it would read as causal and decode)."""
    from pedsl.compiler.general import AttentionCache, InputError

    for mod in fast_and_reference("rope", "mask = bidirectional", H, D):
        assert mod.mask == "bidirectional" and mod.mask_prefix is None
        with pytest.raises(InputError, match="nothing to decode"):
            AttentionCache(mod, B, mod.scheme.name)
    for mod in fast_and_reference("rope", "mask = prefix(4)", H, D):
        assert (mod.mask, mod.mask_prefix) == ("prefix", 4)
        assert len(AttentionCache(mod, B, mod.scheme.name)) == 0


@pytest.mark.parametrize("mask", ["prefix(4)", "spans"])
def test_a_call_that_splits_a_cached_span_is_refused(mask):
    kw = {"span_ids": torch.tensor([[1] * 4 + [0] * 5] * B)} if mask == "spans" else {}
    for mod in fast_and_reference("rope", f"mask = {mask}", H, D):
        q, k, v = (rnd(B, H, L, D, seed=s) for s in (4, 5, 6))
        cache = mod.new_cache(B)
        mod(q[:, :, :2], k[:, :, :2], v[:, :, :2], cache=cache, **{n: t[:, :2] for n, t in kw.items()})
        with pytest.raises(ShapeError, match="continue a span"):
            mod(q[:, :, 2:4], k[:, :, 2:4], v[:, :, 2:4], cache=cache, **{n: t[:, 2:4] for n, t in kw.items()})


def test_span_ids_where_the_mask_reads_none_are_refused():
    fast, _ = fast_and_reference("rope", "mask = prefix(3)", H, D)
    q, k, v = (rnd(B, H, L, D, seed=s) for s in (4, 5, 6))
    with pytest.raises(ShapeError, match="only mask = spans reads them"):
        fast(q, k, v, span_ids=SPAN_IDS)
    spans, _ = fast_and_reference("rope", "mask = spans", H, D)
    with pytest.raises(ShapeError, match="span_ids"):
        spans(q, k, v, span_ids=SPAN_IDS.float())


@pytest.mark.parametrize("base", ["path", "fox", "xpos", "acc_random_qk", "stick_breaking", "cope", "acc_random_alibi"])
def test_statements_defined_only_for_earlier_keys_refuse_a_non_causal_mask(base):
    with pytest.raises(PedslError) as exc:
        fast_and_reference(base, "mask = prefix(8)", H, D)
    assert exc.value.code == "E244" and "only for keys at or before the query" in str(exc.value)


@pytest.mark.parametrize("value, said", [("prefx(3)", "did you mean 'prefix'"), ("prefix(0)", "between 1 and"),
                                         ("prefix(2.5)", "integer"), ("prefix(1, 2)", "one argument"),
                                         ("3", "unknown mask")])
def test_a_malformed_mask_is_refused(value, said):
    with pytest.raises(PedslError) as exc:
        fast_and_reference("rope", f"mask = {value}", H, D)
    assert exc.value.code == "E244" and said in str(exc.value)


def test_mask_none_drops_an_inherited_mask():
    src = (f'import "{SCHEMES / "rope.pe"}"\nscheme e extends rope {{\n  mask = bidirectional\n}}\n'
           "scheme c extends e {\n  mask = none\n}")
    assert compile_scheme(src, scheme="c", num_heads=H, head_dim=D).plan.mask == "causal"
    assert compile_scheme(src, scheme="e", num_heads=H, head_dim=D).plan.mask == "bidirectional"


def test_the_generated_module_runs_the_mask(tmp_path):
    import importlib.util

    from pedsl.compiler.codegen import generate

    for mask, kw in (("bidirectional", {}), ("spans", {"span_ids": SPAN_IDS})):
        mod, _ = fast_and_reference("alibi", f"mask = {mask}\nwindow = 5", H, D)
        path = tmp_path / f"gen_{mask}.py"
        path.write_text(generate(mod.scheme, mod.plan))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        m = gen.Module().double()
        m.load_state_dict(mod.state_dict())
        q, k, v = (rnd(B, H, L, D, seed=s) for s in (4, 5, 6))
        torch.testing.assert_close(m(q, k, v, **kw), mod(q, k, v, **kw), rtol=1e-9, atol=1e-10)
        if mask == "bidirectional":
            with pytest.raises(ValueError, match="nothing to decode"):
                m.new_cache(B)
