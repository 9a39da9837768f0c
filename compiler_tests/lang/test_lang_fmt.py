"""The canonical form: canonical(parse(fmt(x))) == canonical(parse(x)), fmt(fmt(x)) == fmt(x),
and every comment survives, over the library, the fixtures and comments in odd places."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lang_helpers import BAD_FILES, FIXTURES, LIBRARY, token_mutant
from pedsl.errors import PedslError
from pedsl.lang.api import format, parse
from pedsl.lang.ast import canonical
from pedsl.lang.formatter import format_module
from pedsl.lang.parser import parse_module

FMT_FIXTURES = sorted((FIXTURES / "fmt").glob("*.pe"))


def comments(text: str) -> Counter:
    return Counter(c.text for c in parse_module(text).comments)


def assert_canonical_properties(text: str) -> str:
    out = format_module(parse_module(text), text)
    assert canonical(parse_module(out)) == canonical(parse_module(text))
    assert format_module(parse_module(out), out) == out, "fmt is idempotent"
    assert comments(out) == comments(text), "every comment is kept"
    return out


@pytest.mark.parametrize("path", LIBRARY + FMT_FIXTURES, ids=lambda p: p.stem)
def test_round_trip_and_idempotence(path):
    assert_canonical_properties(path.read_text())


def test_bad_fixtures_that_parse_round_trip():
    n = 0
    for path in BAD_FILES:
        try:
            text = path.read_text(encoding="utf-8")
            parse_module(text)
        except (PedslError, UnicodeDecodeError):
            continue
        assert_canonical_properties(text)
        n += 1
    assert n >= 30


def test_odd_comments_stay_near_their_code():
    out = format(FIXTURES / "fmt" / "odd_comments.pe")
    lines = out.splitlines()
    assert lines[lines.index("  param factor: float (>= 1, < 100) = 4  # trailing param") - 1] == "  # before param"
    assert "    context = train_length  # ctx" in lines
    assert "  let v = geometric(base) * 2  # inside an expression" in lines
    assert lines[-1] == "# trailing at end of file"


def test_canonical_layout():
    out = format("scheme a \"A\" {param x:int(>=1)=1;qk:none;train{context=128}}\n")
    assert out == (
        'scheme a "A" {\n'
        "  param x: int (>= 1) = 1\n"
        "  qk: none\n"
        "  train {\n"
        "    context = 128\n"
        "  }\n"
        "}\n"
    )


def test_minimal_parentheses_keep_meaning():
    for src in ["(1 - 2) - 3", "1 - (2 - 3)", "2 ** 3 ** 2", "(2 ** 3) ** 2", "-2 ** 2", "(-2) ** 2",
                "a / (b * c)", "(a / b) * c", "-(a + b)", "2 * -a", "1e-30", "0.1 + 0.2"]:
        text = f"scheme s {{\n  let v = {src}\n  qk: none\n}}\n"
        assert_canonical_properties(text)


def test_empty_and_comment_only():
    assert format("") == ""
    assert format("# only a comment\n") == "# only a comment\n"
    assert parse("# only a comment\n").schemes == ()


# ------------------------------------------------------------------ comments anywhere (property)

_LINES = {p.stem: p.read_text().splitlines() for p in LIBRARY}


@st.composite
def commented(draw):
    name = draw(st.sampled_from(sorted(_LINES)))
    lines = list(_LINES[name])
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines)))
        text = "# " + draw(st.text(alphabet="abc xyz{}();=#\"", max_size=12))
        if draw(st.booleans()) and i < len(lines) and lines[i].strip() and "#" not in lines[i]:
            lines[i] = lines[i] + "   " + text  # a trailing comment
        else:
            lines.insert(i, " " * draw(st.integers(0, 6)) + text)  # an own-line comment
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commented())
def test_comments_anywhere_round_trip(text):
    assert_canonical_properties(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutants_that_parse_round_trip(data):
    """Any token-level mutant of a library file that still parses formats canonically."""
    text = data.draw(token_mutant())
    try:
        parse_module(text)
    except PedslError:
        return
    assert_canonical_properties(text)
