"""The activation builtins (silu, gelu, softplus, tanh) against torch's own functions, in float64.

Each is checked where it is evaluated: folded at compile time (on Python floats), at run time
in the compiled module (forward and backward, through a learned source so the gradient reaches
parameters) and in the numpy backend of ``pedsl diff --numeric``, and in the generated module.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pedsl
from pedsl.compiler import compile_scheme
from pedsl.compiler.codegen import generate
from pedsl.lang.builtin_defs.arrays import numpy_ops
from pedsl.lang.builtins import FUNCTIONS
from pedsl.runtime.torch_backend import TORCH_OPS

TORCH = {"silu": F.silu, "gelu": F.gelu, "tanh": torch.tanh,
         # torch's softplus switches to x above its threshold (20); the exact value is log1p(exp(x))
         "softplus": lambda t: F.softplus(t, threshold=1e9)}
POINTS = [-40.0, -21.0, -3.5, -1.0, -0.25, 0.0, 1e-8, 0.3, 1.0, 2.5, 19.0, 25.0, 40.0]


@pytest.mark.parametrize("name", sorted(TORCH))
def test_fold_equals_torch(name):
    """The compile-time value (a let of a constant) is torch's function at every point, tails included."""
    want = TORCH[name](torch.tensor(POINTS, dtype=torch.float64)).tolist()
    got = [FUNCTIONS[name].fold(p) for p in POINTS]
    assert got == pytest.approx(want, rel=1e-14, abs=1e-300)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_array_backends_equal_torch(name):
    """The run-time value over torch's and numpy's array namespaces, and its gradient."""
    x = torch.tensor(POINTS, dtype=torch.float64, requires_grad=True)
    run = FUNCTIONS[name].run
    got = run(TORCH_OPS, x)
    want = TORCH[name](x)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(run(numpy_ops(), np.array(POINTS)), want.detach().numpy(), rtol=1e-14, atol=1e-15)
    (g,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g, gw, rtol=1e-13, atol=1e-300)
    assert torch.autograd.gradcheck(lambda t: run(TORCH_OPS, t), (torch.linspace(-6, 6, 25, dtype=torch.float64,
                                                                                  requires_grad=True),))


def _scheme(name: str):
    return pedsl.load(f'scheme act "{name} of a learned step" {{\n'
                      f"  qk: accumulate(rotation(0.1 * {name}(linear(x, to = pair, rank = 4))))\n}}",
                      heads=2, head_dim=8)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_module_forward_and_backward_equal_torch(name):
    """The compiled module's step angles are 0.1 * f(linear(x)) with torch's f, and their gradient
    with respect to x and the learned weights is torch's."""
    torch.manual_seed(0)
    mod = compile_scheme(_scheme(name), backend="reference", d_model=6).double()
    step = mod.plan.transports[0]
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    got = mod.step_angles(step, 5, x, None, None, torch.float64)  # (B, H, L, P)
    (site,) = mod.learned.sites.values()
    u = site(x).view(2, 5, 2, 4).transpose(1, 2)  # linear(x) per head and pair
    want = 0.1 * TORCH[name](u)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)
    r = torch.randn_like(want)
    params = [x, *site.parameters()]
    for a, b in zip(torch.autograd.grad((got * r).sum(), params), torch.autograd.grad((want * r).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_generated_module_equals_the_compiled_one(name, tmp_path):
    s = _scheme(name)
    torch.manual_seed(0)
    mod = compile_scheme(s, backend="reference", d_model=6).double()
    path = tmp_path / "gen_act.py"
    path.write_text(generate(s, mod.plan, d_model=6))
    spec = importlib.util.spec_from_file_location("gen_act", path)
    gen_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_mod)
    gen = gen_mod.Module().double()
    gen.load_state_dict(mod.state_dict())
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(1, 6, 6, generator=g, dtype=torch.float64) * 4  # reaches the tails of each function
    torch.testing.assert_close(gen(q, k, v, x=x), mod(q, k, v, x=x), rtol=1e-10, atol=1e-12)


def test_softplus_is_exact_where_torch_default_is_not():
    """softplus(x) - x at x = 21 is exp(-21) ~ 7.6e-10: pedsl keeps it (torch's default threshold drops it)."""
    assert FUNCTIONS["softplus"].fold(21.0) - 21.0 == pytest.approx(math.exp(-21.0), rel=1e-6)
