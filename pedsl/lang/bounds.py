"""Checks that a scheme's values stay within :mod:`pedsl.limits` and cannot fail later.

Run by the resolver once types are known: the model sizes a scheme fixes (``heads``,
``head_dim``), the static arguments of every builtin call a transport, bias or temperature
reaches (``slopes(0)``, ``log_length(1)``, ``linear(rank = -5)``), the temperature and the
biases probed at a few query positions (``sqrt(-1)``, ``1e300``), and the ``train {}`` /
``eval {}`` blocks validated by the same configuration models the commands use. Every finding
is a positioned diagnostic, found before anything is allocated.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from pedsl import limits
from pedsl.lang import ast
from pedsl.lang.fold import ARG_RULES, CHECKED_ARGS, SignatureIssue, fold_expr
from pedsl.lang.exprs import transform, walk
from pedsl.lang.values import DYNAMIC, EvalIssue, StaticEnv, Vec

# A temperature multiplies every attention score: past this the float32 scores of ordinary
# queries and keys overflow or the softmax collapses to one key.
MAX_TEMPERATURE = limits.MAX_TEMPERATURE

# ``softcap = c``: scores become c * tanh(s / c), computed in float32 at least. With float32's smallest
# normal number 2^-126 (denormals are flushed, pedsl/torchenv.py), s / c rounds to zero for |s| < c * 2^-126,
# so a score loses up to c * 2^-126 in absolute terms. Up to c = 2^103 that loss stays below 2^-23 (one
# float32 rounding of a unit score): the cap computes the scores to float32 precision. Past it the
# small scores vanish, and past 3.4e38 c itself is infinite and every capped score NaN or zero. A cap
# that large never acts on a float32 score, so it is refused rather than computed differently.
MAX_SOFTCAP = 2.0 ** 103

# xpos(): pair k of q is scaled by zeta_k^((i - c) / gamma) and of k by its inverse, c = n // 2 of a
# length n (docs/semantics.md §2c). A score matrix multiplies a query's scale by every key's inverse
# one (the keys a causal mask drops too), so each scale stays within 2^+-63 and their products within
# float32's 2^+-126: past that the scores are inf - inf or 0 * inf, NaN where the decay (at most 1) is
# finite. The compiled module makes the same test on every call (general.xpos_scale).
XPOS_SCALE_BITS = 63

# Query positions the temperature and biases are probed at (the first, an early, a far one).
PROBES = (0, 1, limits.MAX_LENGTH - 1)

Report = Callable[..., None]


def structural_issue(name: str, value: Any) -> str | None:
    """Why a value of ``heads`` / ``head_dim`` cannot be used, or None."""
    cap = limits.MAX_HEADS if name == "heads" else limits.MAX_HEAD_DIM
    if isinstance(value, bool) or not isinstance(value, int):
        return None  # typing reports it
    if not 1 <= value <= cap:
        return f"'{name}' = {value:,} is out of range (1 .. {cap:,}; see pedsl/limits.py)"
    return None


def softcap_issue(value: float) -> str | None:
    """Why ``softcap = value`` (already a finite number > 0) cannot be computed in float32, or None."""
    if value > MAX_SOFTCAP:
        return (f"softcap = {value:g} is beyond {MAX_SOFTCAP:.3g} (2^103): float32 scores divided by it vanish "
                f"(below 2^-126) and{' it overflows float32 itself, so' if value > limits.FLOAT32_MAX else ''} "
                "the capped scores are not the scores")
    return None


def xpos_longest(gamma: float, zeta: float) -> int:
    """The longest sequence whose xPos scales stay within 2^+-XPOS_SCALE_BITS: the fastest pair's decay
    zeta_0 = zeta / (1 + zeta) reaches zeta_0^(+-(n // 2) / gamma) at the ends."""
    per_token = math.log2((1 + zeta) / zeta) / gamma  # bits of scale per position away from the centre
    return 2 * int(XPOS_SCALE_BITS / per_token) + 1


def xpos_issue(gamma: float, zeta: float, lengths: dict[str, int]) -> str | None:
    """Why xpos(gamma, zeta) cannot be computed in float32 at the longest of ``lengths`` (what -> tokens)."""
    longest = xpos_longest(gamma, zeta)
    what, n = max(lengths.items(), key=lambda kv: kv[1])
    if n <= longest:
        return None
    need = math.ceil(n // 2 * math.log2((1 + zeta) / zeta) / XPOS_SCALE_BITS * 1000) / 1000
    return (f"xpos(gamma = {gamma:g}, zeta = {zeta:g}) scales q and k by zeta_0^(+-(n // 2) / gamma), beyond what "
            f"float32 scores hold (2^+-{XPOS_SCALE_BITS}) past {longest:,} token{'s' if longest != 1 else ''}; {what} is {n:,} tokens: gamma must be at "
            f"least {need:g} (or the sequences shorter)")


def check_calls(expr: ast.Expr, env: StaticEnv, report: Report, seen: set, *, checked_args: bool = True) -> None:
    """Evaluate the static arguments of every run-time builtin and slopes() call in ``expr``, and
    refuse a number (a literal or a parameter) beyond float32: next to a run-time value it becomes
    a float32 tensor, infinite (``1e300 * sigmoid(...)``). ``checked_args=False`` leaves the calls with
    arguments that must fold (``learned(init)``) to a caller that folds them with the group's pairs."""
    for node in walk(expr):
        if node.kind == "num" or (node.kind == "name" and node.id in env.values):
            v = node.value if node.kind == "num" else env.values[node.id]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > limits.FLOAT32_MAX:
                key = ("num", node.span.line, node.span.col) if node.span else id(node)
                if key not in seen:
                    seen.add(key)
                    report("E217", f"{v:g} is beyond the float32 range (+-3.4e38): it overflows in a tensor", node,
                           hint="rescale the constant")
            continue
        if node.kind != "call" or (node.func not in ARG_RULES and node.func != "slopes"
                                   and not (checked_args and node.func in CHECKED_ARGS)):
            continue
        call_key = (node.span.line, node.span.col) if node.span else id(node)
        if call_key in seen:
            continue
        seen.add(call_key)
        try:
            fold_expr(node, env)
        except SignatureIssue:
            continue  # the type checker's E203
        except EvalIssue as issue:
            report("E217", str(issue), issue.node or node, hint=issue.hint)


def at_start(expr: ast.Expr) -> ast.Expr:
    """``expr`` with every ``learned(init)`` replaced by its ``init``: the value the module starts from."""
    def start(node: ast.Expr) -> ast.Expr | None:
        if node.kind == "call" and node.func == "learned":
            init = node.args[0] if node.args else next((kw.value for kw in node.kwargs if kw.name == "init"), None)
            return init
        return None
    return transform(expr, start)


def probe(expr: ast.Expr, env: StaticEnv, report: Report, what: str, *, bound: float | None = None) -> None:
    """Evaluate ``expr`` at a few query positions (and equal distances), learned values at their start;
    report math errors and values that are not finite or exceed ``bound`` in magnitude (default: the
    float32 range - the module computes in float32, and its factored forms, slope * i - slope * j for a
    bias linear in the distance, are inf - inf where the value itself overflows)."""
    limit = limits.FLOAT32_MAX if bound is None else bound
    started = at_start(expr)
    for i in PROBES:
        penv = StaticEnv(values={**env.values, "position": i, "distance": i, "query_position": i}, lets=env.lets,
                         n=i + 1)
        try:
            v = fold_expr(started, penv)
        except SignatureIssue:
            return  # the type checker's E203
        except EvalIssue as issue:
            report("E217", f"{what}: {issue}", issue.node or expr, hint=issue.hint)
            return
        if v is DYNAMIC:
            continue
        values = v.values if isinstance(v, Vec) else (v,) if isinstance(v, (int, float)) else ()
        for x in values:
            if not math.isfinite(x) or abs(x) > limit:
                start = " (learned values at their start)" if started is not expr else ""
                report("E217", f"{what} is {x:g} at query position {i}{start}: "
                       + (f"beyond +-{limit:g}" if math.isfinite(x) else "not a finite number"),
                       expr, hint="a temperature scales every attention score: keep it moderate (see pedsl/limits.py)"
                       if bound is not None else "keep it within float32 (+-3.4e38) at every distance up to "
                       f"{limits.MAX_LENGTH - 1:,}: a smaller factor, or a start value nearer zero")
                return
def declared_lengths(train: dict[str, Any]) -> dict[str, int]:
    """The sequence lengths a scheme's train {} block (or its default) runs it at, by what names them.
    (Evaluation lengths are not among them: a module may be evaluated at any length, and the compiled
    module refuses one it cannot compute; a scheme is checked for what training will certainly run.)"""
    from pedsl import config  # on use, as config_issue
    from pedsl.errors import ConfigError

    try:
        return {"the training context": config.resolve_train_config(block=train, step_memory=False).context}
    except ConfigError:
        return {}  # config_issue reports it


def config_issue(section: str, values: dict[str, Any], train: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """Validate a ``train {}`` / ``eval {}`` block with the config models:
    (message, the setting at fault or None, hint) or ('', None, None) when it is valid."""
    from pedsl import config  # on use: `pedsl check` of a scheme without these blocks never loads yaml
    from pedsl.errors import ConfigError

    try:
        if section == "train":
            config.resolve_train_config(block=values, step_memory=False)  # checked by `pedsl train`
        else:
            try:
                context = config.resolve_train_config(block=train, step_memory=False).context
            except ConfigError:
                context = 128
            config.resolve_eval_config(block=values, context=context)
    except ConfigError as err:
        return str(err), getattr(err, "field", None), err.hint
    return "", None, None
