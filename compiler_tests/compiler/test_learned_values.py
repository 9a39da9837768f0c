"""learned(init): a trainable value with the axes of its static start, wherever a number of those axes
stands (a bias's slope, a rotation's frequencies, a temperature, a step angle).

Every backend equals the float64 reference interpreter, forward and gradients (the learned values'
gradients included), after the values moved away from their start; a decoding cache equals one full
forward; the generated module equals the in-process one; bad starts are positioned diagnostics."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import assert_generated_module_matches, first_error, forward_and_grads, inputs
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.compiler.plan import LEARNED_TABLE

SCHEMES = {
    "alibi_learned": 'scheme s "" { bias = -exp(learned(log(slopes(heads)))) * distance }',
    "rope_learned": 'scheme s "" { qk: rotate(learned(geometric(100.0)) * position) }',
    "rope_learned_partial": 'scheme s "" {\n  channels { rot = fraction(0.5); plain = rest }\n'
                            '  qk on rot: rotate(learned(geometric(100.0)) * position, scale = 1.2)\n'
                            '  bias = -learned(0.1) * distance\n}',
    "temperature_learned": 'scheme s "" {\n  qk: rotate(geometric(100.0) * position)\n'
                           '  temperature = learned(1.0, per = head)\n  allow temperature_without_length\n}',
    "steps_per_head_pair": 'scheme s "" { qkv: accumulate(rotation(learned(geometric(100.0), per = head))) }',
    "shared_let": 'scheme s "" {\n  let m = learned(slopes(heads))\n  bias = -m * distance + 0.5 * m * log(1 + distance)\n}',
}


def _moved(mod):
    """Move every learned value away from its start (a start of 1 or a symmetric grid can hide sign errors)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in mod.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return mod


def _compiled(name, backend="auto", **kw):
    return compile_scheme(SCHEMES[name], backend=backend, num_heads=2, head_dim=16, **kw).double()


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("backend", ["auto", "masked"])
def test_forward_and_gradients_equal_the_reference(name, backend):
    fast = _moved(_compiled(name, backend))
    ref = _compiled(name, "reference")
    ref.load_state_dict(fast.state_dict())
    assert len(list(fast.parameters())) >= 1
    for L in (1, 5, 12):  # 12 > a table built at 5
        q, k, v, x, tok = inputs(fast, L=L, seed=L)
        out_f, g_f = forward_and_grads(fast, q, k, v, x, tok)
        out_r, g_r = forward_and_grads(ref, q, k, v, x, tok)
        torch.testing.assert_close(out_f, out_r, rtol=1e-9, atol=1e-10)
        for a, b in zip(g_f, g_r):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    if L > 1:
        assert any(float(g.abs().max()) > 0 for g in g_f[3:])  # the learned values get a gradient


def test_parameters_are_named_after_their_site_and_start_at_init():
    from pedsl.formulas import alibi_slopes, geometric_values

    mod = compile_scheme(SCHEMES["alibi_learned"], num_heads=4, head_dim=16)
    (key, value), = mod.state_dict().items()
    assert key == "learned.sites.bias[0]__learned0.value"
    torch.testing.assert_close(value.double(), torch.log(torch.tensor(alibi_slopes(4), dtype=torch.float64)))
    mod = compile_scheme(SCHEMES["steps_per_head_pair"], num_heads=3, head_dim=16)
    (key, value), = mod.state_dict().items()
    assert key == "learned.sites.steps[all]__learned0.value" and value.shape == (3, 8)
    start = torch.tensor(geometric_values(100.0, 8), dtype=torch.float32)
    assert torch.equal(value, start.expand(3, 8))
    shared = compile_scheme(SCHEMES["shared_let"], num_heads=2, head_dim=16)
    assert list(shared.state_dict()) == ["learned.sites.let[m]__learned0.value"]  # one value, read twice


def test_a_learned_rotation_is_evaluated_at_every_call():
    """The phase table of learned frequencies is never cached: a training step changes the next output."""
    mod = compile_scheme(SCHEMES["rope_learned"], num_heads=2, head_dim=16)
    assert mod.plan.transports[0].table == LEARNED_TABLE
    q, k, v, _, _ = inputs(mod, L=9, dtype=torch.float32)
    before = mod(q, k, v)
    opt = torch.optim.SGD(mod.parameters(), lr=0.5)
    before.square().sum().backward()
    opt.step()
    after = mod(q, k, v)
    assert not torch.allclose(before, after)
    fresh = compile_scheme(SCHEMES["rope_learned"], num_heads=2, head_dim=16)
    fresh.load_state_dict(mod.state_dict())
    torch.testing.assert_close(fresh(q, k, v), after)


@pytest.mark.parametrize("name", ["alibi_learned", "rope_learned_partial", "temperature_learned", "steps_per_head_pair"])
def test_decoding_with_a_cache_equals_one_forward(name):
    mod = _moved(_compiled(name))
    q, k, v, x, tok = inputs(mod, L=10, grad=False)
    full = mod(q, k, v)
    cache = mod.new_cache(q.shape[0])
    parts = [mod(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache=cache)]
    for t in range(6, 10):
        parts.append(mod(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=2), full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["alibi_learned", "rope_learned_partial", "temperature_learned", "steps_per_head_pair",
                                  "shared_let"])
def test_generated_module_equals_the_compiled_one(name, tmp_path):
    mod = _moved(compile_scheme(SCHEMES[name], num_heads=2, head_dim=16))
    src = generate(mod.scheme, mod.plan)
    assert_generated_module_matches(mod, src, tmp_path / f"{name}.py")


@pytest.mark.parametrize("text, line, col, words", [
    ('scheme s "" {\n  bias = -learned(position) * distance\n}', 2, 19, "'init' varies along pos"),
    ('scheme s "" {\n  bias = -learned(log(0)) * distance\n}', 2, 19, "log(0) is undefined"),
    ('scheme s "" {\n  bias = -learned(1.0, per = token) * distance\n}', 2, 30, "'per' must be head or pair"),
    ('scheme s "" {\n  bias = -learned(slopes(heads), per = head) * distance\n}', 2, 40, "already has one value per head"),
    ('scheme s "" {\n  bias = -learned(1e39) * distance\n}', 2, 19, "float32"),
    ('scheme s "" {\n  qk: rotate(learned(geometric(10.0), per = pair) * position)\n}', 2, 45, "one value per pair"),
    ('scheme s "" {\n  qk: rotate(learned(log(0) * geometric(10.0)) * position)\n}', 2, 22, "log(0) is undefined"),
    ('scheme s "" {\n  bias = -learned(geometric(10.0)) * distance\n}', 2, 10, "bias is a field over head and distance"),
    ('scheme s "" {\n  qk: rotate(learned(linear(x, to = pair)) * position)\n}', 2, 22, "'init' varies along pos"),
    ('scheme s "" {\n  temperature = learned(sqrt(-1.0))\n}', 2, 25, "sqrt(-1) is undefined"),
])
def test_bad_learned_values_are_positioned_diagnostics(text, line, col, words):
    d = first_error(text)
    assert words in d.message, d.message
    assert (d.line, d.col) == (line, col), (d.line, d.col, d.message)
