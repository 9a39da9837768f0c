"""How scores become weights: ``normalize = softmax | softmax1 | sigmoid(bias = b) | stick_breaking(...) |
differential(lambda_init = l)``, checked (docs/semantics.md §1b).

* ``softmax`` - the default.
* ``softmax1`` - softmax plus one (a logit 0 pinned in the denominator: ``exp(s_j) / (1 + sum_t exp(s_t))``),
  the learned sink's column with its logit fixed at 0 and a zero value; so it cannot go with a sink.
* ``sigmoid`` / ``sigmoid(bias = b)`` - sigmoid attention (Ramapuram et al. 2024): ``sigmoid(s_j + b)``, no
  sum over the keys. ``b`` is a number known when the scheme is checked (the paper's ``-log(n)`` with n the
  training sequence length is written ``sigmoid(bias = -log(train_length))``); a bias read from the run-time
  length would make a decoded token's weights differ from the full forward's, so it is refused.
* ``stick_breaking`` / ``stick_breaking(current = false)`` - Tan et al. 2024.
* ``differential`` / ``differential(lambda_init = l)`` - differential attention (Ye et al. 2024, Hugging Face's
  DiffLlama): heads h and h + heads/2 form a pair whose weights are ``a_h - lambda a_{h + heads/2}``, lambda
  learned (``exp(q1 . k1) - exp(q2 . k2) + l``); ``l`` a number known when checking (default 0.8). The pairs
  need an even head count; a value transport is refused (its inverse would act on the pair's mixed values).

A sink is one more term of a softmax's normaliser: only ``softmax`` takes one. PaTH's blockwise kernel and
decode rule are softmax attention: they take ``softmax`` (and its sink) only. Refusals are E242.
"""

from __future__ import annotations

import math

from pedsl.lang import ast
from pedsl.lang.exprs import to_source
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.values import DYNAMIC, StaticEnv

NORMALIZERS = ("softmax", "softmax1", "sigmoid", "stick_breaking", "differential")
# the one option each normaliser takes by name
OPTIONS = {"stick_breaking": "current", "sigmoid": "bias", "differential": "lambda_init"}
LAMBDA_INIT = 0.8  # differential attention's lambda_init when not given (the paper's constant choice)
_HINT = ("normalize = softmax | softmax1 (a zero logit in the denominator) | sigmoid(bias = -log(train_length)) "
         "(Ramapuram et al. 2024) | stick_breaking (Tan et al. 2024; current = false leaves the query's own key "
         "out, as their kernel's default) | differential(lambda_init = 0.8) (Ye et al. 2024)")


class NormalizerResolution(ResolverStage):
    """The Resolver's stage for the ``normalize`` statement."""

    def resolve_normalize(self, transports: list, env: StaticEnv,
                          heads: int) -> tuple[str, bool, float, float] | None:
        """(the normaliser, whether a query's own key takes part, the sigmoid's bias, differential attention's
        lambda_init); None after reporting."""
        loc = self.m.normalize
        if loc is None:
            return "softmax", True, 0.0, LAMBDA_INIT
        self._current = loc.src
        got = _normalizer(loc.stmt.value)
        if got is None:
            self.report("E242", f"normalize takes {', '.join(NORMALIZERS)} (stick_breaking(current = false), "
                        f"sigmoid(bias = b), differential(lambda_init = l)), not {to_source(loc.stmt.value)}",
                        loc.stmt.value, hint=_HINT)
            return None
        name, option = got
        attend_current, bias, lambda_init = True, 0.0, LAMBDA_INIT
        if option is not None:
            value = self.fold_or_report(option, env)
            if value is FAILED:
                return None
            if name == "stick_breaking":
                if not isinstance(value, bool):
                    self.report("E242", f"stick_breaking(current = ...) takes true or false, not {value!r}", option)
                    return None
                attend_current = value
            else:
                folded = self._known_number(value, option, name)
                if folded is None:
                    return None
                bias, lambda_init = (folded, LAMBDA_INIT) if name == "sigmoid" else (0.0, folded)
        if name not in ("softmax", "softmax1") and any(t.kind == "accumulate_householder" for t in transports):
            # differential attention's pairs read two heads' weights; PaTH's kernel forms one head's
            self.report("E242", f"normalize = {name} cannot go with accumulate(householder(...)): PaTH's "
                        "blockwise kernel and decode rule are softmax attention", loc.stmt,
                        hint=f"drop one of the two, or use rotations (rotate, accumulate(rotation(...))) with {name}")
            return None
        if name == "differential" and not self._pairs_heads(heads, transports, loc.stmt):
            return None
        return name, attend_current, bias, lambda_init

    def _pairs_heads(self, heads: int, transports: list, stmt: ast.Node) -> bool:
        """Differential attention pairs head h with h + heads/2 and mixes the pair's values (E264)."""
        if heads % 2:
            self.report("E264", f"normalize = differential pairs head h with head h + heads / 2, so it needs an "
                        f"even number of heads, not {heads}", stmt,
                        hint="set heads to an even number (-P heads=N, or the model's head count)")
            return False
        if any(t.targets == "qkv" for t in transports):
            self.report("E264", "normalize = differential cannot go with a transport of the values (qkv): a pair's "
                        "output mixes the two heads' weights over one value, which no inverse transport of one "
                        "head's values undoes", stmt, hint="transport q and k only (qk: ...) with differential")
            return False
        return True

    def _known_number(self, value, node: ast.Expr, name: str) -> float | None:
        if value is DYNAMIC or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            if name == "differential":
                self.report("E242", f"differential(lambda_init = ...) takes a finite number known when the scheme "
                            f"is checked, not {to_source(node)}", node,
                            hint="DiffLlama's value for layer l (from 0): lambda_init = 0.8 - 0.6 * exp(-0.3 * l), "
                            "with l an int param (param layer_index: int (>= 0) = 0)")
                return None
            self.report("E242", f"sigmoid(bias = ...) takes a finite number known when the scheme is checked, not "
                        f"{to_source(node)}", node,
                        hint="the paper's b = -log(n), n the training sequence length: sigmoid(bias = "
                        "-log(train_length)); a bias of the run-time length would change a token's weights "
                        "between the full forward and cached decoding")
            return None
        return float(value)

    def check_sink_normalizer(self, sink: str | None, normalize: str) -> None:
        """A sink is one more term of the softmax's normaliser: only plain softmax takes one (E242)."""
        if sink is None or normalize == "softmax" or self.m.normalize is None:
            return
        self._current = self.m.normalize.src
        why = {"softmax1": "softmax1's pinned zero logit is a sink already (sink = logit learns that logit)",
               "sigmoid": "sigmoid weights have no normaliser for a sink to join",
               "stick_breaking": "stick-breaking weights need not sum to one (what no key takes is left out)",
               "differential": "differential attention is two softmaxes without sinks (Hugging Face's DiffLlama)"}
        self.report("E242", f"normalize = {normalize} cannot go with sink = {sink}: a sink is one more term of the "
                    "softmax's normaliser", self.m.normalize.stmt, hint="drop the sink: " + why[normalize])


def _normalizer(value: ast.Expr) -> tuple[str, ast.Expr | None] | None:
    """(name, its option's value or None) of a normalize statement's value, None when it is no normaliser:
    a bare name, ``stick_breaking(current = BOOL)`` or ``sigmoid(bias = NUMBER)``."""
    if value.kind == "name" and value.id in NORMALIZERS:
        return value.id, None
    if value.kind == "call" and value.func in OPTIONS and not value.args and [
            kw.name for kw in value.kwargs] == [OPTIONS[value.func]]:
        return value.func, value.kwargs[0].value
    return None


def weights_words(s) -> str:
    """How scheme ``s`` (a Scheme, or anything with its normalize fields) turns scores into weights, in words
    (``pedsl graph``, ``explain``, the diff's facts)."""
    if s.normalize == "softmax":
        return "softmax over the visible keys"
    if s.normalize == "softmax1":
        return "softmax plus one: exp(s(i, j)) / (1 + sum over the visible keys t of exp(s(i, t))); rows sum to < 1"
    if s.normalize == "differential":
        return (f"differential: heads h and h + heads/2 share the weights softmax_h - lambda * softmax_(h + heads/2), "
                f"lambda = exp(q1 . k1) - exp(q2 . k2) + {s.lambda_init:.6g} (learned); rows sum to 1 - lambda")
    if s.normalize == "sigmoid":
        return (f"sigmoid(s(i, j) {'-' if s.sigmoid_bias < 0 else '+'} {abs(s.sigmoid_bias):.6g}) per visible key, "
                "no sum over the keys")
    return ("stick-breaking (own key " + ("included" if s.attend_current else "left out") + "): w(i, j) = "
            "sigmoid(s(i, j)) * prod over the nearer keys t of (1 - sigmoid(s(i, t))); no softmax, the weights sum "
            "to at most 1")
