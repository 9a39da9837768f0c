"""Values at the edge of float32 that `check` used to accept while the compiled module computed them
wrongly: a soft cap past float32, xPos decays too steep for its scales, a learned start value whose
bias overflows. Each is refused with its bound (by `check`, or by the module at run time where the
bound depends on the call's length); at the largest value accepted, every backend equals the float64
reference interpreter to float32 rounding."""

from __future__ import annotations

import math

import pytest
import torch

from compiler_helpers import D_MODEL, SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.errors import CheckError, ShapeError
from pedsl.lang.bounds import MAX_SOFTCAP, xpos_longest

H, D = 2, 16
EPS32 = torch.finfo(torch.float32).eps


def _qkv(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))


def _f32_error(src, L, backend="auto", params=None):
    """max |float32 module - float64 reference| on one seeded input, and the output's magnitude."""
    kw = dict(num_heads=H, head_dim=D, d_model=D_MODEL, params=params or {})
    fast = compile_scheme(src, backend=backend, **kw)
    ref = compile_scheme(src, backend="reference", **kw).double()
    q, k, v = _qkv(L)
    got = fast(q.float(), k.float(), v.float()).double()
    want = ref(q, k, v)
    assert torch.isfinite(got).all()
    return float((got - want).abs().max().detach())


def _extends(base, extra):
    return f'import "{SCHEMES / (base + ".pe")}"\nscheme s extends {base} {{\n{extra}\n}}'


@pytest.mark.parametrize("cap", ["1e39", "3.4e38", "1e32"])
def test_a_softcap_past_float32s_reach_is_refused_with_its_bound(cap):
    with pytest.raises(CheckError) as err:
        compile_scheme(_extends("rope", f"softcap = {cap}"), num_heads=H, head_dim=D)
    assert err.value.diagnostics[0].code == "E240" and "2^103" in str(err.value)


def test_the_largest_softcap_accepted_computes_the_uncapped_scores():
    """At 2^103 a float32 score loses at most 2^-23 (below one rounding of a unit score): the module's
    error against the float64 reference stays within 4x the uncapped module's own (a floor measured here)."""
    floor = _f32_error(_extends("rope", ""), 21)
    capped = _f32_error(_extends("rope", f"softcap = {MAX_SOFTCAP!r}"), 21)
    assert capped <= 4 * floor + 8 * EPS32, (capped, floor)


@pytest.mark.parametrize("src, params", [
    ("scheme s { layout interleaved\n qk: xpos(geometric(10000.0) * position, gamma = 1e-3, zeta = 0.4) }", {}),
    (str(SCHEMES / "xpos.pe"), {"gamma": 0.01}),
], ids=["inline-gamma-1e-3", "library-gamma-0.01"])
def test_xpos_too_steep_for_the_training_context_is_refused_with_the_smallest_gamma(src, params):
    with pytest.raises(CheckError) as err:
        compile_scheme(src, num_heads=H, head_dim=D, params=params)
    d = err.value.diagnostics[0]
    need = 64 * math.log2(1.4 / 0.4) / 63  # context 128: (n // 2) log2(1 / zeta_0) / gamma <= 63
    assert d.code == "E217" and f"at least {math.ceil(need * 1000) / 1000:g}" in d.message, d.message


@pytest.mark.parametrize("backend", ["auto", "sdpa", "masked", "blockwise"])
def test_xpos_at_its_longest_length_matches_the_reference_and_one_more_token_is_refused(backend):
    """gamma = 1: 69 tokens fit 2^+-63 (the masked backend's full score matrix was NaN at 139); the
    float32 module equals the float64 reference to float32 rounding of the softmax (16 eps x L), and at
    70 tokens the call is refused with the bound instead of scoring NaN."""
    params = {"gamma": 1.0, "train_length": 64}
    L = xpos_longest(1.0, 0.4)
    assert L == 69
    assert _f32_error(str(SCHEMES / "xpos.pe"), L, backend, params) <= 16 * EPS32 * L
    mod = compile_scheme(SCHEMES / "xpos.pe", backend=backend, num_heads=H, head_dim=D, d_model=D_MODEL,
                         params=params)
    q, k, v = _qkv(L + 1)
    with pytest.raises(ShapeError, match=r"2\^\+-63"):
        mod(q.float(), k.float(), v.float())


@pytest.mark.parametrize("bias", ["-exp(learned(100.0)) * distance", "-exp(learned(88.0)) * distance",
                                  "-learned(1e4) * 1e30 * distance"])
def test_a_learned_start_whose_bias_overflows_float32_is_refused(bias):
    """The default backend carries slope * (i - j) as slope * i - slope * j (inf - inf = NaN at the diagonal),
    the masked one as a float64 table cast to float32 (finite): the value is refused before they disagree."""
    with pytest.raises(CheckError) as err:
        compile_scheme(f"scheme s {{ bias = {bias} }}", num_heads=H, head_dim=D)
    d = err.value.diagnostics[0]
    assert d.code == "E217" and "the bias" in d.message


@pytest.mark.parametrize("backend", ["auto", "masked"])
def test_a_steep_learned_slope_within_float32_agrees_on_every_backend(backend):
    """exp(30) * 1,048,575 = 1.1e19: within float32 at every distance; the float32 backends equal the
    reference (a one-hot row: each query sees itself) to rounding."""
    src = "scheme s { bias = -exp(learned(30.0)) * distance }"
    assert _f32_error(src, 9, backend) <= 16 * EPS32
