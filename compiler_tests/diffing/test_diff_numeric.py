"""pedsl diff --numeric: curves vs distance, checked against the compiled module.

The static path (float64 tables) is compared with an independent reference:
``compile_scheme(...).raw_scores(q, k)`` with q = k = the same unit vector at every
position, averaged over the diagonals i - j = d. The data-dependent path samples the scheme
at initialisation in numpy (:mod:`pedsl.diffing.sample`); loaded with a compiled module's
parameters, frozen tables, x and tokens it must reproduce the module: its pieces (step
angles, Householder vectors, gates, temperature) to float32 precision, and its curves
against the same raw_scores reference.
"""

from __future__ import annotations

import math


import numpy as np
import pytest

import pedsl
from pedsl.compiler.plan import SO2
from pedsl.diffing import numeric as N
from compiler_helpers import SCHEMES, float32_bound



# The sampler computes in float64, the module its data-dependent pieces in float32: they agree within
# float32_bound of each piece's chain of roundings. A piece reads x through a linear map (d_model long,
# through a rank of at most d_model more) and applies a few builtins, each within a few ulps: BUILTINS
# counts those roundings generously.
BUILTINS = 32


def _piece_depth(s) -> int:
    """The chain of one step's angle, Householder vector or gate: the linear maps from x, the builtins,
    and the normalisation over a head's channels."""
    return 2 * s.heads * s.head_dim + s.head_dim + BUILTINS


def load(name: str, **params):
    return pedsl.load(SCHEMES / f"{name}.pe", params=params or None)


def _module(s, seed: int = N.SEED):
    import torch

    from pedsl.compiler import compile_scheme

    torch.manual_seed(seed)
    return compile_scheme(s, backend="reference", d_model=s.heads * s.head_dim, requires_grad=False)


def _inputs(s, samples: int, L: int, seed: int = N.SEED):
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, L, s.heads * s.head_dim, generator=gen) if s.needs_x else None
    tokens = torch.randint(0, 256, (samples, L), generator=gen) if s.needs_tokens else None
    return x, tokens


def _draws(mod, x, tokens, L: int) -> N.Draws:
    """The module's learned parameters, frozen tables and inputs, for the numpy sampler."""
    import torch

    B = x.shape[0] if x is not None else tokens.shape[0] if tokens is not None else 1
    q = torch.zeros(B, mod.heads, L, mod.head_dim, dtype=torch.float32 if x is not None else torch.float64)
    with torch.no_grad():
        mod(q, q, q, x=x, tokens=tokens)  # fills the frozen tables (made on first use) for this length
    weights = {site: {k: v.double().numpy() for k, v in m.state_dict().items()}
               for site, m in mod.learned.sites.items()}
    return N.Draws(x=None if x is None else x.double().numpy(), tokens=None if tokens is None else tokens.numpy(),
                   weights=weights, tables={k: v.numpy() for k, v in mod._tables.items()})


def _reference(s, lmax: int, samples: int = N.SAMPLES, seed: int = N.SEED, starts: int | None = None,
               basis: bool = True, mod=None, inputs=None) -> np.ndarray:
    """mean <u, T(j -> j + d) u> from raw_scores, over all j (starts=None) or j < starts.

    basis=True averages over the one-hot vectors e_c (the exact mean over the unit sphere, tr T / D);
    basis=False uses the curves' seeded random unit vectors (Householder groups).
    """
    import torch

    L = lmax + (starts or 1)
    H, D = s.heads, s.head_dim
    mod = mod or _module(s, seed)
    x, tokens = inputs or _inputs(s, samples, L, seed)
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


@pytest.mark.parametrize("name", ["rope", "pi", "rope_id", "rope_interleaved", "rope_partial", "yarn",
                                  "yarn_wavelength", "nope"])
def test_static_curves_match_the_compiled_kernel(name):
    s = load(name)
    c = N.curves(s, lmax=40)
    assert c.method.startswith("static")
    np.testing.assert_allclose(c.transport, _reference(s, 40, samples=1), atol=1e-9)
    # yarn's attention factor m = 0.1 ln 4 + 1 scales q and k of every channel: <u, T u> = m^2 at d = 0
    assert c.transport[0] == pytest.approx((0.1 * math.log(4) + 1) ** 2 if name == "yarn" else 1.0)


DATA = ["acc_random_qk", "acc_random_qkv", "acc_learned_qk", "acc_learned_qkv", "acc_random_position",
        "acc_random_alibi", "path", "path_fox", "fox"]


# every run-time builtin at least once, in every kind of place (steps, Householder w and beta, gate, temperature)
KITCHEN = """
scheme kitchen "every run-time builtin once" {
  param train_length: int (>= 64) = 128
  channels {
    a = quarters(1, 3)
    b = rest
  }
  qk on a: accumulate(rotation(0.1 * tanh(silu(linear(x, to = pair, rank = 4))) + min(abs(sin(frozen_random(token, seed = 3))),
    0.5) * max(cos(embedding(token, to = pair, init = 0.5)), 0.2) - frozen_random(position, seed = 1) / 8
    + 0.01 * learned(geometric(100.0), per = head)))
  qk on b: accumulate(householder(w = normalize(shortconv(linear(x, to = channel), width = 4)),
    beta = 2 * sigmoid(exp(-abs(gelu(linear(x, to = head)))) - 0.1 * softplus(linear(x, to = head)))))
  bias = accumulate(log_sigmoid(sqrt(1 + ramp(linear(x, to = head, init_bias = 2), 0, 4)) + 1))
  temperature = clamp(log_length(train_length) * (1 + 0.01 * sqrt(position) + 0.002 * floor(position / 3)
    - 0.001 * ceil(position / 5)), 1, 1.3)
  allow temperature_without_length
}
"""


@pytest.mark.parametrize("name", DATA + ["kitchen"])
def test_sampler_reproduces_the_compiled_module(name):
    """Loaded with the module's parameters and inputs, the numpy sampler computes the module's pieces."""
    import torch

    from pedsl.diffing.sample import Sampler

    s = pedsl.load(KITCHEN) if name == "kitchen" else load(name)
    L, S = 13, 2
    mod = _module(s)
    x, tokens = _inputs(s, S, L)
    dr = _draws(mod, x, tokens, L)
    sm = Sampler(s, d_model=s.heads * s.head_dim, weights=dr.weights, tables=dr.tables)
    seen = 0
    with torch.no_grad():
        for t, node in zip(s.transports, mod.transforms):
            if t.kind == "accumulate_rotation" and node.kind == SO2:
                want = mod.step_angles(node, L, x, tokens, None, torch.float32).double().numpy()
                got = sm.step_angles(t, L, dr.x, dr.tokens)
                assert np.abs(got - want).max() <= float32_bound(_piece_depth(s), torch.from_numpy(want))
                seen += 1
            if t.kind == "accumulate_householder":
                w, beta, _ = mod.householder_inputs(S, L, x, tokens, None, torch.float32)
                gw, gb = sm.householder(t, L, dr.x, dr.tokens)
                w = w[..., list(s.group(t.group).channels)].double()
                assert np.abs(gw - w.numpy()).max() <= float32_bound(_piece_depth(s), w)
                assert np.abs(gb - beta.double().numpy()).max() <= float32_bound(_piece_depth(s), beta.double())
                seen += 1
        for idx, b in enumerate(s.biases):
            if b.kind == "gate":
                lg = sm.log_gate(idx, L, dr.x, dr.tokens)
                G = np.cumsum(lg, axis=-1)
                want = mod.bias_table(L, x, tokens, None).double()  # the log gates summed over up to L positions
                got = G[..., :, None] - G[..., None, :]
                assert np.abs(got - want.numpy()).max() <= float32_bound(L * _piece_depth(s), want)
                seen += 1
        qs = mod.query_scale(L, None)
        tau = sm.temperature(L)
        np.testing.assert_allclose(tau, np.ones((1, L)) if qs is None else qs[0].numpy(), rtol=1e-12)
    assert seen >= (3 if name == "kitchen" else 1)
    # every learned site of the module exists in the sampler under the same name with the same shapes
    assert {k: {n: v.shape for n, v in p.items()} for k, p in dr.weights.items()} == \
        {k: {n: v.shape for n, v in p.items()} for k, p in sm.weights.items()}


def test_sampled_curves_of_every_builtin():
    c = N.curves(pedsl.load(KITCHEN), lmax=32)
    assert c.method.startswith("sampled")
    assert c.transport[0] == pytest.approx(1.0) and np.all(np.abs(c.transport) <= 1 + 1e-9)
    assert np.all(c.bias[:, 0] == 0) and np.all(np.diff(c.bias, axis=1) < 0)  # log-sigmoid gates forget
    i = np.arange(33)
    want = np.clip(np.maximum(1, np.log(i + 1) / np.log(128))
                   * (1 + 0.01 * np.sqrt(i) + 0.002 * np.floor(i / 3) - 0.001 * np.ceil(i / 5)), 1, 1.3)
    np.testing.assert_allclose(c.temperature, want, rtol=1e-12)


@pytest.mark.parametrize("name", ["acc_random_qk", "acc_learned_qkv", "path", "acc_random_position"])
def test_sampled_curves_match_raw_scores(name):
    """The curves of the module's own draws equal the raw_scores reference on the same inputs."""
    s = load(name)
    lmax = 24
    mod = _module(s)
    inputs = _inputs(s, N.SAMPLES, lmax + N.STARTS)
    c = N.curves(s, lmax=lmax, draws=_draws(mod, *inputs, lmax + N.STARTS))
    assert c.method.startswith("sampled")
    ref = _reference(s, lmax, starts=N.STARTS, basis=name != "path", mod=mod, inputs=inputs)
    # raw_scores in float32: lmax + STARTS steps composed, each step's piece within its chain, then the
    # score's D channels; the sampler's curves in float64
    import torch

    n = (lmax + N.STARTS) * _piece_depth(s) + s.head_dim
    assert np.abs(c.transport - ref).max() <= float32_bound(n, torch.from_numpy(ref))


@pytest.mark.parametrize("name", ["acc_learned_qk", "path", "fox"])
def test_fresh_draws_follow_the_modules_initialisation(name):
    """Without loaded draws the sampler uses its own generator: a different sample of the same
    initial distribution, so its curves stay close to the module's (and are exactly reproducible)."""
    s = load(name)
    lmax = 24
    mod = _module(s)
    inputs = _inputs(s, N.SAMPLES, lmax + N.STARTS)
    own = N.curves(s, lmax=lmax, draws=_draws(mod, *inputs, lmax + N.STARTS))
    fresh = N.curves(s, lmax=lmax)
    assert not np.array_equal(own.transport, fresh.transport) or not np.array_equal(own.bias, fresh.bias)
    assert N.largest(N.compare(own, fresh)).max_abs < 0.1 * max(1.0, np.abs(own.bias).max())
    from pedsl.diffing.sample import Sampler

    dr = _draws(mod, *inputs, lmax + N.STARTS)
    sm = Sampler(s, d_model=s.heads * s.head_dim)
    for t in s.transports:  # draw every site
        (sm.householder if t.kind == "accumulate_householder" else sm.step_angles)(t, lmax + N.STARTS, dr.x,
                                                                                  dr.tokens)
    for idx, b in enumerate(s.biases):
        sm.log_gate(idx, lmax + N.STARTS, dr.x, dr.tokens)
    for site, params in dr.weights.items():
        for k, v in params.items():
            mine = sm.weights[site][k]
            assert mine.shape == v.shape, (site, k)
            if v.size >= 256:  # same spread and shape (uniform: kurtosis 1.8, normal: 3) as torch's draws
                assert mine.std() == pytest.approx(v.std(), rel=0.15), (site, k)
                assert _kurtosis(mine) == pytest.approx(_kurtosis(v), abs=0.4), (site, k)
            else:
                np.testing.assert_array_equal(mine, v)  # biases: the constant init_bias


def _kurtosis(a: np.ndarray) -> float:
    z = (a - a.mean()) / a.std()
    return float((z ** 4).mean())


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


def test_both_array_backends_run_every_builtin_record_alike():
    import torch

    from pedsl.runtime.torch_backend import Evaluator
    from pedsl.runtime.numpy_backend import NumpyEvaluator
    from pedsl.lang.builtin_defs import RECORDS

    x = np.linspace(0.05, 30.0, 301)
    for name, spec in RECORDS.items():
        if spec.run is None:  # static: folded in float64 before either backend runs
            continue
        for v in (x, -x) if name not in ("log", "sqrt") and not spec.inputs else (x,):
            static = {p: kind(128) for p, kind in spec.static}
            arrays = len(spec.inputs) + len(spec.params) - len(static)
            args = [v, *(v[::-1] * k for k in range(1, arrays))]  # hi - lo is never 0
            want = spec.run(Evaluator.ops, *map(torch.from_numpy, args), **static).numpy()
            got = spec.run(NumpyEvaluator.ops, *args, **static)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=name)


def test_a_rotation_with_learned_frequencies_is_sampled_by_its_phase():
    """rope_mixed rotates by a learned phase (no static table): its curve is the mean cos of its phase
    differences at initialisation, 1 at distance 0 and below 1 once the pairs turn; it used to be read as
    accumulated steps and end in an internal error."""
    c = N.curves(load("rope_mixed"))
    assert c.transport[0] == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.abs(c.transport) <= 1.0 + 1e-12) and c.transport[1:].min() < 0.9
