"""Property-based robustness: mutated library files (tokens deleted, duplicated, swapped,
truncated, random bytes inserted) either load or raise PedslError whose first diagnostic has a
line and a column - never any other exception."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lang_helpers import SCHEMES, TEXTS, token_mutant
from pedsl.errors import PedslError
from pedsl.lang.parser import decode
from pedsl.lang.imports import Loader
from pedsl.lang.resolve import check_all, resolve

N = int(os.environ.get("PEDSL_FUZZ_EXAMPLES", "150"))  # raise it for a longer hunt
SETTINGS = settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def attempt(data: bytes | str) -> None:
    """Load and check as `pedsl check` and `pedsl.load` would; only PedslError may escape, positioned."""
    try:
        text = decode(data, "mutant.pe") if isinstance(data, bytes) else data
        src = Loader().load_text(text, str(SCHEMES / "mutant.pe"), SCHEMES)
        check_all(src)
        resolve(src)
    except PedslError as err:
        d = err.diagnostics[0]
        assert d.line is not None and d.col is not None, d.render()
        assert d.line >= 1 and d.col >= 1
        assert err.render()  # renders without failing


@SETTINGS
@given(token_mutant())
def test_token_mutations(text):
    attempt(text)


@SETTINGS
@given(st.sampled_from(sorted(TEXTS)), st.data())
def test_truncations(name, data):
    text = TEXTS[name]
    attempt(text[: data.draw(st.integers(0, len(text)))])


@SETTINGS
@given(st.sampled_from(sorted(TEXTS)), st.data())
def test_random_bytes_inserted(name, data):
    raw = bytearray(TEXTS[name].encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    attempt(bytes(raw))


@settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("scheme{}()[]=:;,-+*/#\"\n a1._qkvpositon")), max_size=200))
def test_arbitrary_text(text):
    attempt(text)
