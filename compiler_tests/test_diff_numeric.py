"""pedsl diff --numeric: curves vs distance, checked against the compiled module's raw_scores.

The static path (numpy, float64) and the data-dependent path (torch, the module's angles
and Householder steps moved one key at a time) are both compared with an independent
reference: ``compile_scheme(...).raw_scores(q, k)`` with q = k = the same unit vector at
every position, averaged over the diagonals i - j = d.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pedsl
from pedsl.diffing import numeric as N

SCHEMES = Path(__file__).parent.parent / "schemes"


def load(name: str, **params):
    return pedsl.load(SCHEMES / f"{name}.pe", params=params or None)


def _reference(s, lmax: int, samples: int = N.SAMPLES, seed: int = N.SEED, starts: int | None = None,
               basis: bool = True) -> np.ndarray:
    """mean <u, T(j -> j + d) u> from raw_scores, over all j (starts=None) or j < starts, with the curves' inputs.

    basis=True averages over the one-hot vectors e_c (the exact mean over the unit sphere, tr T / D);
    basis=False uses the curves' seeded random unit vectors (Householder groups).
    """
    import torch

    from pedsl.compiler import compile_scheme

    L = lmax + (starts or 1)
    H, D = s.heads, s.head_dim
    torch.manual_seed(seed)
    mod = compile_scheme(s, backend="reference", d_model=H * D, requires_grad=False)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, L, H * D, generator=gen) if s.needs_x else None
    tokens = torch.randint(0, 256, (samples, L), generator=gen) if s.needs_tokens else None
    dtype = torch.float64 if x is None else torch.float32
    if basis:
        vecs = [torch.eye(D, dtype=torch.float64)[c].expand(samples, H, D) for c in range(D)]
    else:
        vecs = [torch.from_numpy(N.unit_vectors(H, D, samples, seed))]
    total = np.zeros(lmax + 1)
    for u in vecs:
        q = u[:, :, None, :].expand(samples, H, L, D).contiguous().to(dtype)
        with torch.no_grad():
            sc = mod.raw_scores(q, q, x=x, tokens=tokens).to(torch.float64)
        if starts is None:
            total += np.array([torch.diagonal(sc, -k, -2, -1).mean().item() for k in range(lmax + 1)])
        else:
            total += np.array([np.mean([sc[:, :, j + k, j].mean().item() for j in range(starts)])
                               for k in range(lmax + 1)])
    return total / len(vecs)


@pytest.mark.parametrize("name", ["rope", "pi", "rope_id", "rope_interleaved", "rope_partial", "yarn", "nope"])
def test_static_curves_match_the_compiled_kernel(name):
    s = load(name)
    c = N.curves(s, lmax=40)
    assert c.method.startswith("static")
    np.testing.assert_allclose(c.transport, _reference(s, 40, samples=1), atol=1e-9)
    assert c.transport[0] == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["acc_random_qk", "acc_learned_qkv", "path", "acc_random_position"])
def test_data_dependent_curves_match_raw_scores(name):
    s = load(name)
    c = N.curves(s, lmax=24)
    assert "torch" in c.method
    ref = _reference(s, 24, starts=N.STARTS, basis=name != "path")
    np.testing.assert_allclose(c.transport, ref, atol=2e-5)


def test_rope_with_another_base_differs():
    rows = N.compare(N.curves(load("rope")), N.curves(load("rope", base="500")))
    big = N.largest(rows)
    assert big.curve == "transport" and big.max_abs > 0.1 and 0 < big.at <= N.LMAX
    assert all(r.max_abs == 0 for r in rows if r.curve != "transport")


def test_reformatted_copy_is_exactly_zero():
    src = (SCHEMES / "rope.pe").read_text()
    messy = src.replace("\n  ", "\n      ").replace("qk: rotate(w * position)", "qk:rotate(w*position) # same")
    a, b = pedsl.load(src), pedsl.load(messy)
    rows = N.compare(N.curves(a), N.curves(b))
    assert all(r.max_abs == 0.0 for r in rows)


def test_data_dependent_schemes_are_reproducible():
    a = N.curves(load("path_fox"), lmax=16)
    b = N.curves(load("path_fox"), lmax=16)
    assert all(r.max_abs == 0.0 for r in N.compare(a, b))
    # the forget gate changes the bias, not the transport
    rows = {r.curve: r for r in N.compare(N.curves(load("path"), lmax=16), a)}
    assert rows["transport"].max_abs == 0.0
    assert rows["bias[head 0]"].max_abs > 0.1 and rows["bias[head 0]"].at == 16


def test_pairing_layout_does_not_change_the_isotropic_curve():
    rows = N.compare(N.curves(load("rope")), N.curves(load("rope_interleaved")))
    assert N.largest(rows).max_abs < 1e-12


def test_rope_as_constant_steps_is_rope():
    rows = N.compare(N.curves(load("rope")), N.curves(load("rope_accumulated")))
    assert N.largest(rows).max_abs < 1e-12


def test_alibi_bias_and_log_length_temperature():
    c = N.curves(load("rope_id_alibi"), lmax=64)
    slopes = np.array([2.0 ** (-8 * h / 4) for h in range(1, 5)])
    np.testing.assert_allclose(c.bias, -slopes[:, None] * np.arange(65)[None, :], rtol=1e-12)
    i = np.arange(65)
    np.testing.assert_allclose(c.temperature, np.maximum(1.0, np.log(i + 1) / np.log(128)), rtol=1e-12)


def test_fox_bias_decays_with_distance():
    c = N.curves(load("fox"), lmax=32)
    assert np.all(c.bias[:, 0] == 0)
    assert np.all(np.diff(c.bias, axis=1) < 0)
    np.testing.assert_allclose(c.transport, 1.0, atol=1e-12)  # no transport: <u, u> = 1
