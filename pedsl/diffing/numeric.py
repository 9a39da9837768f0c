"""Score kernels vs distance on the same inputs: the numbers behind ``pedsl diff --numeric``.

Three curves per scheme, over distance ``d = i - j = 0 .. Lmax`` (and query position for tau):

- **transport**: ``c(d) = E_u <u, T(i-d -> i) u>`` for u uniform on the unit sphere, averaged
  over i (and the data) - the logit contribution (before 1/sqrt(D), temperature and bias) of a
  key whose content equals the query's, d tokens back; equivalently ``tr T / D``. Rotations
  use the exact expectation (each channel carries energy 1/D): RoPE gives
  ``(2/D) sum_k cos(w_k d) + (plain channels)/D``, so the pairing layout, a channel
  permutation, does not change it; Householder steps (not rotations) use the Hutchinson
  estimate with seeded random unit vectors within their channel group. NoPE stays at 1; accumulated random steps decay
  towards 0 as their pairs mix.
- **bias[h]**: ``b(i, i - d)`` per head, averaged over i (and the data).
- **temperature**: ``tau(i)`` at query position i.

Static schemes (rotations with fixed tables, static biases and temperatures) are computed
exactly in float64. Data-dependent ones (steps, gates or temperatures that read the tokens,
the hidden state or learned parameters) are sampled at initialisation by
:mod:`pedsl.diffing.sample`, which evaluates the scheme's expressions as the compiled module
does; ``x``, ``tokens``, learned parameters (per call site) and the unit vectors are drawn
from the same seed for both schemes, so equal schemes give exactly equal curves and a part
the two schemes share gives equal curves too. A sampled curve is one draw, so
:func:`seed_noise` measures how much a second seed moves it. Everything is numpy:
``import torch`` alone would take most of the two seconds a diff may use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pedsl.errors import CompileError
from pedsl.formulas import xpos_decays
from pedsl.runtime.numpy_backend import Ctx, NumpyEvaluator

from pedsl.fsio import write_figure
from pedsl.lang.values import StaticEnv
from pedsl.lang.scheme import RotateTransport, Scheme
from pedsl.lang.frequencies import frequencies
from pedsl.lang import ast
from pedsl.lang.fold import fold_expr
from pedsl.lang.values import EvalIssue, Vec
from pedsl.lang.exprs import transform
from pedsl.diffing.facts import temperature_at
from pedsl.lang.frequencies import rotary_frequencies

LMAX = 256
SAMPLES = 8
SEED = 0


@dataclass
class Curves:
    transport: np.ndarray  # (Lmax + 1,)
    bias: np.ndarray  # (H, Lmax + 1)
    temperature: np.ndarray  # (Lmax + 1,) over query positions
    method: str


def unit_vectors(heads: int, head_dim: int, samples: int = SAMPLES, seed: int = SEED) -> np.ndarray:
    u = np.random.default_rng(seed).standard_normal((samples, heads, head_dim))
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _group_freqs(s: Scheme, t, L: int, static: dict) -> tuple[float, ...] | None:
    """|frequency| per pair of a fixed rotation table (a rotation, or constant steps) at run length L."""
    if t.kind == "rotate" and t.dynamic:
        env = StaticEnv(values={**s.params, "heads": s.heads, "head_dim": s.head_dim}, n=L)
        f = frequencies(t.phase, env, len(s.group(t.group).channels) // 2)
    else:
        f = static.get(t.group)
    return None if f is None else tuple(abs(x) for x in f)


def _distance_bias(s: Scheme, b, lmax: int) -> np.ndarray | None:
    """b(d) per head of one static distance bias, (H, lmax + 1) float64; None if it is not static."""
    env = StaticEnv(values={**s.params, "heads": s.heads, "head_dim": s.head_dim})
    out = np.zeros((s.heads, lmax + 1))

    def per_head(v) -> np.ndarray:
        return np.array(v.values if isinstance(v, Vec) else [float(v)] * s.heads, dtype=np.float64)

    try:
        if b.slope is not None:
            return per_head(fold_expr(b.slope, env))[:, None] * np.arange(lmax + 1, dtype=np.float64)[None, :]
        for i in range(lmax + 1):
            def at_distance(n: ast.Expr, i: int = i) -> ast.Expr | None:  # distance.AXIS: text, every axis at i - j
                return ast.Num(value=i) if n.kind == "name" and n.id.partition(".")[0] == "distance" else None

            out[:, i] = per_head(fold_expr(transform(b.term, at_distance), env))
    except (EvalIssue, TypeError, ValueError, AttributeError):
        return None
    return out


def _static_temperature(s: Scheme, lmax: int) -> np.ndarray | None:
    vals = temperature_at(s, list(range(lmax + 1)))
    if any(v is None for _, v in vals):
        return None
    return np.array([np.mean(v) if isinstance(v, tuple) else v for _, v in vals], dtype=np.float64)


@dataclass
class Draws:
    """Fixed inputs for the sampled curves instead of fresh draws from the seed (the tests load a
    compiled module's parameters and frozen tables here, with its x and tokens)."""

    x: np.ndarray | None = None  # (samples, Lmax + STARTS, H * D)
    tokens: np.ndarray | None = None  # (samples, Lmax + STARTS)
    weights: dict | None = None  # learned site -> {state_dict name: array}
    tables: dict | None = None  # frozen_random key -> array


STARTS = 8  # key positions j = 0 .. STARTS-1 per sample for data-dependent transports


def curves(s: Scheme, *, lmax: int = LMAX, samples: int = SAMPLES, seed: int = SEED,
           draws: Draws | None = None) -> Curves:
    """The three curves of one scheme: exact float64 tables when everything is static, else
    sampled at initialisation (:mod:`pedsl.diffing.sample`); numpy only, no torch."""
    L = lmax + 1
    static = rotary_frequencies(s)
    freqs = {t.group: _group_freqs(s, t, L, static) for t in s.transports}
    biases = [_distance_bias(s, b, lmax) if b.kind == "distance" else None for b in s.biases]
    tau = _static_temperature(s, lmax)
    if s.remap is not None and any(f is None for f in freqs.values()):
        raise CompileError(f"scheme '{s.name}' remaps the positions of a rotation whose phase is not a fixed "
                           "frequency times the position: its curves are not sampled", code="E400",
                           hint="pedsl diff without --numeric compares it as written")
    if any(f is None for f in freqs.values()) or any(b is None for b in biases) or tau is None:
        return _sampled_curves(s, freqs, biases, tau, lmax=lmax, samples=samples, seed=seed, draws=draws or Draws())
    bias = sum((b for b in biases if b is not None), np.zeros((s.heads, L)))  # every one is, here
    return Curves(transport=_rotation_part(s, freqs, L), bias=bias, temperature=tau,
                  method="static tables (float64, numpy)")


def _regime_angles(s: Scheme, L: int) -> np.ndarray:
    """Remapped positions (docs/semantics.md §2d): ``rel[i, d] = query_r(i) - key_r(i - d)`` for the regime r
    of the pair (i, i - d) (its distance d, or its chunk difference with ``remap(chunk = c)``), at positions
    0..L-1 (NaN where i < d): the position difference a fixed-frequency pair turns by."""
    ev = NumpyEvaluator(d_model=1, vocab_size=1, seed=0, weights={}, tables={})
    ctx = Ctx(values={**s.params, "heads": s.heads, "head_dim": s.head_dim}, heads=s.heads, L=L)
    i = np.arange(L)[:, None]
    d = np.arange(L)[None, :]
    j = i - d
    assert s.remap is not None  # the caller's: a remapped scheme
    c = s.remap.chunk
    measure = d if c is None else i // c - np.where(j >= 0, j, 0) // c
    rel = np.full((L, L), np.nan)
    assert s.remap is not None  # read for a scheme that remaps only
    for n, r in enumerate(s.remap.regimes):
        q, k = (np.broadcast_to(ev.run(e, ctx, f"remap[{n}]").align(("pos",)), (L,)) for e in (r.query, r.key))
        inside = (j >= 0) & (measure >= r.low) & (True if r.high is None else measure < r.high)
        rel = np.where(inside, q[i] - k[np.where(j >= 0, j, 0)], rel)
    return rel


def _rotation_part(s: Scheme, freqs: dict, L: int) -> np.ndarray:
    """E_u <u, T(j -> j + d) u> over the groups with fixed tables, plus the untouched channels
    (each pair carries energy 2 / D: (2 / D) cos(w d) per pair; pairing layout does not matter)."""
    D = s.head_dim
    d = np.arange(L, dtype=np.float64)
    c = np.zeros(L)
    moved: set[int] = set()
    for t in s.transports:
        moved |= set(s.group(t.group).channels)
        if freqs[t.group] is not None:
            gain = getattr(t, "scale", 1.0) ** 2  # rotate(..., scale = m): q and k of the group times m
            ws = freqs[t.group]
            gamma, zeta = (t.xpos_gamma, t.xpos_zeta) if isinstance(t, RotateTransport) else (None, None)
            decays = [1.0] * len(ws) if gamma is None or zeta is None else xpos_decays(zeta, len(ws))
            rel = None if s.remap is None else _regime_angles(s, L)
            for w, z in zip(ws, decays):  # xpos: pair k also decays as zeta_k^(d / gamma)
                fall = 1.0 if z == 1.0 or gamma is None else z ** (d / gamma)
                if rel is not None:  # remapped: averaged over the queries i >= d of 0..L-1
                    c += gain * (2.0 / D) * np.nanmean(np.cos(np.remainder(w * rel, 2 * math.pi)), axis=0)
                    continue
                c += gain * (2.0 / D) * fall * np.cos(np.remainder(w * d, 2 * math.pi))
    return c + (D - len(moved)) / D


def _sampled_curves(s: Scheme, freqs: dict, biases: list, tau, *, lmax: int, samples: int, seed: int,
                    draws: Draws) -> Curves:
    """Data-dependent schemes at initialisation, on a sequence of length Lmax + STARTS.

    c(d) averages <u, T(j -> j + d) u> over samples, heads and the first STARTS key
    positions j, so every distance has the same number of terms. Groups act on disjoint
    channels, so c is a sum over groups: fixed tables give their exact expectation; SO(2)
    steps give sum_k (2 / D) cos(A(j+d, k) - A(j, k)) from the cumulative angles;
    Householder groups move each seeded unit key through the steps, H_i ... H_(j+1) u,
    O(L D) per key. A gate bias is G(j + d) - G(j) with G the cumulative log gate.
    """
    from pedsl.diffing.dense_curve import dense_transport_part
    from pedsl.diffing.sample import Sampler  # on use: networkx only for the curves that sample

    L = lmax + STARTS
    H, D = s.heads, s.head_dim
    rng = np.random.default_rng(seed)
    x = draws.x if draws.x is not None else rng.standard_normal((samples, L, H * D)) if s.needs_x else None
    tokens = draws.tokens if draws.tokens is not None else rng.integers(0, 256, (samples, L)) if s.needs_tokens \
        else None
    sm = Sampler(s, d_model=H * D, seed=seed, weights=draws.weights, tables=draws.tables)
    c = _rotation_part(s, freqs, lmax + 1)
    for t in s.transports:
        if freqs[t.group] is not None:
            continue
        if t.kind == "dense_rotation":  # its learned generators at their start
            c += dense_transport_part(t, len(s.group(t.group).channels), H, D, lmax, seed)
            continue
        if t.kind == "accumulate_householder":
            c += _householder_part(s, sm, t, L, lmax, x, tokens, unit_vectors(H, D, samples, seed))
            continue
        # the angle at each position: a rotation's own phase, or the running sum of accumulated steps
        A = sm.phases(t, L, x, tokens) if t.kind == "rotate" else np.cumsum(sm.step_angles(t, L, x, tokens), axis=-2)
        for j in range(STARTS):
            dA = A[:, :, j: j + lmax + 1] - A[:, :, j: j + 1]
            c += (2.0 / D) * np.cos(dA).sum(-1).mean(axis=(0, 1)) / STARTS
    bias = np.zeros((H, lmax + 1))
    for idx, b in enumerate(biases):
        if b is not None:
            bias += b
            continue
        if s.biases[idx].kind == "distance":  # learned (a table, an MLP, learned values): at its start
            bias += sm.distance_bias(idx, lmax)
            continue
        G = np.cumsum(sm.log_gate(idx, L, x, tokens), axis=-1)  # (B|1, H, L)
        for j in range(STARTS):
            bias += (G[:, :, j: j + lmax + 1] - G[:, :, j: j + 1]).mean(axis=0) / STARTS
    if tau is None:
        tau = sm.temperature(lmax + 1).mean(axis=0)
    return Curves(transport=c, bias=bias, temperature=np.asarray(tau, dtype=np.float64),
                  method=f"sampled at initialisation (numpy float64; {samples} samples x {STARTS} key positions, "
                         f"seed {seed})")


def _householder_part(s: Scheme, sm, t, L: int, lmax: int, x, tokens, u: np.ndarray) -> np.ndarray:
    """(Dg / D) mean over j < STARTS of <u_g, H_(j+d) ... H_(j+1) u_g> for unit vectors u_g in the group's
    Dg channels (the Hutchinson estimate of the group's share of tr T / D; exact at d = 0)."""
    S, H, _ = u.shape
    ch = list(s.group(t.group).channels)
    w, beta = sm.householder(t, L, x, tokens)  # (B|1, H, L, Dg), (B|1, H, L)
    ug = u[..., ch]  # (S, H, Dg): unit vectors within the group, which carries energy Dg / D of a unit u
    ug = ug / np.linalg.norm(ug, axis=-1, keepdims=True)
    V = np.repeat(ug[:, :, None, :], STARTS, axis=2)  # P(j -> i) u for keys j < STARTS
    js = np.arange(STARTS)
    c = np.zeros(lmax + 1)
    for i in range(L):
        if i > 0:  # apply H_i to the keys that started before i
            wi, bi = w[:, :, i, None, :], beta[:, :, i, None, None]  # (B|1, H, 1, Dg), (B|1, H, 1, 1)
            upd = V - bi * (V * wi).sum(-1, keepdims=True) * wi
            V = np.where((js < i)[None, None, :, None], upd, V)
        dist = i - js
        ok = (dist >= 0) & (dist <= lmax)
        sc = (ug[:, :, None, :] * V).sum(-1).mean(axis=(0, 1))  # (J,)
        np.add.at(c, dist[ok], sc[ok])
    return c * len(ch) / (s.head_dim * STARTS)


@dataclass
class CurveDiff:
    curve: str  # transport | bias[h] | temperature
    max_abs: float
    at: int  # distance (or query position for temperature)
    a: float
    b: float


def compare(ca: Curves, cb: Curves) -> list[CurveDiff]:
    """Largest |A - B| per curve, and where; missing heads compare against a zero bias."""
    rows = [_cmp("transport", ca.transport, cb.transport)]
    H = max(ca.bias.shape[0], cb.bias.shape[0])
    L = min(ca.bias.shape[1], cb.bias.shape[1])
    for h in range(H):
        a = ca.bias[h, :L] if h < ca.bias.shape[0] else np.zeros(L)
        b = cb.bias[h, :L] if h < cb.bias.shape[0] else np.zeros(L)
        rows.append(_cmp(f"bias[head {h}]", a, b))
    rows.append(_cmp("temperature", ca.temperature, cb.temperature))
    return rows


def _cmp(name: str, a: np.ndarray, b: np.ndarray) -> CurveDiff:
    n = min(len(a), len(b))
    diff = np.abs(a[:n] - b[:n])
    i = int(np.argmax(diff)) if n else 0
    return CurveDiff(name, float(diff[i]) if n else 0.0, i, float(a[i]), float(b[i]))


def seed_noise(sides: list[tuple[Scheme, Curves]], *, lmax: int, samples: int, seed: int) -> dict[str, float] | None:
    """Per curve, the largest difference between two seeds of the same scheme (over the sampled
    sides): a data-dependent scheme's curves are one draw of its initialisation, and a difference
    between A and B below this is not evidence of a change. None when both sides are exact."""
    noise: dict[str, float] = {}
    for s, c in sides:
        if not c.method.startswith("sampled"):
            continue
        for r in compare(c, curves(s, lmax=lmax, samples=samples, seed=seed + 1)):
            noise[r.curve] = max(noise.get(r.curve, 0.0), r.max_abs)
    return noise or None


def largest(rows: list[CurveDiff]) -> CurveDiff:
    return max(rows, key=lambda r: r.max_abs)


def plot(ca: Curves, cb: Curves, path: str, labels: tuple[str, str]) -> None:
    """Both schemes' curves: transport correlation, bias per head and temperature (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    d = np.arange(len(ca.transport))
    ax = axes[0]
    ax.plot(d, ca.transport, label=labels[0])
    ax.plot(np.arange(len(cb.transport)), cb.transport, "--", label=labels[1])
    ax.set_xlabel("distance i - j (tokens)")
    ax.set_ylabel("mean <u, T(j->i) u>, unit u")
    ax.set_title("transport correlation vs distance")
    ax.legend()
    ax = axes[1]
    for h in range(ca.bias.shape[0]):
        ax.plot(d[: ca.bias.shape[1]], ca.bias[h], color=f"C{h % 10}", label=f"{labels[0]} head {h}")
    for h in range(cb.bias.shape[0]):
        ax.plot(np.arange(cb.bias.shape[1]), cb.bias[h], "--", color=f"C{h % 10}", label=f"{labels[1]} head {h}")
    ax.set_xlabel("distance i - j (tokens)")
    ax.set_ylabel("logit bias b(i, j)")
    ax.set_title("bias vs distance per head")
    ax.legend(fontsize="x-small", ncol=2)
    ax = axes[2]
    ax.plot(np.arange(len(ca.temperature)), ca.temperature, label=labels[0])
    ax.plot(np.arange(len(cb.temperature)), cb.temperature, "--", label=labels[1])
    ax.set_xlabel("query position i")
    ax.set_ylabel("temperature tau(i)")
    ax.set_title("temperature vs position")
    ax.legend()
    fig.tight_layout()
    try:
        write_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
