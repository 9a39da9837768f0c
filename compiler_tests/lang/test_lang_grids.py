"""Static values of grids and slopes (pedsl.lang.builtin_defs.grids, folded by pedsl.lang.fold) against values worked out by hand
from the papers' formulas (docs/semantics.md §2a, 3), in float64."""

from __future__ import annotations

import math

import pytest

from pedsl.formulas import alibi_slopes
from pedsl.lang.fold import fold_expr
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv, Vec
from pedsl.lang.parser import parse_module


def ev(expr: str, pairs: int | None = 16, n: int | None = None, **values):
    e = parse_module(f"scheme s {{ let v = {expr} }}").schemes[0].body[0].value
    return fold_expr(e, StaticEnv(values=values, pairs=pairs, n=n))


def vec(expr: str, **kw) -> list[float]:
    v = ev(expr, **kw)
    assert isinstance(v, Vec) and v.axis == "pair"
    return list(v.values)


def test_geometric():
    w = vec("geometric(10000)")
    assert len(w) == 16
    assert w[0] == 1.0
    assert w[4] == pytest.approx(0.1, rel=1e-15)  # 10000^(-8/32)
    assert w[8] == pytest.approx(0.01, rel=1e-15)  # 10000^(-16/32)
    assert w[15] == pytest.approx(10000 ** (-30 / 32), rel=1e-15)
    assert vec("geometric()") == w  # base 10000 by default
    assert vec("geometric(100)", pairs=2) == pytest.approx([1.0, 0.1])  # 100^(-2/4)


def test_ntk():
    # base * s^(D / (D - 2)) with D = 32 rotated channels, s = 4
    base = 10000 * 4 ** (32 / 30)
    w = vec("ntk(10000, 4)")
    assert w[8] == pytest.approx(base ** -0.5, rel=1e-14)
    assert w[15] == pytest.approx(base ** (-30 / 32), rel=1e-14)
    assert vec("ntk(10000, 1)") == pytest.approx(vec("geometric(10000)"), rel=1e-15)


def test_dynamic_ntk_uses_the_run_time_length():
    assert ev("dynamic_ntk(10000, 2, 128)", n=None) is not DYNAMIC  # defaults to the original length
    assert vec("dynamic_ntk(10000, 2, 128)", n=128) == pytest.approx(vec("geometric(10000)"))
    s = 2 * 512 / 128 - (2 - 1)  # = 7
    w = vec("dynamic_ntk(10000, 2, 128)", n=512)
    assert w[8] == pytest.approx((10000 * s ** (32 / 30)) ** -0.5, rel=1e-14)


def test_yarn_wavelength():
    # YaRN eqs. 17-22: r = L w / 2pi, g = clamp((r - 1) / (32 - 1), 0, 1), w' = (1 - g) w / s + g w
    w = vec("yarn_wavelength(10000, 4, 128)")
    r0 = 128 / (2 * math.pi)  # w_0 = 1: 20.37 turns in 128 tokens
    g0 = (r0 - 1) / 31
    assert w[0] == pytest.approx((1 - g0) / 4 + g0, rel=1e-14)
    # pair 8: w = 0.01, r = 0.2037 < alpha: fully interpolated
    assert w[8] == pytest.approx(0.01 / 4, rel=1e-14)
    # with a long original length, the fast pairs keep their frequency (r > beta)
    w_long = vec("yarn_wavelength(10000, 4, 4096)")
    assert w_long[0] == 1.0 and w_long[15] == pytest.approx(10000 ** (-30 / 32) / 4)


def test_yarn_index_ramp():
    # HF / the authors: correction dims d(b) = D ln(L / (2 pi b)) / (2 ln base), D = 32, base 1e4, L = 128:
    # d(32) = -0.78 -> floor -1 -> clamped to 0; d(1) = 5.24 -> ceil 6. Pair k's ramp is k / 6 (capped at 1).
    D, L = 32, 128
    d = lambda b: D * math.log(L / (2 * math.pi * b)) / (2 * math.log(10000))  # noqa: E731
    assert math.floor(d(32)) == -1 and math.ceil(d(1)) == 6
    w = vec("yarn(10000, 4, 128)")
    for k in (0, 3, 6, 10):
        f = 10000 ** (-2 * k / D)
        r = min(k / 6, 1.0)
        assert w[k] == pytest.approx(f / 4 * r + f * (1 - r), rel=1e-14)
    # without truncation the ramp runs from 0 (clamped) to 5.24
    w = vec("yarn(10000, 4, 128, truncate = false)")
    f = 10000 ** (-6 / D)
    assert w[3] == pytest.approx(f / 4 * (3 / d(1)) + f * (1 - 3 / d(1)), rel=1e-14)
    # a zero-width ramp (low == high) is widened by 0.001, as HF does
    w = vec("yarn(10000, 4, 128, beta_fast = 1, beta_slow = 1)")
    assert w[6] == pytest.approx(10000 ** (-12 / D) / 4, rel=1e-14) and w[5] == pytest.approx(10000 ** (-10 / D))


def test_yarn_and_longrope_attention_factors():
    assert ev("yarn_mscale(4)", pairs=None) == pytest.approx(0.1 * math.log(4) + 1)
    assert ev("yarn_mscale(1)", pairs=None) == 1.0
    assert ev("yarn_mscale(4, mscale = 0.707)", pairs=None) == pytest.approx(0.1 * math.log(4) + 1)  # one alone: ignored
    assert ev("yarn_mscale(4, 0.707, 0.707)", pairs=None) == pytest.approx(1.0)
    assert ev("yarn_mscale(4, 1, 0.5)", pairs=None) == pytest.approx((0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    assert ev("yarn_mscale(4, attention_factor = 1.5)", pairs=None) == 1.5
    assert ev("longrope_mscale(32, 4096)", pairs=None) == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert ev("longrope_mscale(1, 4096)", pairs=None) == 1.0
    assert ev("longrope_mscale(32, 4096, 1.25)", pairs=None) == 1.25


def test_longrope_switches_lists_past_the_original_length():
    short, long = "[1, 2]", "[3, 4]"
    for n, lst in ((None, (1, 2)), (100, (1, 2)), (101, (3, 4))):
        w = vec(f"longrope(100, {short}, {long}, 100)", pairs=2, n=n)
        assert w == pytest.approx([1 / lst[0], 0.1 / lst[1]], rel=1e-15)
    with pytest.raises(EvalIssue):
        ev("longrope(100, [1, 2, 3], [1, 2], 100)", pairs=2)


def test_floor_ceil():
    assert ev("floor(2.5) + ceil(2.5)", pairs=None) == 5.0
    assert ev("floor(-0.5)", pairs=None) == -1.0


def test_llama3():
    # Llama 3.1: base 500000, 64 pairs, factor 8, original 8192, low 1, high 4
    w = vec("llama3(500000, 8, 8192)", pairs=64)
    ref = []
    for k in range(64):
        f = 500000 ** (-2 * k / 128)
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            ref.append(f)
        elif wavelen > 8192 / 1:
            ref.append(f / 8)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            ref.append((1 - smooth) * f / 8 + smooth * f)
    assert w == pytest.approx(ref, rel=1e-14)
    assert w[0] == 1.0  # the fastest pair is kept
    assert w[63] == pytest.approx(500000 ** (-126 / 128) / 8)  # the slowest divided by the factor


def test_span_rope_id():
    # RoPE-ID: from a 32-token period down to 2 full cycles in the training length
    w = vec("span(128, cycles = 2, period = 32)", pairs=8)
    assert w[0] == pytest.approx(2 * math.pi / 32, rel=1e-15)
    assert w[-1] == pytest.approx(2 * math.pi * 2 / 128, rel=1e-15)
    assert w[-1] * 128 / (2 * math.pi) == pytest.approx(2.0)  # >= 2 cycles in 128 tokens
    ratios = [b / a for a, b in zip(w, w[1:])]
    assert ratios == pytest.approx([0.5 ** (1 / 7)] * 7)  # geometric spacing
    assert vec("span(128)", pairs=8) == w  # cycles = 2, period = 32 by default


def test_span_rejects_a_length_shorter_than_the_period():
    with pytest.raises(EvalIssue):
        ev("span(32, cycles = 2, period = 32)")


def test_logspace_and_per_pair():
    assert vec("logspace(1, 0.25)") == pytest.approx([0.25 ** (k / 15) for k in range(16)])
    assert vec("per_pair([1, 2])", pairs=2) == [1.0, 2.0]
    assert vec("geometric(10000) / per_pair([1, 2])", pairs=2) == pytest.approx([1.0, 0.005])
    with pytest.raises(EvalIssue):
        ev("per_pair([1, 2, 3])", pairs=2)


def test_alibi_slopes_powers_of_two():
    assert alibi_slopes(8) == tuple(2.0 ** -h for h in range(1, 9))
    assert alibi_slopes(4) == (0.25, 0.0625, 0.015625, 0.00390625)  # 2^(-8h/4) = 4^-h
    v = ev("slopes(8)", pairs=None)
    assert isinstance(v, Vec) and v.axis == "head" and v.values == alibi_slopes(8)


def test_alibi_slopes_twelve_heads():
    # closest power of two 8: its slopes 2^-1 .. 2^-8, then every other slope of the 16-head
    # sequence 2^(-h/2): h = 1, 3, 5, 7 for the remaining 4 heads
    want = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert list(alibi_slopes(12)) == pytest.approx(want, rel=1e-15)


def test_scalars_and_dynamic():
    assert ev("(0.1 * log(4) + 1) ** 2", pairs=None) == pytest.approx((0.1 * math.log(4) + 1) ** 2)
    assert ev("train_length * [1, 2, 4]", pairs=None, train_length=128) == [128, 256, 512]
    assert ev("geometric(10000) * position") is DYNAMIC
    assert ev("sqrt(8 / 128)", pairs=None) == 0.25
    with pytest.raises(EvalIssue):
        ev("1 / 0", pairs=None)
    with pytest.raises(EvalIssue):
        ev("2 ** 2 ** 2 ** 2 ** 2 ** 2", pairs=None)  # overflows quickly instead of hanging


def test_grid_needs_a_group():
    with pytest.raises(EvalIssue):
        ev("geometric(10000)", pairs=None)
