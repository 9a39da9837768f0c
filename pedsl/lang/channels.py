"""Channel groups: the layout builtins (fraction, quarters, range) and the channels a group takes."""

from __future__ import annotations

from pedsl.lang.values import EvalIssue, GroupSpec


def _group(kind):
    def impl(env, node, **kw):
        return GroupSpec(kind, tuple(v for v in kw.values() if v is not None))

    return impl


LAYOUTS = {
    "fraction": _group("fraction"),
    "quarters": _group("quarters"),
    "range": _group("range"),
}


def group_channels(spec: GroupSpec, head_dim: int, taken: set[int]) -> list[int]:
    """Channel indices of a group spec; raises EvalIssue when it does not fit head_dim."""
    if spec.kind == "all":
        return list(range(head_dim))
    if spec.kind == "rest":
        return [c for c in range(head_dim) if c not in taken]
    if spec.kind == "fraction":
        (f,) = spec.args
        size = f * head_dim
        if not 0 < f <= 1:
            raise EvalIssue(f"fraction({f:g}) must be in (0, 1]")
        if abs(size - round(size)) > 1e-9 or round(size) % 2:
            raise EvalIssue(
                f"fraction({f:g}) of head_dim {head_dim} is {size:g} channels, not an even whole number",
                hint=f"rotary channels come in pairs: use a fraction f with f * {head_dim} even, "
                f"e.g. {_nice_fractions(head_dim)}",
            )
        return list(range(int(round(size))))
    if spec.kind == "quarters":
        if head_dim % 8:
            raise EvalIssue(
                f"quarters need head_dim divisible by 8 (each quarter an even number of channels); "
                f"head_dim is {head_dim}"
            )
        q = head_dim // 4
        out: list[int] = []
        for a in spec.args:
            a = int(a)
            if not 1 <= a <= 4:
                raise EvalIssue(f"quarter {a} does not exist: quarters are numbered 1 to 4")
            out.extend(range((a - 1) * q, a * q))
        if len(set(out)) != len(out):
            raise EvalIssue("a quarter is listed twice")
        return sorted(out)
    if spec.kind == "range":
        a, b = (int(v) for v in spec.args)
        if not 0 <= a < b <= head_dim:
            raise EvalIssue(f"range({a}, {b}) does not fit head_dim {head_dim} (channels 0 .. {head_dim - 1})")
        if (b - a) % 2:
            raise EvalIssue(f"range({a}, {b}) has {b - a} channels; rotary channels come in pairs")
        return list(range(a, b))
    raise EvalIssue(f"unknown channel group '{spec.kind}'")  # pragma: no cover


def channel_ranges(chans) -> str:
    """Channel indices as compact ranges: (0, 1, 2, 3, 8, 9) -> '0-3, 8-9' ('none' when empty)."""
    chans = sorted(chans)
    out, i = [], 0
    while i < len(chans):
        j = i
        while j + 1 < len(chans) and chans[j + 1] == chans[j] + 1:
            j += 1
        out.append(str(chans[i]) if i == j else f"{chans[i]}-{chans[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def _nice_fractions(head_dim: int) -> str:
    fr = [f for f in (0.25, 0.5, 0.75, 1.0) if (f * head_dim) % 2 == 0]
    return ", ".join(f"{f:g}" for f in fr) or "1"
