"""Score-dependent positions: ``contextual = cope(max_pos = N, shared = BOOL)``, checked.

CoPE (Golovneva et al. 2024, "Contextual Position Encoding"): query i counts the keys between key j and
itself by gates on its own logits, ``p(i, j) = sum over the visible keys t, j <= t <= i, of
sigmoid(s(i, t))``, clamps the count to ``max_pos - 1`` and adds ``q_i . e[p(i, j)]`` to the logit, e a
learned ``(max_pos, head_dim)`` table (shared by every head, as the paper and x-transformers, or one per
head with ``shared = false``) read between its integer rows by linear interpolation. What it means with
masks, documents and decoding: docs/semantics.md §1c.
"""

from __future__ import annotations

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.scheme import ContextualPositions
from pedsl.lang.stage import ResolverStage
from pedsl.lang.values import DYNAMIC, StaticEnv
from pedsl.limits import MAX_COPE_POSITIONS

CONTEXTUAL_KINDS = ("cope",)
COPE_OPTIONS = ("max_pos", "shared")
_HINT = ("contextual = cope(max_pos = 16): CoPE's gated counts p(i, j) = sum_{t = j..i} sigmoid(s(i, t)), "
         "clamped to max_pos - 1, and a learned embedding per position added as q_i . e[p(i, j)]; "
         "shared = false gives every head its own embedding")


class ContextualResolution(ResolverStage):
    """The Resolver's stage for the ``contextual`` statement."""

    def resolve_contextual(self, env: StaticEnv, lets, transports, sink) -> ContextualPositions | None:
        """The contextual positions of the merged scheme, None when absent or after reporting (E241)."""
        located = self.m.contextual
        value = self.given_value(located)
        if located is None or value is None:
            return None
        if value.kind != "call" or value.func not in CONTEXTUAL_KINDS:
            name = value.func if value.kind == "call" else (value.id if value.kind == "name" else None)
            near = did_you_mean(name, CONTEXTUAL_KINDS) if name else None
            self.report("E241", f"contextual takes cope(max_pos = N), not {to_source(value)}"
                        + (f"; {near}" if near else ""), value, hint=_HINT)
            return None
        options = self._cope_options(value, env, lets)
        if options is None:
            return None
        if sink is not None or any(t.kind == "accumulate_householder" for t in transports):
            what = f"sink = {sink}" if sink is not None else "accumulate(householder(...))"
            self.report("E241", f"contextual = cope(...) cannot go with {what}: "
                        + ("a sink has no position to count from" if sink is not None else
                           "PaTH's blockwise kernel and decode rule do not see the scores CoPE's gates read"),
                        located.stmt, hint="drop one of the two")
            return None
        return ContextualPositions(kind="cope", **options)

    def _cope_options(self, call: ast.Call, env: StaticEnv, lets) -> dict | None:
        got = self.named_options(call, COPE_OPTIONS, "E241", "cope(max_pos = N, shared = true)", _HINT, env, lets)
        if got is None:
            return None
        if "max_pos" not in got:
            self.report("E241", "cope needs max_pos: how many contextual positions its embedding has", call,
                        hint=_HINT)
            return None
        n, node = got["max_pos"]
        if folded_int(n) is None or not 1 <= n <= MAX_COPE_POSITIONS:
            self.report("E241", f"cope(max_pos = ...) is an integer from 1 to {MAX_COPE_POSITIONS:,} known "
                        f"when the scheme is checked, got {n!r}", node,
                        hint="counts past max_pos - 1 are clamped there; the paper uses 64, x-transformers 16")
            return None
        shared, snode = got.get("shared", (True, None))
        if not isinstance(shared, bool):
            self.report("E241", f"cope(shared = ...) takes true (one embedding for every head) or false (one per "
                        f"head), not {shared!r}", snode, hint=_HINT)
            return None
        return {"max_pos": n, "shared": shared}


def folded_int(value) -> int | None:
    """``value`` when it is an int (not a bool, not dynamic), else None."""
    if value is DYNAMIC or isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
