"""Accumulated quantities under explicit positions with gaps (docs/semantics.md §2b, §8.1): a cumulative
angle, a forget-gate sum or a Householder product counts the *tokens* on the route from key to query, and
a step that reads ``position`` reads its own token's position. So with positions 0, 1, 2, 5, 6, 9 the route
from the first to the last token holds five steps, not nine.

Oracles: the reference interpreter (explicit products and sums over tokens j+1..i, float64), forward and
backward, for packed documents, left padding and a decoding cache; and, independently of it, RoPE run at
the tokens' indices (constant steps w accumulate to w times the number of tokens between key and query)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import SCHEMES, fast_and_reference, output_and_grads, rnd
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate

H, D = 2, 8
CASES = [  # (library scheme, statements added): constant steps (RoPE's fold), per-token steps, gates, PaTH
    ("rope_accumulated", ""),
    ("rope_accumulated", "qkv: accumulate(rotation(w))"),
    ("acc_random_qkv", ""),
    ("acc_random_position", ""),
    ("acc_learned_qkv", ""),
    ("nope", "bias = accumulate(-slopes(heads))"),  # a constant gate: ALiBi's fold
    ("fox", ""),
    ("path_fox", ""),
]
B, L = 3, 8
# row 0: one document with gaps; row 1: two packed documents, each with gaps; row 2: left padding by two
# tokens, then gaps
POSITIONS = torch.tensor([[0, 1, 2, 5, 6, 9, 10, 14], [0, 2, 3, 7, 0, 1, 4, 5], [0, 0, 0, 3, 4, 8, 9, 11]])
DOCS = torch.tensor([[0] * 8, [0] * 4 + [1] * 4, [0] * 8])
VALID = torch.ones(B, L, dtype=torch.bool)
VALID[2, :2] = False


def _id(case):
    base, extra = case
    return base + ("+" + extra.split(":")[0].split("=")[0].strip() if extra else "")


def _data(mod, seed=0):
    q = rnd(B, H, L, D, seed=seed).requires_grad_()
    k, v = (rnd(B, H, L, D, seed=seed + s).requires_grad_() for s in (1, 2))
    x = rnd(B, L, 24, seed=seed + 3) if mod.needs_x else None
    tok = torch.randint(0, 256, (B, L), generator=torch.Generator().manual_seed(seed)) if mod.needs_tokens else None
    return q, k, v, dict(x=x, tokens=tok)


def _sl(kw, a, b):
    return {n: (None if t is None else t[:, a:b]) for n, t in kw.items()}


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gapped_positions_match_the_reference(case):
    """Gaps, packed documents and left padding at once: output and gradients (q, k, v and every learned
    parameter) of the general path equal the interpreter's."""
    fast, ref = fast_and_reference(*case, H, D)
    q, k, v, inp = _data(fast)
    kw = dict(inp, positions=POSITIONS, document_ids=DOCS, attn_mask=VALID)
    got, g_got = output_and_grads(fast, q, k, v, **kw)
    want, g_want = output_and_grads(ref, q, k, v, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    assert len(g_got) == len(g_want)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prefill_with_gaps_then_decoding_equals_one_forward(case):
    """A gapped prefill, then one-token steps - at gapped positions given, or at the positions that follow
    (none given) - equals one forward of the whole sequence, for the general path and the interpreter."""
    fast, ref = fast_and_reference(*case, H, D)
    q, k, v, inp = _data(fast, seed=5)
    q, k, v = (t.detach() for t in (q, k, v))
    pos = torch.tensor([[0, 1, 2, 5, 6, 9, 10, 14], [3, 4, 8, 9, 10, 12, 13, 20]])
    q, k, v, inp = q[:2], k[:2], v[:2], {n: None if t is None else t[:2] for n, t in inp.items()}
    nxt = pos[:, 5:]  # the gapped positions themselves
    follow = pos[:, 4:5] + torch.arange(1, L - 4)  # last prefill position + 1, + 2, ...
    want = ref(q, k, v, **inp, positions=pos)
    want_follow = ref(q, k, v, **inp, positions=torch.cat([pos[:, :5], follow], 1))
    for mod in (fast, ref):
        for steps, expected in ((nxt, want), (None, want_follow)):
            cache = mod.new_cache(2)
            outs = [mod(q[:, :, :5], k[:, :, :5], v[:, :, :5], **_sl(inp, 0, 5), positions=pos[:, :5], cache=cache)]
            for t in range(5, L):
                one = {} if steps is None else dict(positions=steps[:, t - 5:t - 4])
                outs.append(mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], **_sl(inp, t, t + 1),
                                cache=cache, **one))
            torch.testing.assert_close(torch.cat(outs, 2), expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("qkv", [False, True], ids=["qk", "qkv"])
def test_constant_steps_count_tokens_not_positions(qkv):
    """Independent of the interpreter: accumulated constant steps w at any positions equal RoPE (rotate(w *
    position)) at the tokens' indices inside each document, unpadded; and RoPE at the gapped positions
    differs (the fold into RoPE holds at consecutive positions only)."""
    targets = "qkv" if qkv else "qk"
    acc_src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ {targets}: accumulate(rotation(w)) }}'
    rope_src = f'import "{SCHEMES / "rope.pe"}"\nscheme s extends rope {{ {targets}: rotate(w * position) }}'
    acc = compile_scheme(acc_src, num_heads=H, head_dim=D).double()
    rope = compile_scheme(rope_src, num_heads=H, head_dim=D).double()
    q, k, v, _ = _data(acc, seed=7)
    index = torch.tensor([list(range(8)), [0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 0, 1, 2, 3, 4, 5]])
    common = dict(document_ids=DOCS, attn_mask=VALID)
    got = acc(q, k, v, positions=POSITIONS, **common)
    torch.testing.assert_close(got, rope(q, k, v, positions=index, **common), rtol=1e-9, atol=1e-10)
    assert (got - rope(q, k, v, positions=POSITIONS, **common)).abs().max() > 1e-2


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[5]], ids=_id)
def test_generated_module_counts_tokens(case, tmp_path):
    """The module `pedsl compile` writes (the general forward, torch only) equals the interpreter on the
    gapped, packed and padded call, and after a gapped prefill decoding one token."""
    import importlib.util

    fast, ref = fast_and_reference(*case, H, D)
    path = tmp_path / "gen_gap.py"
    path.write_text(generate(fast.scheme, fast.plan, d_model=24))
    spec = importlib.util.spec_from_file_location("gen_gap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = module.Module().double()
    gen.load_state_dict(fast.state_dict())
    q, k, v, inp = _data(fast, seed=9)
    kw = dict(inp, positions=POSITIONS, document_ids=DOCS, attn_mask=VALID)
    torch.testing.assert_close(gen(q, k, v, **kw), ref(q, k, v, **kw), rtol=1e-9, atol=1e-10)
    cache = gen.new_cache(1)
    head = gen(q[:1, :, :6], k[:1, :, :6], v[:1, :, :6], positions=POSITIONS[:1, :6], cache=cache)
    tail = gen(q[:1, :, 6:], k[:1, :, 6:], v[:1, :, 6:], positions=POSITIONS[:1, 6:], cache=cache)
    want = ref(q[:1], k[:1], v[:1], positions=POSITIONS[:1])
    torch.testing.assert_close(torch.cat([head, tail], 2), want, rtol=1e-9, atol=1e-10)
