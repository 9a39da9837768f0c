"""bfloat16 / float16 inputs against float64: every library scheme and backend at L = 2048 within 2x
of a hand-written layer at the same precision, and decoding as accurate as one forward.

The measurement is :func:`benchmarks.precision.measure` (``python -m benchmarks.precision`` prints
the table quoted in benchmarks/README.md); its docstring defines the baseline: every transform of the
rounded inputs computed exactly (rotated q, k, v, the temperature, the bias b(i, j)), each rounded
once to the half dtype, then SDPA in that dtype with the bias as a float mask (PaTH: the float64
computation on the rounded inputs, the output rounded). The module's weights are rounded to the
half dtype on both sides, so only the computation differs. (Before the general path formed biases
per query block in float64, ALiBi in bfloat16 was off by more than 1: the key channel
``g(j) sqrt(D)`` of the fused path loses the bias as |g| grows with j.)
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.precision import measure
from compiler_helpers import D_MODEL, rnd
from compiler_helpers import SCHEMES
from pedsl.compiler import compile_scheme
from pedsl.lang.library import library_names

L = 2048


def _check(rows, expected_backends):
    assert {r["backend"] for r in rows} == set(expected_backends)
    assert {r["dtype"] for r in rows} == {"bfloat16", "float16"}
    for r in rows:
        assert r["pedsl"] <= 2 * r["baseline"], r


@pytest.mark.parametrize("name", library_names())
def test_every_scheme_and_backend_within_twice_a_hand_written_baseline(name):
    """B=1, H=2, D=32 at L = 2048; sdpa, masked and blockwise (PaTH schemes: blockwise only). The
    reference backend is the float64 interpreter itself (half inputs are upcast), and its explicit
    (L, L, D, D) transports do not fit at this length; flex compiles (see the test below)."""
    torch.set_flush_denormal(True)
    path = "path" in name
    table = any(b.kind in ("distance-table", "axis-distance") for b in compile_scheme(SCHEMES / f"{name}.pe", d_model=D_MODEL).plan.biases)
    _check(measure(name, length=L), ("blockwise",) if path else ("sdpa", "masked") if table  # no blockwise scan
           else ("sdpa", "masked", "blockwise"))


def test_alibi_with_eight_heads_within_twice_a_hand_written_baseline():
    """Steeper slopes (up to 1/2 per token: biases to -1000 at L = 2048) in bfloat16 and float16."""
    torch.set_flush_denormal(True)
    _check(measure("alibi", length=L, shape=dict(heads=8)), ("sdpa", "masked", "blockwise"))


@pytest.mark.compile
def test_flex_within_twice_a_hand_written_baseline():
    """The flex backend (compiled on CPU, forward only) on a partial rotation with a temperature."""
    torch.set_flush_denormal(True)
    _check(measure("rope_id", length=L, backends=("flex",)), ("flex",))


@pytest.mark.parametrize("name", ["acc_random_qkv", "fox", "path_fox"])
def test_half_precision_decoding_is_as_accurate_as_one_forward(name):
    """bfloat16 prefill + decoding (PaTH keeps its cache and pending steps in float32) against float64:
    no worse than one bfloat16 forward of the whole sequence."""
    m64 = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=32, d_model=D_MODEL).double()
    m = compile_scheme(SCHEMES / f"{name}.pe", num_heads=2, head_dim=32, d_model=D_MODEL).to(torch.bfloat16)
    state = {key: val.to(torch.bfloat16) for key, val in m64.state_dict().items()}
    m.load_state_dict(state)
    m64.load_state_dict({key: val.double() for key, val in state.items()})
    n, P = 120, 80
    q, k, v = (rnd(1, 2, n, 32, seed=s) for s in range(3))
    x = rnd(1, n, D_MODEL, seed=3)
    tok = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(4))
    h = lambda t: t.to(torch.bfloat16)  # noqa: E731
    with torch.no_grad():
        exact = m64(q, k, v, x=x, tokens=tok)
        one = (m(h(q), h(k), h(v), x=h(x), tokens=tok).double() - exact)[:, :, P:].abs().max()
        c = m.new_cache(1)
        m(h(q[:, :, :P]), h(k[:, :, :P]), h(v[:, :, :P]), x=h(x[:, :P]), tokens=tok[:, :P], cache=c)
        outs = [m(h(q[:, :, s:s + 1]), h(k[:, :, s:s + 1]), h(v[:, :, s:s + 1]), x=h(x[:, s:s + 1]),
                  tokens=tok[:, s:s + 1], cache=c) for s in range(P, n)]
    dec = (torch.cat(outs, 2).double() - exact[:, :, P:]).abs().max()
    assert dec <= 1.5 * one + 1e-3, (name, float(dec), float(one))
