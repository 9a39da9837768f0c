"""Transports and steps: rotate, accumulate, rotation, householder (one record each).

These have no value: a transport line's call is read by :mod:`pedsl.lang.terms` into the transport
it names (docs/semantics.md section 2: rotation by position, accumulated steps; an accumulated
log-gate is a bias, section 3), which the compiler lowers to its kernels. A record gives the
signature and the typing rule; with neither ``fold`` nor ``run`` the folder leaves the call dynamic.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue, need_num, scalar
from pedsl.lang.types import Dep, Kind, Ty


def _rotate(a: dict[str, Ty]) -> Ty:
    t = a["phase"]
    need_num(t, "phase", {"pos", "pair", "head"}, " (a phase per position, head and rotary pair)")
    scalar(a, "scale")
    if t.data:  # learned values (learned(init)) may stand in it: a phase per position, trained
        raise TypeIssue(
            "a position-indexed rotation cannot depend on the data",
            "phase",
            hint="use accumulate(rotation(...)) for data-dependent angles",
        )
    return Ty(Kind.TRANSPORT, detail="rotate")


def _xpos(a: dict[str, Ty]) -> Ty:
    t = a["phase"]
    need_num(t, "phase", {"pos", "pair"}, " (a phase per position and rotary pair)")
    scalar(a, "gamma")
    scalar(a, "zeta")
    if t.data or t.learned:
        raise TypeIssue(
            "xPos rotates by position: its phase cannot depend on the data",
            "phase",
            hint="use accumulate(rotation(...)) for data-dependent angles",
        )
    return Ty(Kind.TRANSPORT, detail="xpos")


def _rotation(a: dict[str, Ty]) -> Ty:
    t = a["angle"]
    need_num(t, "angle", {"pos", "pair", "head"}, " (a step angle per position, head and rotary pair)")
    return Ty(Kind.STEP, detail="rotation")


def _householder(a: dict[str, Ty]) -> Ty:
    w, beta = a["w"], a["beta"]
    need_num(w, "w", {"pos", "head", "chan"}, " (a direction per position, head and channel)")
    if "chan" not in w.axes:
        raise TypeIssue(
            "'w' must be a vector over the channels of a head (num[..., chan])",
            "w",
            hint="make it with linear(x, to = channel)",
        )
    need_num(beta, "beta", {"pos", "head"}, " (a scalar per position and head)")
    return Ty(Kind.STEP, detail="householder")


def _dense_rotation(a: dict[str, Ty]) -> Ty:
    scalar(a, "block", integer=True)
    scalar(a, "init")
    for flag in ("shared", "split", "basis"):
        if a[flag].kind != "bool":
            raise TypeIssue(f"'{flag}' must be true or false", flag, hint=f"{flag} = true or {flag} = false")
    per = a.get("per")
    if per is not None and per.kind != "none" and (per.kind != "axis" or per.detail != "head"):
        raise TypeIssue("'per' must be head (one set of generators per head) or left out (shared by the heads)", "per",
                        hint="write per = head, or drop it")
    return Ty(Kind.TRANSPORT, detail="dense_rotation", reads=frozenset({Dep.POSITION, Dep.LEARNED}))


def _accumulate(a: dict[str, Ty]) -> Ty:
    t = a["step"]
    if t.kind == "step":
        return Ty(Kind.TRANSPORT, detail="accumulate " + t.detail)
    if t.kind == "num":
        need_num(t, "step", {"pos", "head"}, " (a log-gate per position and head)")
        return Ty(Kind.BIAS, detail="gate")
    raise TypeIssue(
        f"accumulate() takes a step (rotation(...), householder(...)) or a log-gate, not {t.show()}",
        "step",
    )


RECORDS = [
    Builtin("rotate", (("phase", REQUIRED), ("scale", 1.0)),
            "position-indexed rotation of each pair by its phase; q and k of the group are also multiplied by scale "
            "(Hugging Face's attention factor: the group's logits scale by scale^2)", _rotate, "transport"),
    Builtin("xpos", (("phase", REQUIRED), ("gamma", 512.0), ("zeta", 0.4)),
            "xPos (Sun et al. 2022): rotate each pair by its phase and scale pair k of q by zeta_k^(i / gamma), of k "
            "by zeta_k^(-j / gamma), zeta_k = (2k / d + zeta) / (1 + zeta): the pair's logit decays as "
            "zeta_k^((i - j) / gamma)", _xpos, "transport"),
    Builtin("dense_rotation", (("block", 0), ("shared", False), ("split", False), ("basis", False), ("per", None),
                               ("init", 0.1)),
            "a rotation R(p) = P^T expm(sum_a p_a A_a) P of the group's channels by the token's position p (one "
            "coordinate per axis): A_a learned skew-symmetric, block-diagonal in blocks of `block` consecutive "
            "channels (0: one dense block), one per axis (LieRE), or shared = true: lambda_a A (ComRoPE-LD), or "
            "split = true: the blocks dealt to the axes (ComRoPE-AP); basis = true: P = (I - S)(I + S)^-1 of a learned "
            "skew-symmetric S (STRING), else P = I; per = head: generators per head; init: the std of their start",
            _dense_rotation, "transport", names=("per",)),
    Builtin("accumulate", (("step", REQUIRED),),
            "ordered product of per-token steps from j+1 to i (or sum of log-gates: a bias)", _accumulate,
            "transport"),
    Builtin("rotation", (("angle", REQUIRED),), "SO(2) step: rotate each pair by -angle", _rotation, "transport"),
    Builtin("householder", (("w", REQUIRED), ("beta", REQUIRED)), "Householder-like step I - beta w w^T",
            _householder, "transport"),
]
