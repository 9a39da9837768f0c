"""Score kernels vs distance on the same inputs: the numbers behind ``pedsl diff --numeric``.

Three curves per scheme, over distance ``d = i - j = 0 .. Lmax`` (and query position for tau):

- **transport**: ``c(d) = E_u <u, T(i-d -> i) u>`` for u uniform on the unit sphere, averaged
  over i (and the data) - the logit contribution (before 1/sqrt(D), temperature and bias) of a
  key whose content equals the query's, d tokens back; equivalently ``tr T / D``. Rotations
  use the exact expectation (each channel carries energy 1/D): RoPE gives
  ``(2/D) sum_k cos(w_k d) + (plain channels)/D``, so the pairing layout, a channel
  permutation, does not change it; Householder steps (not rotations) use the Hutchinson
  estimate with seeded random unit vectors. NoPE stays at 1; accumulated random steps decay
  towards 0 as their pairs mix.
- **bias[h]**: ``b(i, i - d)`` per head, averaged over i (and the data).
- **temperature**: ``tau(i)`` at query position i.

Static schemes (rotations with fixed tables, static biases and temperatures) are computed
in float64 with numpy (no torch: ``pedsl diff --numeric`` stays fast); data-dependent ones
through the compiled module (its step angles, Householder vectors, bias table and q scale),
with learned parameters, ``x``, ``tokens`` and the unit vectors drawn from the same seed for
both schemes, so equal schemes give exactly equal curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pedsl.lang.evaluate import StaticEnv
from pedsl.lang.scheme import Scheme

LMAX = 256
SAMPLES = 8
SEED = 0


@dataclass
class Curves:
    transport: np.ndarray  # (Lmax + 1,)
    bias: np.ndarray  # (H, Lmax + 1)
    temperature: np.ndarray  # (Lmax + 1,) over query positions
    method: str
    notes: list[str] = field(default_factory=list)


def unit_vectors(heads: int, head_dim: int, samples: int = SAMPLES, seed: int = SEED) -> np.ndarray:
    u = np.random.default_rng(seed).standard_normal((samples, heads, head_dim))
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _pairs(channels: tuple[int, ...], layout: str) -> list[tuple[int, int]]:
    P = len(channels) // 2
    if layout == "interleaved":
        return [(channels[2 * k], channels[2 * k + 1]) for k in range(P)]
    return [(channels[k], channels[k + P]) for k in range(P)]


def _static_freqs(s: Scheme, L: int) -> dict[str, tuple[float, ...]] | None:
    """Per transported group, the per-pair frequency of a fixed rotation table at run length L.

    None when any transport is data-dependent.
    """
    from pedsl.lang.lint import frequencies, rotary_frequencies

    static = rotary_frequencies(s)
    out = {}
    for t in s.transports:
        pairs = len(s.group(t.group).channels) // 2
        if t.kind == "rotate" and t.dynamic:
            env = StaticEnv(values={**s.params, "heads": s.heads, "head_dim": s.head_dim}, n=L)
            f = frequencies(t.phase, env, pairs)
        else:
            f = static.get(t.group)
        if f is None:
            return None
        out[t.group] = tuple(abs(x) for x in f)
    return out


def _static_bias(s: Scheme, lmax: int) -> np.ndarray | None:
    from pedsl.lang import ast
    from pedsl.lang.evaluate import EvalIssue, Vec, evaluate
    from pedsl.lang.exprs import transform

    env = StaticEnv(values={**s.params, "heads": s.heads, "head_dim": s.head_dim})
    out = np.zeros((s.heads, lmax + 1))
    d = np.arange(lmax + 1, dtype=np.float64)
    for b in s.biases:
        if b.kind != "distance":
            return None
        try:
            if b.slope is not None:
                v = evaluate(b.slope, env)
                slope = np.array(v.values if isinstance(v, Vec) else [float(v)] * s.heads, dtype=np.float64)
                out += slope[:, None] * d[None, :]
                continue
            for i in range(lmax + 1):
                e = transform(b.term, lambda n, i=i: ast.Num(value=i)
                              if n.kind == "name" and n.id == "distance" else None)
                v = evaluate(e, env)
                out[:, i] += np.array(v.values if isinstance(v, Vec) else [float(v)] * s.heads, dtype=np.float64)
        except (EvalIssue, TypeError, ValueError, AttributeError):
            return None
    return out


def _static_temperature(s: Scheme, lmax: int) -> np.ndarray | None:
    from pedsl.diffing.facts import temperature_at

    vals = temperature_at(s, list(range(lmax + 1)))
    if any(v is None for _, v in vals):
        return None
    return np.array([np.mean(v) if isinstance(v, tuple) else v for _, v in vals], dtype=np.float64)


def curves(s: Scheme, *, lmax: int = LMAX, samples: int = SAMPLES, seed: int = SEED) -> Curves:
    """The three curves of one scheme (static float64 when possible, else the compiled module)."""
    L = lmax + 1
    freqs = _static_freqs(s, L)
    bias = _static_bias(s, lmax)
    tau = _static_temperature(s, lmax)
    if freqs is None or bias is None or tau is None:
        return _torch_curves(s, lmax=lmax, samples=samples, seed=seed)
    D = s.head_dim
    d = np.arange(L, dtype=np.float64)
    c = np.zeros(L)
    rotated: set[int] = set()
    for t in s.transports:
        ch = tuple(s.group(t.group).channels)
        for (a, b), w in zip(_pairs(ch, s.layout), freqs[t.group]):
            c += (2.0 / D) * np.cos(np.remainder(w * d, 2 * math.pi))
            rotated |= {a, b}
    plain = [i for i in range(s.head_dim) if i not in rotated]
    c += len(plain) / D
    return Curves(transport=c, bias=bias, temperature=tau, method="static tables (float64, numpy)")


STARTS = 8  # key positions j = 0 .. STARTS-1 per sample for data-dependent transports


def _torch_curves(s: Scheme, *, lmax: int, samples: int, seed: int) -> Curves:
    """Data-dependent schemes through the compiled module, on a sequence of length Lmax + STARTS.

    c(d) averages <u, T(j -> j + d) u> over samples, heads and the first STARTS key
    positions j, so every distance has the same number of terms. Groups act on disjoint
    channels, so c is a sum over groups: SO(2) groups give sum_k e_k cos(A(j+d, k) - A(j, k))
    from the module's (cumulative) angles; Householder groups move each key through the
    steps, H_i ... H_(j+1) u, O(L D) per key; untouched channels add their energy.
    Rotations use the exact expectation over u; Householder groups the seeded unit vectors.
    """
    import torch

    from pedsl.compiler import compile_scheme

    L = lmax + STARTS
    H, D = s.heads, s.head_dim
    d_model = H * D
    torch.manual_seed(seed)  # learned parameters: the same initialisation for both schemes
    mod = compile_scheme(s, backend="reference", d_model=d_model, requires_grad=False)
    mod.eval()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, L, d_model, generator=gen) if s.needs_x else None
    tokens = torch.randint(0, 256, (samples, L), generator=gen) if s.needs_tokens else None
    u = torch.from_numpy(unit_vectors(H, D, samples, seed))  # (S, H, D) float64, for Householder groups
    c = np.zeros(lmax + 1)
    covered: set[int] = set()
    f32 = torch.float32
    with torch.no_grad():
        for t in mod.transforms:
            ch = tuple(t["channels"])
            covered |= set(ch)
            if t["op"] == "accumulate_householder":
                c += _householder_part(mod, t, L, lmax, x, tokens, u)
                continue
            if t["op"] == "rotate":
                w = _static_freqs(s, L)
                if w is None or t["group"] not in w:  # pragma: no cover - rotate phases are static tables
                    raise ValueError("a rotation table that is not static")
                pos = torch.arange(L, dtype=torch.float64)[:, None]
                A = torch.tensor(w[t["group"]], dtype=torch.float64)[None, :] * pos
                A = A[None, None]  # (1, 1, L, P)
            else:
                A = torch.cumsum(mod.step_angles(t, L, x, tokens, None, f32).to(torch.float64), dim=-2)  # (B|1, H|1, L, P)
            for j in range(STARTS):  # E_u: every pair carries energy 2 / D
                dA = A[:, :, j : j + lmax + 1] - A[:, :, j : j + 1]  # (., ., Lmax+1, P)
                c += (2.0 / D) * torch.cos(dA).sum(-1).mean(dim=(0, 1)).numpy() / STARTS
        plain = [i for i in range(D) if i not in covered]
        if plain:
            c += len(plain) / D
        table = mod.bias_table(L, x, tokens, None)  # (S|1, H, L, L) or None
        qs = mod.query_scale(lmax + 1, None)  # (1, H|1, L) or None
    bias = np.zeros((H, lmax + 1))
    if table is not None:
        tb = table.to(torch.float64).expand(-1, H, L, L)
        for j in range(STARTS):
            rows = torch.arange(j, j + lmax + 1)
            bias += tb[:, :, rows, j].mean(dim=0).numpy()
        bias /= STARTS
    tau = np.ones(lmax + 1) if qs is None else qs.to(torch.float64).mean(dim=(0, 1)).numpy()
    return Curves(transport=c, bias=bias, temperature=tau,
                  method=f"compiled module (torch; {samples} samples x {STARTS} key positions, seed {seed})")


def _householder_part(mod, t: dict, L: int, lmax: int, x, tokens, u) -> np.ndarray:
    """sum over j < STARTS of <u_g, H_(j+d) ... H_(j+1) u_g> / STARTS on the group's channels g."""
    import torch

    S, H, D = u.shape
    ch = list(t["channels"])
    w_full, beta, _ = mod.householder_inputs(S, L, x, tokens, None, torch.float32)
    w = w_full[..., ch].to(torch.float64)  # (S, H, L, Dg)
    beta = beta.to(torch.float64)
    ug = u[..., ch]  # (S, H, Dg)
    V = ug[:, :, None, :].expand(S, H, STARTS, len(ch)).clone()  # P(j -> t) u for keys j < STARTS
    js = torch.arange(STARTS)
    c = np.zeros(lmax + 1)
    for i in range(L):
        if i > 0:  # apply H_i to the keys that started before i
            wi, bi = w[:, :, i], beta[:, :, i]  # (S, H, Dg), (S, H)
            upd = V - bi[..., None, None] * (V * wi[:, :, None]).sum(-1, keepdim=True) * wi[:, :, None]
            V = torch.where((js < i)[None, None, :, None], upd, V)
        dist = i - js
        ok = (dist >= 0) & (dist <= lmax)
        sc = (ug[:, :, None, :] * V).sum(-1).mean(dim=(0, 1))  # (J,)
        np.add.at(c, dist[ok].numpy(), sc[ok].numpy())
    return c / STARTS


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
    fig.savefig(path, dpi=100)
    plt.close(fig)
