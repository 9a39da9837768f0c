"""Dense and block rotations (docs/semantics.md §2e): the checks of ``dense_rotation(...)`` on a transport line.

``dense_rotation`` has only static arguments: a block size that divides the group's width, at most one of
``shared`` and ``split`` (the two commuting forms of ComRoPE), as many blocks as axes divide for ``split``,
and a positive start spread. Each bad argument is ``E234`` at the argument; a dense rotation on the values
(``qkv``) is ``E235``: its value transport would need the full ``P^T expm(...) P`` undone per query, which no
executor computes yet.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.fold import bind_args
from pedsl.lang.scheme import ChannelGroup, DenseRotation
from pedsl.lang.stage import FAILED
from pedsl.lang.values import StaticEnv

MAX_BLOCK = 256  # channels in one block: a (block x block) matrix exponential per token, head and block


def dense_rotation(stage, st: ast.Transport, fn: ast.Call, group: ChannelGroup, env: StaticEnv,
                   axes: int) -> DenseRotation | None:
    """The checked transport of ``st`` (``fn`` its ``dense_rotation(...)`` call) on ``group``; None after
    reporting what is wrong. ``stage``: the resolver stage that reports (its ``report`` and ``fold_or_report``)."""
    if st.targets == "qkv":
        stage.report("E235", "dense_rotation() rotates q and k only: value rotation (qkv) with a dense rotation is "
                     "not computed by any executor", st, hint="write 'qk:' (the scores are what the rotation "
                     "changes)")
        return None
    args = bind_args(fn, FUNCTIONS["dense_rotation"].params)
    got: dict[str, Any] = {}
    for name in ("block", "shared", "split", "basis", "init"):
        expr = args[name]
        if not _written(expr):  # a default
            got[name] = expr
            continue
        value = stage.fold_or_report(expr, env)
        if value is FAILED:
            return None
        got[name] = value
    width = len(group.channels)
    block = got["block"] or width
    where = lambda name: args[name] if _written(args[name]) else fn  # noqa: E731
    problem = _problem(block, width, got, axes, group.name)
    if problem is not None:
        name, message, hint = problem
        stage.report("E234", f"dense_rotation(): {message}", where(name), hint=hint)
        return None
    per = args["per"]
    mode: Literal["independent", "shared", "split"] = ("shared" if got["shared"] else "split" if got["split"]
                                                       else "independent")
    return DenseRotation(targets="qk", group=group.name, block=int(block), mode=mode, basis=bool(got["basis"]),
                         per_head=isinstance(per, ast.Name) and per.id == "head", init=float(got["init"]), axes=axes)


def _written(arg) -> bool:
    """The argument was written (a syntax node), not left at its default (a Python value)."""
    return hasattr(arg, "kind")


def _problem(block, width: int, got: dict, axes: int, gname: str) -> tuple[str, str, str] | None:
    """(argument, what is wrong, hint) for the first bad argument, or None."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block > MAX_BLOCK:
        return ("block", f"block must be an integer from 2 to {MAX_BLOCK} (or 0: the whole group), got {block!r}",
                "a block of b channels is one b x b skew-symmetric generator per axis")
    if width % block:
        return ("block", f"a block of {block} channels does not divide group '{gname}' ({width} channels)",
                f"choose a divisor of {width} (e.g. {_divisor_near(width, block)}), or 0 for one dense block")
    if got["shared"] and got["split"]:
        return ("split", "shared = true and split = true are two forms of commuting generators; choose one",
                "shared: lambda_a A (ComRoPE-LD); split: each block belongs to one axis (ComRoPE-AP)")
    if got["split"] and (width // block) % axes:
        return ("split", f"split = true deals the {width // block} blocks to the {axes} axes in equal runs, and "
                f"{axes} does not divide {width // block}", "choose a block size that leaves a multiple of the axis "
                "count of blocks")
    init = got["init"]
    if isinstance(init, bool) or not isinstance(init, (int, float)) or not 0 < init < math.inf:
        return ("init", f"init must be a positive number (the std of the generators' start), got {init!r}",
                "0.1 keeps the start rotations near RoPE's scale at short distances")
    return None


def _divisor_near(width: int, block: int) -> int:
    divisors = [d for d in range(2, width + 1) if width % d == 0]
    return min(divisors, key=lambda d: abs(d - block)) if divisors else width
