"""The attention's mask: ``mask = causal | bidirectional | prefix(N) | spans``, checked.

``N`` is an integer >= 1 known when the scheme is checked (a literal, a param, arithmetic on them); ``none``
drops one inherited through ``extends`` (causal again). A mask other than ``causal`` makes some pairs with
the key after the query visible; the statements whose meaning is defined only for a key at or before its
query - accumulated transports (a product of the steps of tokens j+1..i), forget gates (a sum over them),
xPos (a decay that would grow without bound for j > i), stick-breaking (the nearest earlier key breaks the
stick first) and CoPE (gates counted from j to i) - are refused beside it (E244) rather than given a
meaning nobody wrote. What a mask means: docs/semantics.md §11a.
"""

from __future__ import annotations

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.exprs import inline_lets
from pedsl.lang.scheme import MASK_KINDS, AttentionMask
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.values import DYNAMIC, StaticEnv
from pedsl.limits import MAX_LENGTH

_HINT = ("write mask = causal (the default), mask = bidirectional (an encoder), mask = prefix(N) (a prefix-LM: "
         "the first N positions see each other) or mask = spans (run-time span_ids: tokens sharing a nonzero id "
         "see each other)")


class MaskResolution(ResolverStage):
    """The Resolver's stage for the mask statement."""

    def resolve_mask(self, env: StaticEnv, lets, transports) -> AttentionMask:
        """The merged scheme's mask (causal when absent or ``none``); reports a malformed one."""
        value = self.given_value(self.m.mask)
        if value is None:
            return AttentionMask()
        if value.kind == "name" and value.id in MASK_KINDS and value.id != "prefix":
            return AttentionMask(kind=value.id)
        if value.kind == "call" and value.func == "prefix":
            prefix = self._prefix_length(value, env, lets)
            return AttentionMask() if prefix is None else AttentionMask(kind="prefix", prefix=prefix)
        said = value.id if value.kind == "name" else value.func if value.kind == "call" else None
        near = did_you_mean(said, MASK_KINDS) if said else None
        what = f"'{said}'" if said else "this expression"
        self.report("E244", f"unknown mask {what}" + (f"; {near}" if near else ""), value, hint=_HINT)
        return AttentionMask()

    def _prefix_length(self, call: ast.Call, env: StaticEnv, lets) -> int | None:
        hint = "write prefix(256), or prefix(a param of type int): the number of leading positions"
        if len(call.args) != 1 or call.kwargs:
            self.report("E244", "prefix takes one argument, the number of leading positions that see each "
                        "other both ways", call, hint=hint)
            return None
        arg = call.args[0]
        folded = self.fold_or_report(inline_lets(arg, lets), env)
        if folded is FAILED:
            return None
        if folded is DYNAMIC or isinstance(folded, bool) or not isinstance(folded, int) \
                or not 1 <= folded <= MAX_LENGTH:
            self.report("E244", f"a prefix is an integer number of positions between 1 and {MAX_LENGTH:,} known "
                        f"when the scheme is checked, got {folded!r}", arg, hint=hint)
            return None
        return folded

    def check_mask_meaning(self, mask: AttentionMask | None, transports, biases, normalize: str, contextual) -> None:
        """A non-causal mask beside a statement defined only for keys at or before the query: refused."""
        if mask is None or mask.causal or self.m.mask is None:
            return
        why = []
        for t in transports:
            if t.kind not in ("rotate", "dense_rotation"):  # a dense rotation is absolute: R(p_i) q . R(p_j) k
                why.append(f"the accumulated transport on '{t.group}' (a product of the steps of tokens j+1..i)")
            elif t.kind == "rotate" and t.xpos_gamma is not None:
                why.append(f"xPos on '{t.group}' (its decay zeta^((i - j) / gamma) grows without bound for j > i)")
        if any(b.kind == "gate" for b in biases):
            why.append("the gate bias (a sum of the log gates of tokens j+1..i)")
        if normalize not in ("softmax", "differential"):  # differential: two softmaxes, defined both ways
            why.append("stick-breaking (the nearest earlier key breaks the stick first)")
        if contextual is not None:
            why.append("CoPE's contextual positions (gates counted from j to i)")
        self.check_past_only_buckets(mask, biases)
        if not why:
            return
        self._current = self.m.mask.src
        self.report("E244", f"mask = {mask.source()} lets a query see keys after it, but "
                    + "; ".join(why) + " has a meaning only for keys at or before the query",
                    self.m.mask.stmt, hint="keep mask = causal for this scheme, or use a transport and biases "
                    "defined both ways (RoPE rotations, distance biases, per-axis distances)")

    def check_past_only_buckets(self, mask: AttentionMask, biases) -> None:
        """``bucket(distance, bidirectional = true)`` beside a non-causal mask reads ``|i - j|``: every key after
        its query would land in the buckets of the past and the upper half (T5's encoder's buckets of later
        keys) would never be read - refused (E255) rather than passed off as T5's encoder."""
        if self.m.bias is None:
            return
        for b in biases:
            call = next((c for c in _calls(getattr(b, "term", None), "bucket") if self._past_only(c)), None)
            if call is None:
                continue
            self._current = self.m.bias.src
            self.report("E255", f"bucket(distance, bidirectional = true) under mask = {mask.source()} reads "
                        "|i - j|: keys after the query would take the buckets of the past, never the upper half "
                        "T5's encoder gives them", call,
                        hint="declare `axes t` and write bucket(distance.t, ..., bidirectional = true): a per-axis "
                             "distance is signed (the library's t5_encoder); or bidirectional = false for one "
                             "symmetric table")
            return

    def _past_only(self, call: ast.Call) -> bool:
        dist = call.args[0] if call.args else next((k.value for k in call.kwargs if k.name == "distance"), None)
        flag = next((k.value for k in call.kwargs if k.name == "bidirectional"), None)
        if len(call.args) >= 4:
            flag = call.args[3]
        on = (flag is not None and (flag.kind == "bool" and flag.value
                                    or flag.kind == "name" and self.values.get(flag.id) is True))
        return on and dist is not None and dist.kind == "name" and dist.id == "distance"


def _calls(expr, func: str):
    """Every call of ``func`` inside an expression tree."""
    if isinstance(expr, ast.Call) and expr.func == func:
        yield expr
    if isinstance(expr, ast.Node):
        for name in type(expr).model_fields:
            yield from _calls(getattr(expr, name), func)
    elif isinstance(expr, tuple):
        for item in expr:
            yield from _calls(item, func)
