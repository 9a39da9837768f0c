"""Learned functions of distance - bucket, table, mlp - and the library schemes built on them, against
the implementations people use (Hugging Face's T5 buckets, x-transformers' RelativePositionBias,
DynamicPositionBias and AlibiPositionalBias, loaded into the pedsl module) and, where no peer exists
(KERPLE, Sandwich), against a naive float64 loop of the paper's formula.

How a peer's parameters load into the pedsl module (the same mapping the README documents):

- ``RelativePositionBias`` (x-transformers): ``learned.sites["bias[0]__table0"].weight`` =
  ``relative_attention_bias.weight * scale`` (x-transformers adds the scaled table to q.k / sqrt(D), as
  pedsl adds its bias); ``causal=True`` is ``bucket(...)``, ``causal=False`` is ``bidirectional = true``.
- ``DynamicPositionBias(dim, heads, depth, log_distance=True)``: its ``mlp.{k}.0`` (k < depth) is pedsl's
  layer ``2 k`` of ``learned.sites["bias[0]__mlp0"]`` and its last ``mlp.{depth}`` is layer ``2 depth``.
- ``AlibiPositionalBias(heads=k, total_heads=H)`` is ``alibi_partial`` with ``alibi_heads = k``; a learned
  slope ``s_h`` is ``learned.sites["bias[0]__learned0"].value[h] = log(s_h)`` in ``alibi_learned``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compiler_helpers import (SCHEMES, assert_generated_module_matches, first_error, forward_and_grads, inputs,
                              float32_bound, largest_allocation, rnd)
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.compiler.module_values import FusedKernels, ModuleScheme
from pedsl.compiler.plan import QUERY_BLOCKS
from pedsl.lang.builtin_defs.learned import bucket_of
from pedsl.ops import distance_bias as DB

F64 = torch.float64


def _attend(q, k, v, bias):
    """softmax(q k^T / sqrt(D) + bias, causal) v in float64: bias (H, L, L) or (1, H, L, L)."""
    L, D = q.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + bias.reshape(1, -1, L, L)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def _qkv(H, L, D=16, seed=0):
    return (rnd(2, H, L, D, seed=seed + i) for i in range(3))


def _scheme(name, H=4, D=16, backend="auto", **params):
    return compile_scheme(SCHEMES / f"{name}.pe", num_heads=H, head_dim=D, params=params or None,
                          backend=backend).double()


def _moved(mod, scale=0.3, seed=5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return mod


# ---------------------------------------------------------------------- bucket
@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (64, 256), (8, 20), (16, 1000)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_buckets_equal_hugging_face_t5(buckets, max_distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    d = torch.arange(0, 20000)
    hf = T5Attention._relative_position_bucket(-d, bidirectional=bidirectional, num_buckets=buckets,
                                               max_distance=max_distance)
    mod = compile_scheme(f'scheme s "" {{ bias = table(bucket(distance, buckets = {buckets}, max_distance = '
                         f'{max_distance}, bidirectional = {str(bidirectional).lower()})) }}', num_heads=1, head_dim=8)
    # the module's table is the identity on buckets: its weight row b = b
    with torch.no_grad():
        mod.learned.sites["bias[0]__table0"].weight.copy_(torch.arange(buckets, dtype=torch.float32)[:, None])
    ours = mod.evaluator.run(mod.biases[0].site.expr, mod._ctx(20000), "bias[0]").t.reshape(-1)
    assert torch.equal(ours.long(), hf)
    assert [bucket_of(float(x), buckets, max_distance, bidirectional) for x in range(0, 3000)] == hf[:3000].tolist()


# ---------------------------------------------------------------------- peers: x-transformers
@pytest.mark.parametrize("causal", [True, False])
def test_t5_bias_equals_x_transformers_relative_position_bias(causal):
    from x_transformers.x_transformers import RelativePositionBias

    H, L, D = 4, 300, 16  # 300 > max_distance: the last bucket is reached
    peer = RelativePositionBias(scale=D ** 0.5, causal=causal, num_buckets=32, max_distance=128, heads=H).double()
    text = ('scheme s "" { bias = table(bucket(distance, buckets = 32, max_distance = '
            f'128, bidirectional = {str(not causal).lower()}), to = head) }}')
    mod = compile_scheme(text, num_heads=H, head_dim=D).double()
    with torch.no_grad():
        mod.learned.sites["bias[0]__table0"].weight.copy_(peer.relative_attention_bias.weight * peer.scale)
    q, k, v = _qkv(H, L)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, peer(L, L)), rtol=1e-10, atol=1e-12)


def test_the_library_t5_bias_is_unidirectional_t5():
    from x_transformers.x_transformers import RelativePositionBias

    mod = _moved(_scheme("t5_bias"))
    peer = RelativePositionBias(scale=1.0, causal=True, num_buckets=32, max_distance=128, heads=4).double()
    with torch.no_grad():
        peer.relative_attention_bias.weight.copy_(mod.learned.sites["bias[0]__table0"].weight)
    q, k, v = _qkv(4, 200)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, peer(200, 200)), rtol=1e-10, atol=1e-12)


def test_dynamic_position_bias_equals_x_transformers():
    from x_transformers.x_transformers import DynamicPositionBias

    H, L, hidden = 4, 97, 32
    peer = DynamicPositionBias(dim=hidden, heads=H, depth=2, log_distance=True).double()
    mod = _scheme("dynamic_position_bias", H=H, hidden=hidden)
    net = mod.learned.sites["bias[0]__mlp0"]
    state = {f"{2 * k}.{p}": peer.mlp[k][0].state_dict()[p] for k in range(2) for p in ("weight", "bias")}
    state.update({f"4.{p}": w for p, w in peer.mlp[2].state_dict().items()})
    net.load_state_dict(state)
    q, k, v = _qkv(H, L)
    ours = mod(q, k, v)
    # the peer's forward reads its distances in float32 (``.float()``): compare there at float32's precision,
    # then its own layers on the float64 features of its log_distance (sign(d) log(|d| + 1), d = i - j >= 0)
    peer32 = peer.float()(L, L).double()
    peer.double()
    d = torch.arange(L, dtype=F64)[:, None]
    feat = torch.sign(d) * torch.log(d.abs() + 1)
    widest = 0.0
    for layer in peer.mlp:
        feat = layer(feat)
        widest = max(widest, float(feat.detach().abs().max()))
    # float32 MLP: the log feature (2 roundings), three layers (1, hidden, hidden inputs + a bias) and two SiLUs
    # (4 each), at the widest activation; a logit moved by delta moves the output by at most 2 delta max|v|
    delta = float32_bound(2 * hidden + 14, torch.tensor(widest))
    torch.testing.assert_close(ours, _attend(q, k, v, peer32), rtol=0, atol=2 * delta * float(v.abs().max()))
    i = torch.arange(L)
    table = feat[(i[:, None] - i[None, :]).clamp(min=0)].permute(2, 0, 1)  # (H, L, L) at d = i - j
    torch.testing.assert_close(ours, _attend(q, k, v, table), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("H, alibi_heads", [(8, 3), (6, 6), (4, 1)])
def test_alibi_partial_equals_x_transformers_alibi_num_heads(H, alibi_heads):
    from x_transformers.x_transformers import AlibiPositionalBias

    peer = AlibiPositionalBias(heads=alibi_heads, total_heads=H).double()
    mod = _scheme("alibi_partial", H=H, alibi_heads=alibi_heads)
    q, k, v = _qkv(H, 64)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, peer(64, 64)), rtol=1e-10, atol=1e-12)


def test_alibi_learned_starts_as_alibi_and_equals_x_transformers_with_its_slopes():
    from x_transformers.x_transformers import AlibiPositionalBias

    H, L = 6, 50
    mod = _scheme("alibi_learned", H=H)
    q, k, v = _qkv(H, L)
    # float32 start: each slope (<= 1/2) rounded by u = eps32 / 2, a logit by u L, the output by 2 u L max|v|
    torch.testing.assert_close(mod(q, k, v), _scheme("alibi", H=H)(q, k, v), rtol=0, atol=float32_bound(L, v))
    _moved(mod)
    slopes = mod.learned.sites["bias[0]__learned0"].value.exp()
    peer = AlibiPositionalBias(heads=H).double()
    peer.slopes = slopes.detach().reshape(H, 1, 1)  # its constructor rounds a slope list to float32
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, peer(L, L)), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------- no peer: the paper's formula, naively
def _naive(H, L, fn):
    b = torch.zeros(H, L, L, dtype=F64)
    for h in range(H):
        for i in range(L):
            for j in range(i + 1):
                b[h, i, j] = fn(h, i - j)
    return b


def test_kerple_log_is_the_papers_formula():
    H, L = 4, 40
    mod = _moved(_scheme("kerple_log", H=H))
    r1 = mod.learned.sites["bias[0]__learned0"].value.tolist()
    r2 = mod.learned.sites["bias[0]__learned1"].value.tolist()
    b = _naive(H, L, lambda h, d: -max(r1[h], 0.01) * math.log(1 + max(r2[h], 0.01) * d))
    q, k, v = _qkv(H, L)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, b), rtol=1e-10, atol=1e-12)


def test_kerple_power_is_the_papers_formula():
    H, L = 4, 40
    mod = _moved(_scheme("kerple_power", H=H), scale=0.8)
    r1 = mod.learned.sites["bias[0]__learned0"].value.tolist()
    r2 = mod.learned.sites["bias[0]__learned1"].value.tolist()
    b = _naive(H, L, lambda h, d: -max(r1[h], 0.01) * float(d) ** min(max(r2[h], 0.01), 2.0))
    q, k, v = _qkv(H, L)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("H", [4, 8])
def test_sandwich_is_the_papers_formula(H):
    L, dim = 70, 128
    mod = _scheme("sandwich", H=H)
    b = _naive(H, L, lambda h, d: (sum(math.cos(d / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
                                   - dim / 2) / ((h + 1) * 8 / H))
    q, k, v = _qkv(H, L)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, b), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------- kernels, decoding, codegen, numpy
TOEPLITZ = ["t5_bias", "dynamic_position_bias", "kerple_log", "kerple_power", "sandwich"]


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias", "kerple_log", "sandwich"])
def test_a_distance_table_is_never_a_square_tensor(name, monkeypatch):
    """Packed documents take the blocks of queries: one (H, distances) table a call, gathered per block of
    queries - no (B, H, L, L) bias."""
    from pedsl.compiler.general import attention as general_attention

    mod = _scheme(name)
    assert mod.backend == "sdpa" and mod.biases[0].carried == QUERY_BLOCKS
    calls, shapes = [], []
    real_attend, orig = general_attention.attend, ModuleScheme.distance_table

    def table(self, i, size, device):
        calls.append(size)
        return orig(self, i, size, device)

    def attend(q, k, v, mask, bias, *args, **kw):
        shapes.append(tuple(bias.shape))
        return real_attend(q, k, v, mask, bias, *args, **kw)

    monkeypatch.setattr(ModuleScheme, "distance_table", table)
    monkeypatch.setattr(general_attention, "attend", attend)
    L = 3 * general_attention.QUERY_CHUNK + 5
    q, k, v = _qkv(4, L)
    docs = (torch.arange(L) >= 100).long().expand(2, L)  # positions restart at 100: no longer Toeplitz in i - j
    mod(q, k, v, document_ids=docs)
    assert calls == [L - 100]  # once per call, over every distance
    assert shapes and all(s[2] <= general_attention.QUERY_CHUNK for s in shapes)


def _spy_kernel(monkeypatch):
    """Counts the calls of the Toeplitz kernel through the module's fused kernels (the C++ kernel, which
    takes these calls first where it is built, switched off: test_bias_kernel.py checks it)."""
    calls = []
    monkeypatch.setattr(FusedKernels, "bias_ready", staticmethod(lambda: False))
    real = FusedKernels.distance_attention

    def spy(q, k, v, table, **kw):
        calls.append(tuple(table.shape))
        return real(q, k, v, table, **kw)

    monkeypatch.setattr(FusedKernels, "distance_attention", staticmethod(spy))
    return calls


@pytest.mark.parametrize("name", TOEPLITZ)
@pytest.mark.parametrize("L", [5, 37, 48])
def test_the_toeplitz_kernel_equals_the_reference_interpreter_forward_and_backward(name, L, monkeypatch):
    """Blocks of 16 queries, backward tiles of 8 keys: L below, across and at a multiple of the block; the
    gradients of q, k, v and of every learned parameter of the bias (T5's table, the MLP, KERPLE's r1 r2)."""
    monkeypatch.setattr(DB, "BLOCK", 16)
    monkeypatch.setattr(DB, "KEY_TILE", 8)
    calls = _spy_kernel(monkeypatch)
    mod = _moved(_scheme(name))
    ref = _scheme(name, backend="reference")
    ref.load_state_dict(mod.state_dict())
    q, k, v, x, tokens = inputs(mod, B=2, L=L)
    for positions in (None, torch.arange(L).expand(2, L) + torch.tensor([[0], [7]])):  # rows may start anywhere
        out, grads = forward_and_grads(mod, q, k, v, x, tokens, positions=positions)
        rout, rgrads = forward_and_grads(ref, q, k, v, x, tokens, positions=positions)
        torch.testing.assert_close(out, rout, rtol=1e-10, atol=1e-12)
        assert len(grads) == 3 + len(list(mod.parameters()))
        for a, b in zip(grads, rgrads):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert len(calls) == 2  # both calls ran the kernel (its backward is the gradients above)


@pytest.mark.parametrize("name", ["t5_bias", "kerple_power"])
def test_documents_and_padding_keep_the_blocks_and_equal_the_reference(name, monkeypatch):
    calls = _spy_kernel(monkeypatch)
    mod = _moved(_scheme(name))
    ref = _scheme(name, backend="reference")
    ref.load_state_dict(mod.state_dict())
    q, k, v, _, _ = inputs(mod, B=2, L=30)
    docs = (torch.arange(30) >= 11).long().expand(2, 30)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, :4] = False
    for kw in (dict(document_ids=docs), dict(attn_mask=mask)):
        torch.testing.assert_close(mod(q, k, v, **kw), ref(q, k, v, **kw), rtol=1e-10, atol=1e-12)
    assert calls == []


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias"])
def test_training_at_a_long_length_holds_no_square_tensor(name):
    """Forward and backward of the module at L = 2,000 (float32): no allocation of (B, H, L, L) floats."""
    H, L = 4, 2000
    mod = compile_scheme(SCHEMES / f"{name}.pe", num_heads=H, head_dim=16)
    q, k, v = (rnd(1, H, L, 16, seed=s, dtype=torch.float32).requires_grad_(True) for s in range(3))
    most = largest_allocation(lambda: mod(q, k, v).sum().backward())
    assert most <= 4 * H * DB.BLOCK * (DB.KEY_TILE + DB.BLOCK + 1)
    assert most < 4 * H * L * L / 4


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias", "kerple_power", "sandwich", "alibi_partial"])
def test_decoding_with_a_cache_equals_one_forward(name):
    mod = _moved(_scheme(name))
    q, k, v = _qkv(4, 150)
    full = mod(q, k, v)
    cache = mod.new_cache(2)
    parts = [mod(q[:, :, :140], k[:, :, :140], v[:, :, :140], cache=cache)]
    parts += [mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(140, 150)]
    torch.testing.assert_close(torch.cat(parts, dim=2), full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias", "kerple_log", "sandwich", "alibi_partial"])
def test_generated_module_equals_the_compiled_one(name, tmp_path):
    mod = _moved(compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=16))
    assert_generated_module_matches(mod, generate(mod.scheme, mod.plan), tmp_path / f"{name}.py", lengths=(3, 140))


@pytest.mark.parametrize("name", ["t5_bias", "dynamic_position_bias", "kerple_log"])
def test_the_numpy_sampler_computes_the_modules_table(name):
    """``pedsl diff --numeric``'s numpy walk, loaded with the module's parameters, gives its distance table;
    unloaded, a table starts at zeros (init 0) and an MLP from torch's default distribution."""
    from pedsl.diffing.sample import Sampler

    mod = _moved(compile_scheme(SCHEMES / f"{name}.pe", num_heads=4, head_dim=16).double())
    weights = {s: {k: w.double().numpy() for k, w in m.state_dict().items()} for s, m in mod.learned.sites.items()}
    sm = Sampler(mod.scheme, d_model=64, weights=weights)
    b = mod.scheme.biases[0]
    got = sm.run(b.term, "bias[0]", sm.ctx(200))
    want = ModuleScheme.of(mod).distance_table(0, 200, None)
    np.testing.assert_allclose(got.align(("head", "dist")), want.detach().numpy(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- diagnostics
@pytest.mark.parametrize("value, col, words", [
    ("table(bucket(distance, buckets = 1))", 43, "buckets = 1 is out of range"),
    ("table(bucket(distance, buckets = 32, max_distance = 16))", 16, "must exceed the 16 exact buckets"),
    ("table(bucket(distance, buckets = 2, bidirectional = true))", 16, "leave no exact bucket"),
    ("table(bucket(distance, bidirectional = 3))", 49, "'bidirectional' must be true or false"),
    ("table(bucket(position))", 23, "'distance' varies along pos"),
    ("table(bucket(distance / 2))", 23, "must be an integer distance"),
    ("table(min(distance, 63))", 10, "give size = N"),
    ("table(min(distance, 63), size = 64, to = pair)", 51, "write to = head"),
    ("table(log(1 + distance), size = 64)", 16, "'index' must be an integer"),
    ("table(bucket(distance), size = -3)", 41, "size = -3 is out of range"),
    ("mlp(log(1 + distance), hidden = 0)", 42, "hidden = 0 is out of range"),
    ("mlp(log(1 + distance), to = pair)", 38, "write to = head"),
    ("mlp(x)", 14, "'features' must be a number"),
    ("-slopes(heads, first = 9) * distance", 11, "first = 9 must be a whole number of heads"),
    ("sinusoid_dot(distance, dim = 1)", 39, "dim = 1 is out of range"),
    ("sinusoid_dot(position)", 23, "'distance' varies along pos"),
    ("-log(1 + distance / max(position, 8))", 34, "a bias cannot read 'position'"),  # FIRE's query position
    ("mlp(linear(x, to = head) * query_position)", 14, "varies along head"),
    ("mlp(log(1 + distance), relu = 2)", 40, "'relu' must be true or false"),
])
def test_bad_input_is_a_positioned_diagnostic(value, col, words):
    d = first_error(f'scheme s "" {{\n  bias = {value}\n}}')
    assert words in d.message, d.message
    assert (d.line, d.col) == (2, col), (d.line, d.col, d.message)


# ---------------------------------------------------------------------- FIRE: a bias that reads the query position
def test_fire_is_the_papers_formula():
    """b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c x| + 1), f = Linear-ReLU-Linear; learned c, L."""
    H, L = 4, 60
    mod = _moved(_scheme("fire", H=H), scale=0.05)
    with torch.no_grad():  # a threshold inside the sequence: both sides of max(L, i) are exercised
        mod.learned.sites["let[threshold]__learned0"].value.fill_(20 / 512)
    c = float(mod.learned.sites["let[c]__learned0"].value.detach())
    thr = abs(512 * float(mod.learned.sites["let[threshold]__learned0"].value.detach()))
    net = mod.learned.sites["bias[0]__mlp0"]
    w1, b1, w2, b2 = (t.detach().double() for t in (net[0].weight, net[0].bias, net[2].weight, net[2].bias))

    def f(h, i, d):
        x = math.log(abs(c * d) + 1) / (math.log(abs(c * max(i, thr)) + 1) + 1e-6)
        hidden = torch.relu(w1[:, 0] * x + b1)
        return float(w2[h] @ hidden + b2[h])

    b = torch.zeros(H, L, L, dtype=F64)
    for h in range(H):
        for i in range(L):
            for j in range(i + 1):
                b[h, i, j] = f(h, i, i - j)
    q, k, v = _qkv(H, L)
    torch.testing.assert_close(mod(q, k, v), _attend(q, k, v, b), rtol=1e-10, atol=1e-12)
    assert mod.biases[0].query and mod.biases[0].carried == QUERY_BLOCKS


def test_fire_gradients_reach_c_and_the_threshold_and_decoding_matches():
    mod = _moved(_scheme("fire"), scale=0.05)
    with torch.no_grad():
        mod.learned.sites["let[threshold]__learned0"].value.fill_(20 / 512)
    q, k, v = _qkv(4, 60)
    mod(q, k, v).square().sum().backward()
    for key in ("let[c]__learned0", "let[threshold]__learned0"):
        assert float(mod.learned.sites[key].value.grad.abs()) > 0, key
    with torch.no_grad():
        full = mod(q, k, v)
        cache = mod.new_cache(2)
        parts = [mod(q[:, :, :50], k[:, :, :50], v[:, :, :50], cache=cache)]
        parts += [mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache) for t in range(50, 60)]
    torch.testing.assert_close(torch.cat(parts, dim=2), full, rtol=1e-9, atol=1e-10)


def test_fire_generated_module_equals_the_compiled_one(tmp_path):
    mod = _moved(compile_scheme(SCHEMES / "fire.pe", num_heads=4, head_dim=16), scale=0.05)
    assert_generated_module_matches(mod, generate(mod.scheme, mod.plan), tmp_path / "fire.py", lengths=(3, 300))


def test_a_query_position_term_alone_cancels():
    """A term that reads only the query position is constant along each softmax row: dropped, with W106."""
    from pedsl.lang.api import check

    diags = check('scheme s "" {\n  bias = -log(1 + distance) + query_position\n}')
    assert [d.code for d in diags] == ["W106"]


def test_numeric_diff_samples_learned_distance_biases_at_their_start():
    """``pedsl diff --numeric`` (numpy, no torch) draws a learned bias at its start: learned ALiBi is ALiBi,
    a T5 table starts at zero, FIRE's query-dependent bias is averaged over the queries."""
    import pedsl
    from pedsl.diffing import numeric as N

    def bias(name):
        return N.curves(pedsl.load(SCHEMES / f"{name}.pe"), lmax=32).bias

    np.testing.assert_allclose(bias("alibi_learned"), bias("alibi"), rtol=1e-12, atol=1e-12)
    assert np.all(bias("t5_bias") == 0)
    fire = bias("fire")
    assert fire.shape == (4, 33) and np.all(np.isfinite(fire)) and np.ptp(fire) > 0


# ---------------------------------------------------------------------- FIRE on the MLP-bias kernel
def _spy_mlp_kernel(monkeypatch):
    calls = []
    real = FusedKernels.mlp_attention

    def spy(q, k, v, *factors, **kw):
        calls.append(tuple(q.shape))
        return real(q, k, v, *factors, **kw)

    monkeypatch.setattr(FusedKernels, "mlp_attention", staticmethod(spy))
    return calls


def _fire_pair(threshold, source=None):
    mod = _moved(compile_scheme(source or SCHEMES / "fire.pe", num_heads=4, head_dim=16).double(), scale=0.05)
    with torch.no_grad():
        mod.learned.sites["let[threshold]__learned0"].value.fill_(threshold / 512)
    ref = compile_scheme(source or SCHEMES / "fire.pe", num_heads=4, head_dim=16, backend="reference").double()
    ref.load_state_dict(mod.state_dict())
    return mod, ref


@pytest.mark.parametrize("L", [5, 16, 37, 48])
@pytest.mark.parametrize("threshold", [3.0, 20.0, 47.0, 200.0])
def test_fire_kernel_equals_the_reference_interpreter_forward_and_backward(L, threshold, monkeypatch):
    """Blocks of 16 queries, tiles of 24 keys: L below, across and at a multiple of both; the threshold below,
    inside and past L; gradients of q, k, v, the MLP, c and the threshold; rows that start at one later position."""
    from pedsl.ops import mlp_bias as MB

    monkeypatch.setattr(MB, "BLOCK", 16)
    monkeypatch.setattr(MB, "SCORE_TILE", 24)
    calls = _spy_mlp_kernel(monkeypatch)
    mod, ref = _fire_pair(threshold)
    q, k, v, x, tokens = inputs(mod, B=2, L=L)
    for positions in (None, torch.arange(L).expand(2, L) + 7):
        out, grads = forward_and_grads(mod, q, k, v, x, tokens, positions=positions)
        rout, rgrads = forward_and_grads(ref, q, k, v, x, tokens, positions=positions)
        torch.testing.assert_close(out, rout, rtol=1e-10, atol=1e-12)
        assert len(grads) == 3 + 6  # q, k, v, c, threshold, W1, b1, W2, b2
        for a, b in zip(grads, rgrads):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert len(calls) == 2


def test_fire_keeps_the_blocks_wherever_the_kernel_does_not_apply(monkeypatch):
    """Each refusal, checked to equal the reference interpreter and to leave the kernel uncalled: a cache,
    padding, documents, a (B, 1, L, L) mask, rows at different positions, GQA, a window, a sink, soft-capping,
    a term added to the MLP, a SiLU MLP, two hidden layers, features that are not a product."""
    calls = _spy_mlp_kernel(monkeypatch)
    mod, ref = _fire_pair(20.0)
    L = 30
    q, k, v, _, _ = inputs(mod, B=2, L=L)
    docs = (torch.arange(L) >= 11).long().expand(2, L)
    pad = torch.ones(2, L, dtype=torch.bool)
    pad[1, :4] = False
    mask4 = torch.ones(2, 1, L, L, dtype=torch.bool).tril()
    mask4[0, 0, 20:, :3] = False
    shifted = torch.arange(L).expand(2, L) + torch.tensor([[0], [5]])
    for kw in (dict(document_ids=docs), dict(attn_mask=pad), dict(attn_mask=mask4), dict(positions=shifted)):
        torch.testing.assert_close(mod(q, k, v, **kw), ref(q, k, v, **kw), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mod(q, k[:, :2], v[:, :2]), ref(q, k[:, :2], v[:, :2]), rtol=1e-10, atol=1e-12)
    cache = mod.new_cache(2)
    torch.testing.assert_close(mod(q, k, v, cache=cache), ref(q, k, v), rtol=1e-10, atol=1e-12)
    assert calls == []
    fire = 'log(abs(c * distance) + 1) / (log(abs(c * max(query_position, threshold)) + 1) + 1.0e-6)'
    head = f'import "{SCHEMES / "fire.pe"}"\nscheme f extends fire "" {{\n'
    variants = [
        "  window = 12\n", "  sink = logit\n", "  softcap = 5.0\n",
        f"  bias = mlp({fire}, hidden = 32, depth = 1, relu = true, to = head) - 0.1 * distance\n",
        f"  bias = mlp({fire}, hidden = 32, depth = 1, relu = false, to = head)\n",
        f"  bias = mlp({fire}, hidden = 8, depth = 2, relu = true, to = head)\n",
        "  bias = mlp(log(abs(c * distance) + 1) - log(query_position + 2), hidden = 8, depth = 1, relu = true, to = head)\n",
    ]
    for body in variants:
        src = head + body + "}\n"
        m = compile_scheme(src, num_heads=4, head_dim=16).double()
        r = compile_scheme(src, num_heads=4, head_dim=16, backend="reference").double()
        r.load_state_dict(m.state_dict())
        torch.testing.assert_close(m(q, k, v), r(q, k, v), rtol=1e-10, atol=1e-12, msg=lambda s, b=body: f"{b}: {s}")
    assert calls == []


def test_a_query_position_bias_reads_the_calls_length_in_every_block(tmp_path, monkeypatch):
    """n is the call's run-time length in every block of queries, not the block's largest distance:
    over several blocks the module, the reference and the generated module agree (they did not)."""
    from pedsl.compiler.general import attention as general_attention

    monkeypatch.setattr(general_attention, "QUERY_CHUNK", 16)
    path = tmp_path / "qn.pe"
    path.write_text('scheme qn "reads query_position and n" {\n'
                    '  bias = -0.05 * distance * log(n + 1.0) / log(query_position + 2.0)\n}\n')
    mod = compile_scheme(path, num_heads=2, head_dim=16).double()
    ref = compile_scheme(path, backend="reference", num_heads=2, head_dim=16).double()
    q, k, v = (torch.randn(2, 2, 45, 16, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
               for s in range(3))
    torch.testing.assert_close(mod(q, k, v), ref(q, k, v), rtol=1e-12, atol=1e-12)
    assert_generated_module_matches(mod, generate(mod.scheme, mod.plan), tmp_path / "qn_mod.py", lengths=(3, 45))
