"""Lint warnings W101-W106: each fires on a suspicious but legal scheme and `allow NAME` silences it."""

from __future__ import annotations

import pytest

from pedsl.lang.api import check, load_with_warnings

TRAIN = "  train { context = 128 }\n"

CASES = {
    # code: (allow name or None, body that triggers it, the line of the diagnostic)
    "W101": ("frayed_frequencies", "  qk: rotate(geometric(10000) * position)\n" + TRAIN, 1),
    "W102": ("temperature_without_length", "  temperature = log_length(128)\n", 1),
    "W103": ("nonorthogonal_value",
             "  qkv: accumulate(householder(w = normalize(linear(x, to = channel)), "
             "beta = 2 * sigmoid(linear(x, to = head))))\n" + TRAIN, 1),
    "W104": ("no_spectral_gap",
             "  qkv: accumulate(rotation(geometric(10000) * (1 + 0.1 * frozen_random(token))))\n" + TRAIN, 1),
    "W105": ("unused", "  let unused_thing = 3\n  qk: none\n", 2),
}


def text(body: str, allow: str | None = None) -> str:
    return "scheme s {\n" + body + (f"  allow {allow}\n" if allow else "") + "}\n"


@pytest.mark.parametrize("code", sorted(CASES))
def test_warning_fires(code):
    allow, body, line = CASES[code]
    diags = check(text(body))
    assert [d.code for d in diags] == [code], [d.render() for d in diags]
    d = diags[0]
    assert d.severity == "warning" and d.line == line and d.col is not None and d.hint


@pytest.mark.parametrize("code", sorted(CASES))
def test_allow_silences(code):
    allow, body, _ = CASES[code]
    assert check(text(body, allow)) == []


def test_warnings_do_not_stop_loading():
    scheme, diags = load_with_warnings(text(CASES["W101"][1]))
    assert scheme.name == "s" and [d.code for d in diags] == ["W101"]


def test_w101_counts_slow_pairs_and_respects_the_grid():
    (d,) = check(text(CASES["W101"][1]))
    assert "of 16 rotary pairs" in d.message
    # the span grid never frays: its slowest pair does two cycles in the training length
    assert check(text("  qk: rotate(span(128) * position)\n" + TRAIN)) == []
    # constant accumulated steps are RoPE, and fray alike
    assert [x.code for x in check(text("  qk: accumulate(rotation(geometric(10000)))\n" + TRAIN))] == ["W101"]


def test_w101_needs_a_training_length():
    assert check(text("  qk: rotate(geometric(10000) * position)\n")) == []


def test_w104_quiet_for_zero_mean_spread():
    body = "  qk: accumulate(rotation(logspace(1.0, 0.25) * frozen_random(token)))\n" + TRAIN
    assert check(text(body)) == []


def test_w103_quiet_for_reflections():
    body = "  qkv: accumulate(householder(w = normalize(linear(x, to = channel)), beta = 2))\n" + TRAIN
    assert check(text(body)) == []


def test_w105_not_for_used_names_nor_in_variants():
    assert check(text("  let w = geometric(10000)\n  qk: rotate(w * position)\n")) == []
    two = "scheme a {\n  let w = 2\n  qk: none\n  allow unused\n}\nscheme b extends a {\n  let v = 3\n}\n"
    assert check(two) == []


def test_w106_bias_without_distance():
    diags = check("scheme s {\n  bias = -slopes(heads) * distance + 1\n}\n")
    assert [d.code for d in diags] == ["W106"] and diags[0].line == 2


def test_unknown_allow_is_an_error():
    diags = check(text("  qk: none\n", "frayed_frequency"))
    assert diags[0].code == "E216" and diags[0].hint.startswith("did you mean 'frayed_frequencies'")


@pytest.mark.parametrize("body", [
    "  let m = 16\n  qk: none\n  contextual = cope(max_pos = m)\n",
    "  let cur = false\n  qk: none\n  normalize = stick_breaking(current = cur)\n",
])
def test_a_let_read_only_by_normalize_or_contextual_is_used(body):
    """The lint reads every statement's expressions through its record's ``reads``."""
    assert check(text(body)) == []
