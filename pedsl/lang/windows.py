"""The attention's shape: ``window = N``, ``chunk = N``, ``sink = logit | token`` and ``softcap = c``, checked.

``N`` is an integer >= 1 known when the scheme is checked (a literal, a param, arithmetic on them);
a scheme has a window or a chunk, never both; ``c`` is a number > 0 known alike (Gemma 2's logit
soft-capping: every score s becomes c * tanh(s / c)); ``none`` drops one inherited through ``extends``.
What they mean (positions, documents, padding, decoding): docs/semantics.md §11.
"""

from __future__ import annotations

import math

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.bounds import softcap_issue
from pedsl.lang.exprs import inline_lets
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.values import DYNAMIC, StaticEnv
from pedsl.limits import MAX_LENGTH

SINK_KINDS = ("logit", "token")


class WindowResolution(ResolverStage):
    """The Resolver's stage for the window, the chunk and the sink."""

    def resolve_shape(self, env: StaticEnv, lets) -> tuple[int | None, int | None, str | None]:
        """(window, chunk, sink) of the merged scheme, each None when absent; reports what is wrong."""
        window_loc, chunk_loc = self.m.window, self.m.chunk
        window = self._width(window_loc, env, lets)
        chunk = self._width(chunk_loc, env, lets)
        # a width comes from its statement: both widths given means both statements are there
        if window is not None and chunk is not None and window_loc is not None and chunk_loc is not None:
            later = max((window_loc, chunk_loc), key=lambda loc: _line(loc.stmt))
            self._current = later.src
            self.report("E240", "a scheme has a sliding window or chunked attention, not both "
                        f"(window = {window}, chunk = {chunk})", later.stmt,
                        hint="keep one; `window = none` or `chunk = none` drops one inherited through extends")
        return window, chunk, self._sink()

    def check_sink_transports(self, sink: str | None, transports) -> None:
        """A sink token's value is not transported: refused beside a transport of the values (qkv)."""
        loc = self.m.sink
        if sink != "token" or loc is None or not any(t.targets == "qkv" for t in transports):
            return
        self._current = loc.src
        self.report("E240", "sink = token with a transport of the values (qkv): the sink's value has no "
                    "position to be transported from", loc.stmt,
                    hint="use sink = logit, or transport only q and k (qk:)")

    def resolve_softcap(self, env: StaticEnv, lets, transports) -> float | None:
        """``softcap = c`` of the merged scheme: a number > 0 known when the scheme is checked, or None."""
        loc = self.m.softcap
        if loc is None or (loc.stmt.value.kind == "name" and loc.stmt.value.id == "none"):
            return None
        self._current = loc.src
        value = loc.stmt.value
        hint = "write softcap = 50.0 (Gemma 2's attn_logit_softcapping), or softcap = a param of type float"
        t = self.checker().infer(value)
        if t is None:
            return None
        if t.kind != "num" or t.axes or t.reads:
            self.report("E240", f"softcap is a number known when the scheme is checked, not {t.show()}", value,
                        hint=hint)
            return None
        folded = self.fold_or_report(inline_lets(value, lets), env)
        if folded is FAILED:
            return None
        if folded is DYNAMIC or isinstance(folded, bool) or not isinstance(folded, (int, float)) \
                or not math.isfinite(folded) or folded <= 0:
            self.report("E240", f"softcap must be a finite number > 0 (the scores' bound), got {folded!r}", value,
                        hint=hint)
            return None
        issue = softcap_issue(float(folded))
        if issue is not None:
            self.report("E240", issue, value, hint="drop softcap (a cap that large never acts), or use one "
                        "near the scores' range (Gemma 2: 50)")
            return None
        if any(t.kind == "accumulate_householder" for t in transports):
            self.report("E240", "softcap with PaTH's Householder transport is not lowered: its kernels score keys "
                        "without an explicit score matrix to cap", loc.stmt, hint="drop softcap, or the PaTH transport")
            return None
        return float(folded)

    def _width(self, loc, env: StaticEnv, lets) -> int | None:
        value = self.given_value(loc)
        if value is None:
            return None
        t = self.checker().infer(value)
        if t is None:
            return None
        st: ast.WindowStmt = loc.stmt
        what = "a sliding window" if st.kind == "window" else "a chunk"
        hint = f"write {st.kind} = 512, or {st.kind} = a param of type int"
        if t.kind != "num" or t.axes or t.reads:
            self.report("E240", f"{what} is a number of tokens known when the scheme is checked, not {t.show()}",
                        value, hint=hint)
            return None
        folded = self.fold_or_report(inline_lets(value, lets), env)
        if folded is FAILED:
            return None
        if folded is DYNAMIC or isinstance(folded, bool) or not isinstance(folded, int):
            self.report("E240", f"{what} must be an integer number of tokens, got {folded!r}", value, hint=hint)
            return None
        if not 1 <= folded <= MAX_LENGTH:
            self.report("E240", f"{what} of {folded} tokens; it must be between 1 and {MAX_LENGTH:,}", value,
                        hint="1 is each token alone; a width at least the sequence length is full causal attention")
            return None
        return folded

    def resolve_known(self, record, env: StaticEnv, lets, resolved: dict) -> int | float | None:
        """The value of a statement whose record declares it a number known when checking (``record.known``, a
        :class:`pedsl.lang.statements.Known`), or None when absent or wrong (reported, E218). ``resolved``: the
        values of the statements it may need (by field)."""
        known, keyword = record.known, record.keywords[0]
        loc = getattr(self.m, record.merged)
        value = self.given_value(loc)
        if value is None:
            return None
        t = self.checker().infer(value)
        if t is None:
            return None
        what = "an integer" if known.type is int else "a number"
        hint = known.hint or f"write {keyword} = a number, or a param of type {known.type.__name__}"
        if t.kind != "num" or t.axes or t.reads:
            self.report("E218", f"{keyword} is {what} known when the scheme is checked, not {t.show()}", value,
                        hint=hint)
            return None
        folded = self.fold_or_report(inline_lets(value, lets), env)
        if folded is FAILED:
            return None
        number = folded if isinstance(folded, (int, float)) and not isinstance(folded, bool) else None
        if number is None or (known.type is int and not isinstance(number, int)) or not math.isfinite(number):
            self.report("E218", f"{keyword} must be {what}, got {folded!r}", value, hint=hint)
            return None
        if not known.low <= number <= known.high:
            self.report("E218", f"{keyword} = {number!r} is out of its range {known.low:g} .. {known.high:g}",
                        value, hint=hint)
            return None
        if known.needs and all(resolved.get(n) is None for n in known.needs):
            self.report("E218", f"{keyword} acts with {' or '.join(known.needs)}, and the scheme has none: alone it "
                        "would change nothing", loc.stmt, hint=f"add {known.needs[0]} = N, or drop {keyword}")
            return None
        return known.type(number)

    def _sink(self) -> str | None:
        loc = self.m.sink
        if loc is None:
            return None
        st: ast.SinkStmt = loc.stmt
        if st.value == "none":
            return None
        if st.value not in SINK_KINDS:
            self._current = loc.src
            near = did_you_mean(st.value, SINK_KINDS)
            self.report("E240", f"unknown sink '{st.value}'" + (f"; {near}" if near else ""),
                        ast.Name(id=st.value, span=st.value_span),
                        hint="sink = logit (a learned logit per head in the softmax's normaliser, GPT-OSS) or "
                             "sink = token (a learned key/value slot every query sees)")
            return None
        return st.value


def _line(node) -> int:
    return node.span.line if node.span is not None else 0
