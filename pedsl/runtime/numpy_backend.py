"""The numpy float64 backend of the run-time walk (:class:`pedsl.runtime.walk.DynamicEvaluator`).

``pedsl diff --numeric`` evaluates a scheme's data-dependent pieces at initialisation with
numpy, never torch (``import torch`` alone takes 1.2-1.7 s on a laptop CPU):

- static sub-expressions fold through :func:`pedsl.lang.fold.fold_expr` (float64), as in
  the torch backend;
- the learned layers a source's call site asks for are drawn from the distributions the
  compiled module initialises them with - ``dense``: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
  weights (torch's ``nn.Linear`` default) with ``init_bias`` on the output layer; ``lookup``:
  ``N(0, std^2)``; ``causal_conv``: ``N(0, 0.1^2)`` taps plus 1 on the newest token; ``parameter``
  (``learned(init)``): ``init`` itself - each
  from its own generator seeded by (seed, site name), so a site that two schemes share gets
  the same weights in both and a diff isolates what changed;
- frozen tables come from numpy's generator seeded like the module's torch table: the same
  distribution, not the same numbers.

Site names, and the order a site's calls are numbered in, are the walk's, so a compiled module's
parameters and frozen tables can be loaded (``weights=``, ``tables=``) to reproduce it exactly:
that is how the tests check this backend against the torch one. Values are :class:`NL` arrays with
named axes in the canonical order ``batch, head, pos, dist, pair, chan``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from pedsl.errors import CompileError
from pedsl.lang.builtin_defs.arrays import numpy_ops
from pedsl.runtime.walk import DynamicEvaluator, permuted_shape
from pedsl.lang.values import Vec


@dataclass
class NL:
    """A numpy array whose dimensions are the named axes it varies along (canonical order)."""

    t: np.ndarray
    axes: tuple[str, ...]

    def align(self, axes: tuple[str, ...]) -> np.ndarray:
        """View with a dimension (size 1 where absent) for every axis in ``axes``."""
        perm, shape = permuted_shape(self.axes, self.t.shape, axes)
        return np.transpose(self.t, perm).reshape(shape)


@dataclass
class Ctx:
    values: dict
    heads: int
    L: int
    pairs: int | None = None
    chans: int | None = None
    x: np.ndarray | None = None  # (B, L, d_model)
    tokens: np.ndarray | None = None  # (B, L) integers
    n: int | None = None


class NumpyEvaluator(DynamicEvaluator):
    """The run-time walk with numpy float64 operations; learned sites are drawn at first use."""

    def __init__(self, *, d_model: int, vocab_size: int, seed: int, weights: dict, tables: dict):
        self.d_model, self.vocab_size, self.seed = d_model, vocab_size, seed
        self.weights = weights  # site -> {state_dict name: array}
        self.tables = tables  # frozen_random key -> array

    def constant(self, value, ctx: Ctx) -> NL:
        if isinstance(value, Vec):
            return NL(np.array(value.values, dtype=np.float64), (value.axis,))
        return NL(np.array(float(value)), ())

    def arange(self, ctx: Ctx, axis: str) -> NL:
        return NL(np.arange(ctx.L, dtype=np.float64), (axis,))

    ops = numpy_ops()

    def wrap(self, t: np.ndarray, axes: tuple[str, ...]) -> NL:
        return NL(t, axes)

    def aligned(self, values: list[NL], axes: tuple[str, ...]) -> list[np.ndarray]:
        return [v.align(axes) for v in values]

    # ------------------------------------------------------------------ frozen tables and learned sites
    def frozen(self, key: tuple, shape: tuple[int, int], seed: tuple[int, ...]) -> np.ndarray:
        if key not in self.tables:
            self.tables[key] = np.random.default_rng(seed[0] if len(seed) == 1 else list(seed)).standard_normal(shape)
        return self.tables[key]

    def _site_weights(self, site: str, make) -> dict[str, np.ndarray]:
        if site not in self.weights:  # one generator per (seed, site): shared sites draw alike
            self.weights[site] = make(np.random.default_rng([self.seed, zlib.crc32(site.encode())]))
        return self.weights[site]

    def lookup(self, site: str, tokens: np.ndarray, n_out: int, std: float) -> np.ndarray:
        return self._site_weights(site, lambda g: {"weight": std * g.standard_normal((self.vocab_size, n_out))})[
            "weight"][tokens]

    def dense(self, site: str, n_out: int, rank: int, init_bias: float, ctx: Ctx) -> np.ndarray:
        d = self.d_model

        def make(g):  # torch nn.Linear's default: U(+-1/sqrt(fan_in)) weights; the bias is init_bias
            if rank > 0:
                return {"0.weight": g.uniform(-1, 1, (rank, d)) / math.sqrt(d),
                        "1.weight": g.uniform(-1, 1, (n_out, rank)) / math.sqrt(rank),
                        "1.bias": np.full(n_out, init_bias)}
            return {"weight": g.uniform(-1, 1, (n_out, d)) / math.sqrt(d), "bias": np.full(n_out, init_bias)}

        p = self._site_weights(site, make)
        if ctx.x is None:
            raise CompileError("this scheme reads the hidden state: pass x=(B, L, d_model)")
        if "0.weight" in p:
            return (ctx.x @ p["0.weight"].T) @ p["1.weight"].T + p["1.bias"]
        return ctx.x @ p["weight"].T + p["bias"]

    def parameter(self, site: str, start: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        p = self._site_weights(site, lambda g: {"value": np.broadcast_to(start, shape).astype(np.float64)})
        return np.asarray(p["value"], dtype=np.float64).reshape(shape)

    def causal_conv(self, site: str, flat: np.ndarray, width: int, ctx: Ctx) -> np.ndarray:
        def make(g):  # near the identity: the newest token dominates
            w = 0.1 * g.standard_normal((flat.shape[1], 1, width))
            w[..., -1] += 1.0
            return {"weight": w}

        w = self._site_weights(site, make)["weight"][:, 0, :]  # (feats, width)
        L = flat.shape[-1]
        out = np.zeros_like(flat)
        for k in range(width):  # causal: out[t] = sum_k w[k] x[t + k - (width - 1)]
            s = width - 1 - k
            out[..., s:] += w[None, :, k, None] * flat[..., : L - s]
        return out
