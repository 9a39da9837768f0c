"""A few tests that really run torch.compile (slow the first time; the inductor cache helps after)."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import inputs
from conftest import SCHEMES
from pedsl.compiler import compile_scheme

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("name", ["rope_id", "alibi"])
def test_compiled_module_matches_eager(name):
    eager = compile_scheme(SCHEMES / f"{name}.pe")
    comp = compile_scheme(SCHEMES / f"{name}.pe", compile=True)
    for L in (64, 96):  # a second length: dynamic shapes, no recompile per length
        q, k, v, _, _ = inputs(eager, B=1, L=L, dtype=torch.float32, grad=False)
        torch.testing.assert_close(comp(q, k, v), eager(q, k, v), rtol=1e-4, atol=1e-5)


def test_flex_backend_forward_matches_masked():
    text = 'scheme t { bias = -log(1 + distance) * slopes(heads) }'
    flex = compile_scheme(text, backend="flex", requires_grad=False)
    masked = compile_scheme(text, backend="masked")
    q, k, v, _, _ = inputs(masked, B=1, L=128, dtype=torch.float32, grad=False)
    torch.testing.assert_close(flex(q, k, v), masked(q, k, v), rtol=1e-4, atol=1e-5)
