"""dense_rotation (docs/semantics.md §2e): LieRE, ComRoPE and STRING against a float64 transcription of their
formulas (one dense matrix exponential per token, explicit dot products), forward and backward with the
generators' gradients; the general path against the reference interpreter in every call mode; the relative
forms invariant to a shift of every position, LieRE not; the checker's diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import (assert_generated_module_matches, assert_packed_padded_call_matches, first_error,
                              float64_bound, module_from_text, output_and_grads, rnd)
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.errors import CompileError

FORMS = {  # name -> dense_rotation arguments (two axes h, w)
    "liere": "block = 4",
    "comrope_ld": "block = 4, shared = true",
    "comrope_ap": "block = 4, split = true",
    "string": "block = 2, basis = true",
    "dense_per_head": "block = 0, basis = true, per = head",
}


def scheme(args: str, axes: str = "h, w", extra: str = "") -> str:
    return f"scheme s {{\n  axes {axes}\n{extra}  qk: dense_rotation({args})\n}}\n"


def module(tmp_path, args: str, backend: str = "auto", heads: int = 4, hd: int = 8, **kw):
    """A float64 module whose generators (and scales, basis) are drawn large enough to turn far from the identity."""
    m = module_from_text(scheme(args, **kw), tmp_path, backend=backend, heads=heads, hd=hd)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.dense.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.4 + (1.0 if p.dim() == 1 else 0.0))
    return m


def grid(B: int, L: int, width: int = 3) -> torch.Tensor:
    """(2, B, L) row and column positions of a raster, each row shifted by its batch index."""
    i = torch.arange(L)
    return torch.stack([torch.stack([i // width + b for b in range(B)]), torch.stack([i % width] * B)])


def naive_rotation(params, t_block: int, mode: str, axes: int, pos: list[float], head: int) -> torch.Tensor:
    """R(p) = P^T expm(sum_a p_a A_a) P of one token and head, written out from the paper's definitions."""
    raw = params.generator[min(head, params.generator.shape[0] - 1)]  # (K, blocks, b, b)
    nb, b = raw.shape[1], raw.shape[2]
    n = nb * b
    total = torch.zeros(n, n, dtype=torch.float64)
    for a in range(axes):
        A = torch.zeros(n, n, dtype=torch.float64)
        for blk in range(nb):
            if mode == "split" and blk * axes // nb != a:
                continue
            m = raw[a if mode == "independent" else 0, blk]
            m = m - m.T
            A[blk * b:(blk + 1) * b, blk * b:(blk + 1) * b] = m * (params.scales[a] if mode == "shared" else 1.0)
        total = total + pos[a] * A
    E = torch.linalg.matrix_exp(total)
    if params.basis is None:
        return E
    S = params.basis[min(head, params.basis.shape[0] - 1)]
    S = S - S.T
    eye = torch.eye(n, dtype=torch.float64)
    P = (eye - S) @ torch.linalg.inv(eye + S)
    return P.T @ E @ P


def naive_attention(m, q, k, v, positions, mode: str, causal: bool = True) -> torch.Tensor:
    """Softmax attention over explicit dot products of R(p_i) q_i and R(p_j) k_j, token by token."""
    t = m.plan.transports[0]
    params = m.dense["0"]
    B, H, L, D = q.shape
    out = torch.zeros(B, H, L, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            R = [naive_rotation(params, t.dense.block, mode, 2, [positions[a, b, i] for a in range(2)], h)
                 for i in range(L)]
            qs = [R[i] @ q[b, h, i] for i in range(L)]
            ks = [R[j] @ k[b, h, j] for j in range(L)]
            for i in range(L):
                keys = range(i + 1) if causal else range(L)
                s = torch.stack([qs[i] @ ks[j] / math.sqrt(D) for j in keys])
                w = torch.softmax(s, 0)
                out[b, h, i] = sum(w[n] * v[b, h, j] for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("name", list(FORMS))
def test_forward_and_generator_gradients_equal_the_formula(name, tmp_path):
    m = module(tmp_path, FORMS[name])
    mode = m.plan.transports[0].dense.mode
    B, L = 2, 6
    q, k, v = (rnd(B, 4, L, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    pos = grid(B, L)
    got, got_grads = output_and_grads(m, q, k, v, positions=pos)
    want, want_grads = output_and_grads(_naive_module(m, mode), q, k, v, positions=pos)
    torch.testing.assert_close(got, want, rtol=0, atol=float64_bound(64 * L, want))
    names = ["q", "k", "v"] + [n for n, _ in m.named_parameters()]
    assert any("dense" in n for n in names)
    for n, a, b in zip(names, got_grads, want_grads):
        assert "dense" not in n or b.abs().max() > 0, f"no gradient reaches {n}"
        torch.testing.assert_close(a, b, rtol=0, atol=float64_bound(64 * L * 8, b) + 1e-12, msg=n)


class _naive_module(torch.nn.Module):
    """naive_attention over ``m``'s own parameters, so that autograd gives the formula's gradients."""

    def __init__(self, m, mode):
        super().__init__()
        self.m, self.mode = m, mode

    def forward(self, q, k, v, positions):
        return naive_attention(self.m, q, k, v, positions, self.mode)


def test_string_keeps_the_basis_orthogonal_and_starts_at_rope_with_learned_frequencies(tmp_path):
    m = module(tmp_path, FORMS["string"])
    P = m.dense["0"].basis_matrix()
    torch.testing.assert_close(P[0] @ P[0].T, torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-12)
    fresh = compile_scheme(scheme(FORMS["string"]), num_heads=4, head_dim=8)
    assert fresh.dense["0"].basis.abs().max() == 0  # P = I at the start: a 2-D RoPE with learned frequencies


@pytest.mark.parametrize("name", list(FORMS))
def test_general_path_equals_the_reference_in_every_call_mode(name, tmp_path):
    m, ref = module(tmp_path, FORMS[name], axes="t"), None
    ref = module_from_text(scheme(FORMS[name], axes="t"), tmp_path, backend="reference", heads=4, hd=8)
    ref.load_state_dict(m.state_dict())
    assert_packed_padded_call_matches(m, ref)  # positions, packed documents, left padding, GQA
    B, L = 2, 9
    q, k, v = (rnd(B, 4, L, 8, seed=s) for s in (5, 6, 7))
    kv = (k[:, :2], v[:, :2])  # grouped key/value heads
    full = ref(q, *kv)
    cache = m.new_cache(B)
    parts = [m(q[:, :, :5], k[:, :2, :5], v[:, :2, :5], cache=cache)]
    parts += [m(q[:, :, t:t + 1], k[:, :2, t:t + 1], v[:, :2, t:t + 1], cache=cache) for t in range(5, L)]
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=0, atol=float64_bound(64 * L, full))


@pytest.mark.parametrize("name", ["liere", "comrope_ld", "string"])
def test_cached_decode_with_two_axes_equals_one_full_forward(name, tmp_path):
    m = module(tmp_path, FORMS[name])
    B, L = 2, 8
    q, k, v = (rnd(B, 4, L, 8, seed=s) for s in (1, 2, 3))
    pos = grid(B, L)
    full = m(q, k, v, positions=pos)
    cache = m.new_cache(B)
    parts = [m(q[:, :, :3], k[:, :, :3], v[:, :, :3], positions=pos[..., :3], cache=cache)]
    parts += [m(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], positions=pos[..., t:t + 1], cache=cache)
              for t in range(3, L)]
    torch.testing.assert_close(torch.cat(parts, 2), full, rtol=0, atol=float64_bound(64 * L, full))


@pytest.mark.parametrize("name,relative", [("liere", False), ("comrope_ld", True), ("comrope_ap", True),
                                           ("string", True), ("dense_per_head", False)])
def test_commuting_generators_are_relative_and_liere_is_not(name, relative, tmp_path):
    m = module(tmp_path, FORMS[name])
    assert m.scheme.transports[0].commuting == relative
    B, L = 1, 6
    q, k, v = (rnd(B, 4, L, 8, seed=s) for s in (1, 2, 3))
    pos = grid(B, L)
    shifted = pos + torch.tensor([3, -2]).view(2, 1, 1)
    a, b = m(q, k, v, positions=pos), m(q, k, v, positions=shifted)
    gap = float((a - b).detach().abs().max())
    if relative:
        assert gap <= float64_bound(64 * L * 8, a)
    else:  # generators that do not commute: the scores change with the absolute position (by far more than rounding)
        assert gap > 1e-3


def test_one_axis_is_relative_for_any_generator(tmp_path):
    m = module(tmp_path, "block = 8", axes="t")
    q, k, v = (rnd(1, 4, 6, 8, seed=s) for s in (1, 2, 3))
    pos = torch.arange(6)[None]
    a, b = m(q, k, v, positions=pos), m(q, k, v, positions=pos + 11)
    torch.testing.assert_close(a, b, rtol=0, atol=float64_bound(64 * 6 * 8, a))


def test_bidirectional_encoder_equals_the_formula(tmp_path):
    m = module(tmp_path, FORMS["liere"], extra="  mask = bidirectional\n")
    B, L = 1, 6
    q, k, v = (rnd(B, 4, L, 8, seed=s) for s in (1, 2, 3))
    pos = grid(B, L)
    want = naive_attention(m, q, k, v, pos, "independent", causal=False)
    torch.testing.assert_close(m(q, k, v, positions=pos), want, rtol=0, atol=float64_bound(64 * L, want))


@pytest.mark.parametrize("name", ["liere", "string"])
def test_generated_module_equals_the_module(name, tmp_path):
    m = module(tmp_path, FORMS[name])
    with torch.no_grad():  # the helper loads the weights into a float32 module first: start from float32 values
        for p in m.parameters():
            p.copy_(p.float().double())
    assert_generated_module_matches(m, generate(m.scheme, m.plan), tmp_path / f"gen_{name}.py", lengths=(3, 12))


def test_flex_backend_refuses_a_dense_rotation(tmp_path):
    with pytest.raises(CompileError) as err:
        compile_scheme(scheme(FORMS["comrope_ld"]), backend="flex", requires_grad=False)
    assert err.value.code == "E406" and "dense-rotation" in str(err.value)


@pytest.mark.parametrize("args,code,words", [
    ("block = 3", "E234", "does not divide group 'all' (32 channels)"),
    ("block = 1", "E234", "from 2 to 256"),
    ("block = 4, shared = true, split = true", "E234", "choose one"),
    ("block = 16, split = true, per = head", "E234", "equal runs"),
    ("block = 4, init = 0", "E234", "positive"),
    ("block = 4, per = pair", "E204", "'per' must be head"),
    ("block = x", "E204", "'block' must be a number"),
    ("block = 2.5", "E204", "'block' must be an integer"),
])
def test_bad_arguments_are_diagnosed(args, code, words):
    text = scheme(args, axes="h, w, t") if "equal runs" in words else scheme(args)
    d = first_error(text)
    assert d.code == code and words in d.message, d.render()
    assert d.hint or code == "E204" and "'block'" in words  # the type rule's own messages of a number argument


def test_value_rotation_is_refused():
    d = first_error("scheme s {\n  qkv: dense_rotation(block = 4)\n}\n")
    assert d.code == "E235" and d.hint
