"""A scheme's data-dependent pieces at initialisation, in numpy float64 (for ``pedsl diff --numeric``).

The numeric diff of schemes whose steps, gates or temperature read the tokens, the hidden
state or learned parameters needs the step angles, Householder vectors and log gates that
the compiled module computes at initialisation. :class:`Sampler` evaluates them with the numpy
backend of the run-time walk (:mod:`pedsl.runtime.numpy_backend`), never importing torch.
Every site is named as the lowering plan names it (:mod:`pedsl.compiler.plan`), so weights
drawn from a module load under the same keys.
"""

from __future__ import annotations

import numpy as np

from pedsl.compiler import compile_plan
from pedsl.lang.scheme import DistanceBias, GateBias, Scheme
from pedsl.runtime.numpy_backend import NL, Ctx, NumpyEvaluator

class Sampler:
    """One scheme's run-time pieces at initialisation (numpy float64)."""

    def __init__(self, scheme: Scheme, *, d_model: int, vocab_size: int = 256, seed: int = 0,
                 weights: dict[str, dict[str, np.ndarray]] | None = None, tables: dict | None = None):
        self.scheme = scheme
        # the plan's site names (the reference backend's plan: it lowers every scheme)
        self.plan = compile_plan(scheme, backend="reference")
        self.heads = scheme.heads
        self.values = {**scheme.params, "heads": scheme.heads, "head_dim": scheme.head_dim}
        self.weights = dict(weights or {})
        self.tables = dict(tables or {})
        self.evaluator = NumpyEvaluator(d_model=d_model, vocab_size=vocab_size, seed=seed, weights=self.weights,
                                        tables=self.tables)

    def ctx(self, L: int, x=None, tokens=None, group: str | None = None) -> Ctx:
        chans = len(self.scheme.group(group).channels) if group is not None else None
        return Ctx(values=self.values, heads=self.heads, L=L, pairs=None if chans is None else chans // 2,
                   chans=chans, x=x, tokens=tokens, axes=self.scheme.axes)

    def run(self, e, site: str, ctx: Ctx) -> NL:
        return self.evaluator.run(e, ctx, site)

    def step_angles(self, t, L: int, x=None, tokens=None) -> np.ndarray:
        """Accumulated-rotation step angles a(t, k), (B|1, H|1, L, P)."""
        c = self.ctx(L, x, tokens, t.group)
        a = self.run(t.angle, self.plan.transport(t.group).site, c).align(("batch", "head", "pos", "pair"))
        return np.broadcast_to(a, a.shape[:2] + (L, c.pairs))

    def phases(self, t, L: int, x=None, tokens=None) -> np.ndarray:
        """A position-indexed rotation's phases theta(p, k) at positions 0..L-1, (B|1, H|1, L, P): its
        learned frequencies at their start values."""
        c = self.ctx(L, x, tokens, t.group)
        a = self.run(t.phase, self.plan.transport(t.group).site, c).align(("batch", "head", "pos", "pair"))
        return np.broadcast_to(a, a.shape[:2] + (L, c.pairs))

    def householder(self, t, L: int, x=None, tokens=None) -> tuple[np.ndarray, np.ndarray]:
        """Householder vectors w (B|1, H, L, Dg) on the group's channels and beta (B|1, H, L)."""
        c = self.ctx(L, x, tokens, t.group)
        w_site, beta_site = (s.name for s in self.plan.transport(t.group).sites)
        w = self.run(t.w, w_site, c).align(("batch", "head", "pos", "chan"))
        beta = self.run(t.beta, beta_site, c).align(("batch", "head", "pos"))
        B = max(w.shape[0], beta.shape[0])
        chans = len(self.scheme.group(t.group).channels)
        return (np.broadcast_to(w, (B, self.heads, L, chans)),
                np.broadcast_to(beta, (B, self.heads, L)))

    def log_gate(self, index: int, L: int, x=None, tokens=None) -> np.ndarray:
        """The per-step log gate of gate bias ``index``, (B|1, H, L)."""
        bias = self.scheme.biases[index]
        assert isinstance(bias, GateBias)  # callers pass the index of a gate bias
        g = self.run(bias.log_gate, self.plan.biases[index].site.name, self.ctx(L, x, tokens))
        a = g.align(("batch", "head", "pos"))
        return np.broadcast_to(a, (a.shape[0], self.heads, L))

    def distance_bias(self, index: int, lmax: int) -> np.ndarray:
        """Distance bias ``index`` (learned: a table, an MLP, learned values) at d = 0..lmax, (H, lmax + 1); one that
        reads the query position is b(i, i - d) averaged over the queries i >= d of 0..lmax."""
        L = lmax + 1
        bias = self.scheme.biases[index]
        assert isinstance(bias, DistanceBias)  # callers pass the index of a distance bias
        v = self.run(bias.term, self.plan.biases[index].site.name, self.ctx(L))
        if "pos" not in v.axes:
            return np.broadcast_to(v.align(("head", "dist")), (self.heads, L)).copy()
        tab = np.broadcast_to(v.align(("head", "pos", "dist")), (self.heads, L, L))
        return np.stack([tab[:, d:, d].mean(axis=-1) for d in range(L)], axis=-1)

    def temperature(self, L: int) -> np.ndarray:
        """tau at query positions 0..L-1, (H|1, L)."""
        if self.scheme.temperature is None:
            return np.ones((1, L))
        tau = self.run(self.scheme.temperature, self.plan.temperature.site.name, self.ctx(L)).align(("head", "pos"))
        return np.broadcast_to(tau, (tau.shape[0], L))
