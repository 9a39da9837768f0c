"""Remapped rotations: ``remap { REGIME ... }``, checked.

A regime says which distances ``d = p_i - p_j`` it covers (``distance >= w``, ``distance < w``, two bounds
joined by a comma) and at which positions the rotation then turns the query and the key (``query = E``,
``key = E``, each a function of the token's own ``position``; one left out is ``position``). The regimes
must cover every distance 0, 1, 2, ... exactly once. ``remap(chunk = c) { chunks < 1; ... }`` bounds the
regimes by the chunk difference ``chunks = floor(p_i / c) - floor(p_j / c)`` instead (Dual Chunk Attention's intra,
successive and inter-chunk regimes), under the same rules. In each regime the rotated score is
``< R(phase(query(p_i))) q_i , R(phase(key(p_j))) k_j >``, so a remapped scheme costs one rotated score
block per regime and a select (docs/semantics.md §2d): ReRoPE, Leaky ReRoPE and Self-Extend are such
unions. Every message is E243.
"""

from __future__ import annotations

import math

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.exprs import inline_lets, names_in, to_source
from pedsl.lang.scheme import Regime, Remap
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.types import Dep
from pedsl.lang.values import DYNAMIC, StaticEnv

ENTRIES = ("query", "key")
_PAIRWISE = ("distance", "query_position", "n")  # names that are not a function of one token's position
_HINT = ("remap { distance < w; distance >= w: query = w, key = 0 } (ReRoPE): each regime covers the "
         "distances its bounds say and rotates q at `query` and k at `key`, functions of the token's position")


_CHUNK_HINT = ("remap(chunk = c) { chunks < 1; chunks >= 1, chunks < 2: query = ...; chunks >= 2: query = ... } "
               "(Dual Chunk Attention): each regime covers the chunk differences floor(p_i / c) - floor(p_j / c) "
               "its bounds say")


class RemapResolution(ResolverStage):
    """The Resolver's stage for the ``remap`` statement."""

    def resolve_remap(self, env: StaticEnv, lets, transports) -> Remap | None:
        """The merged scheme's regimes, None when absent or after reporting (E243)."""
        loc = self.m.remap
        if loc is None:
            return None
        self._current = loc.src
        st = loc.stmt
        if not self._remappable(st, transports):
            return None
        chunk = self._chunk(st, env, lets)
        if chunk is FAILED:
            return None
        measure = "distance" if chunk is None else "chunks"
        got = [self._regime(r, env, lets, measure) for r in st.regimes]
        regimes = [r for r in got if r is not None]
        if len(regimes) < len(got):
            return None
        if not regimes:
            self.report("E243", "remap has no regime", st, hint=_HINT)
            return None
        if not self._partition(st, regimes, measure):
            return None
        return Remap(regimes=tuple(sorted(regimes, key=lambda r: r.low)), chunk=chunk)

    def _chunk(self, st: ast.RemapStmt, env: StaticEnv, lets):
        """``remap(chunk = c)``'s chunk length: None without one, FAILED after reporting."""
        e = st.chunk
        if e is None:
            return None
        if e.name != "chunk":
            self.report("E243", f"remap(...) takes the chunk length, remap(chunk = c), not '{e.name}'", e,
                        hint=_CHUNK_HINT)
            return FAILED
        v = self.fold_or_report(inline_lets(e.value, lets), env)
        if v is FAILED:
            return FAILED
        if v is DYNAMIC or isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.report("E243", f"remap's chunk length is an int >= 1 known when the scheme is checked, got "
                        f"chunk = {to_source(e.value)}", e.value, hint=_CHUNK_HINT)
            return FAILED
        return v

    def _remappable(self, st: ast.RemapStmt, transports) -> bool:
        """The scheme has a rotation by position that a remap can re-position (q and k only, one axis)."""
        why = None
        if not transports:
            why = "the scheme has no rotation to remap"
        elif any(t.kind != "rotate" for t in transports):
            why = ("an accumulated transport (rotation steps or PaTH's Householder steps) is a product over the "
                   "tokens between i and j, not a rotation at two positions: the regimes have no meaning for it")
        elif any(t.xpos_gamma is not None for t in transports):
            why = "xPos's decay is not remapped (its scale reads the true positions)"
        elif any(t.targets == "qkv" for t in transports):
            why = "a rotation of the values (qkv) is not remapped: remap rotates queries and keys only"
        elif self.m.axes is not None and self.m.axes.stmt.names:
            why = "a scheme with several position axes is not remapped (a regime reads one distance)"
        elif any(t.phase_ty.learned or t.phase_ty.data or "head" in t.phase_ty.axes for t in transports):
            why = "the rotation's phase must be a function of the position (not learned, data or per head)"
        else:
            for name in ("contextual", "normalize"):
                other = getattr(self.m, name)
                if other is not None and to_source(other.stmt.value) not in ("none", "softmax"):
                    why = f"remap with {name} = {to_source(other.stmt.value)} is not lowered (softmax only)"
            mask = getattr(self.m, "mask", None)
            if mask is not None and to_source(mask.stmt.value) not in ("none", "causal"):
                why = (f"remap with mask = {to_source(mask.stmt.value)}: a regime is a range of distances "
                       "p_i - p_j >= 0, so keys after the query have none")
        if why is not None:
            self.report("E243", f"remap: {why}", st, hint=_HINT)
        return why is None

    def _regime(self, r: ast.Regime, env: StaticEnv, lets, measure: str) -> Regime | None:
        low, high = 0, None
        for b in r.bounds:
            if b.name != measure:
                what = "the distance" if measure == "distance" else "the chunk difference (chunks, in remap(chunk = c))"
                self.report("E243", f"a regime is bounded by {what} ({measure} {b.op} ...), not by "
                            f"'{b.name}'", b, hint=_HINT if measure == "distance" else _CHUNK_HINT)
                return None
            v = self.fold_or_report(inline_lets(b.value, lets), env)
            if v is FAILED:
                return None
            if v is DYNAMIC or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or b.op == "!=":
                self.report("E243", f"a regime's bound is {measure} <, <=, > or >= a number known when the scheme "
                            f"is checked, got {measure} {b.op} {to_source(b.value)}", b, hint=_HINT)
                return None
            lo, hi = {">=": (math.ceil(v), None), ">": (math.floor(v) + 1, None),
                      "<": (None, math.ceil(v)), "<=": (None, math.floor(v) + 1)}[b.op]
            low = low if lo is None else max(low, lo)
            high = hi if high is None else (high if hi is None else min(high, hi))
        bounds = ", ".join(f"{measure} {b.op} {to_source(b.value)}" for b in r.bounds)
        if high is not None and high <= low:
            self.report("E243", f"the regime '{bounds}' covers no distance", r, hint=_HINT)
            return None
        got = {}
        for e in r.entries:
            if e.name not in ENTRIES or e.name in got:
                near = did_you_mean(e.name, ENTRIES) if e.name not in ENTRIES else None
                self.report("E243", f"a regime sets query = ... and key = ... once each, not '{e.name}'"
                            + (f"; {near}" if near else ""), e, hint=_HINT)
                return None
            value = self._per_token(e, lets)
            if value is None:
                return None
            got[e.name] = value
        own = ast.Name(id="position")
        return Regime(low=low, high=high, query=got.get("query", own), key=got.get("key", own), bounds=bounds)

    def _per_token(self, e: ast.RegimeEntry, lets):
        """The entry's value with lets inlined, or None after reporting: a number per token (position only)."""
        value = inline_lets(e.value, lets)
        t = self.checker().infer(e.value)
        if t is None:
            return None
        pairwise = names_in(value) & set(_PAIRWISE)
        if t.kind != "num" or not t.axes <= {"pos"} or not t.reads <= {Dep.POSITION} or pairwise:
            what = f"it reads {', '.join(sorted(pairwise))}" if pairwise else f"it is {t.show()}"
            self.report("E243", f"{e.name} = {to_source(e.value)} is not a position per token: {what}", e.value,
                        hint="a regime's positions are functions of each token's own position (position, "
                        "parameters, floor(...)): the pair's distance picks the regime")
            return None
        return value

    def _partition(self, st: ast.RemapStmt, regimes: list[Regime], measure: str) -> bool:
        """The regimes cover every distance (or chunk difference) 0, 1, 2, ... exactly once; reports the first
        overlap or gap."""
        nodes = {id(r): n for r, n in zip(regimes, st.regimes)}
        ordered = sorted(regimes, key=lambda r: r.low)
        end = 0  # the first distance no earlier regime covers
        prev: Regime | None = None
        for r in ordered:
            if prev is not None and (prev.high is None or r.low < end):
                self.report("E243", f"the regimes '{prev.bounds}' and '{r.bounds}' overlap ({measure} "
                            f"{max(r.low, 0)} is in both)", nodes[id(r)], hint=_HINT)
                return False
            if r.low > end:
                gap = f"{measure} {end}" if r.low == end + 1 else f"{measure} {end} to {r.low - 1}"
                self.report("E243", f"no regime covers {gap}", nodes[id(r)], hint=_HINT)
                return False
            prev = r
            end = end if r.high is None else r.high
        if prev is None or prev.high is not None:
            self.report("E243", f"no regime covers {measure} {end} and above", st, hint=_HINT)
            return False
        return True
