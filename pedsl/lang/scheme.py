"""The resolved IR: one scheme after imports, `extends` and parameters, checked.

This is what :func:`pedsl.load` returns and what the compiler, `show`, `diff`
and `explain` consume. Frozen Pydantic models with ``extra="forbid"`` and
discriminated unions for transports and biases; ``pedsl schema`` prints their
JSON Schema. Expressions keep parameter names (their values are in
``params``); ``let`` definitions are inlined.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from pedsl.lang.ast import Expr


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ChannelGroup(_Frozen):
    name: str
    channels: tuple[int, ...]
    spec: str  # the source spec, canonically formatted (e.g. "quarters(1, 3)")


class RotateTransport(_Frozen):
    """Position-indexed phase rotation: T(j->i) = R(phase(j) - phase(i)) per pair (docs/semantics.md §2a)."""

    kind: Literal["rotate"] = "rotate"
    targets: Literal["qk", "qkv"]
    group: str
    phase: Expr
    dynamic: bool = False  # the table depends on the run-time length n
    # q and k of the group are multiplied by scale (HF's attention factor on cos and sin): the
    # group's share of the logit scales by scale^2, the other channels' does not
    scale: float = 1.0
    scale_expr: Expr | None = None  # the scale as written (lets inlined), None when absent


class RotationSteps(_Frozen):
    """Accumulated SO(2) steps: M_t rotates pair k by -angle(t, k) (docs/semantics.md §2b)."""

    kind: Literal["accumulate_rotation"] = "accumulate_rotation"
    targets: Literal["qk", "qkv"]
    group: str
    angle: Expr
    data: bool = False  # depends on tokens or hidden state
    learned: bool = False


class HouseholderSteps(_Frozen):
    """Accumulated Householder-like steps M_t = I - beta_t w_t w_t^T (PaTH)."""

    kind: Literal["accumulate_householder"] = "accumulate_householder"
    targets: Literal["qk", "qkv"]
    group: str
    w: Expr
    beta: Expr
    orthogonal: bool = False  # beta is the constant 2 (or 0)


Transport = Annotated[Union[RotateTransport, RotationSteps, HouseholderSteps], Field(discriminator="kind")]


class DistanceBias(_Frozen):
    """b(i, j) = term(head, d = i - j). ``slope`` is set when the term is slope * d (ALiBi-like)."""

    kind: Literal["distance"] = "distance"
    term: Expr
    slope: Expr | None = None


class GateBias(_Frozen):
    """b(i, j) = sum_{s = j+1 .. i} log_gate(s, head) (forget gate, FoX)."""

    kind: Literal["gate"] = "gate"
    log_gate: Expr
    data: bool = True


Bias = Annotated[Union[DistanceBias, GateBias], Field(discriminator="kind")]


class Scheme(_Frozen):
    name: str
    doc: str = ""
    file: str | None = None
    bases: tuple[str, ...] = ()  # the extends chain, nearest first
    params: dict[str, Any] = Field(default_factory=dict)
    heads: int
    head_dim: int
    layout: Literal["halves", "interleaved"] = "halves"
    groups: tuple[ChannelGroup, ...] = ()
    transports: tuple[Transport, ...] = ()
    biases: tuple[Bias, ...] = ()
    temperature: Expr | None = None
    train: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    allow: tuple[str, ...] = ()
    source: str = Field(default="", repr=False)
    source_hash: str = ""

    @property
    def value_transport(self) -> bool:
        return any(t.targets == "qkv" for t in self.transports)

    @property
    def needs_x(self) -> bool:
        from pedsl.lang.exprs import uses_name

        exprs = [e for t in self.transports for e in _transport_exprs(t)]
        exprs += [b.log_gate if b.kind == "gate" else b.term for b in self.biases]
        return any(uses_name(e, "x") for e in exprs)

    @property
    def needs_tokens(self) -> bool:
        from pedsl.lang.exprs import uses_name

        return any(uses_name(e, "token") for t in self.transports for e in _transport_exprs(t))

    def group(self, name: str) -> ChannelGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


def _transport_exprs(t) -> list:
    if t.kind == "rotate":
        return [t.phase]
    if t.kind == "accumulate_rotation":
        return [t.angle]
    return [t.w, t.beta]
