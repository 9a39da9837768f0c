"""Step sources: frozen_random, embedding, linear, shortconv (through a call site) and normalize.

A source with state - a frozen random table, or learned parameters - has a ``site`` part,
``site(at, *argument values, **names, **static)``: ``at`` (:class:`pedsl.runtime.walk.At`) is the
call site the walk hands it, through which it asks the backend for its state by a key - a frozen
table (``at.frozen``: drawn once per key with the backend's generator) or a learned layer
(``at.dense``, ``at.lookup``, ``at.causal_conv``: created at the site the walk names, trainable in
torch, drawn from the same initial distribution seeded by (seed, site name) in numpy) - and for
the run-time inputs (``at.tokens()``, ``at.x()``, ``at.position()``). Its ``emit``,
``emit(g, *argument code, **names, **static literals)``, writes the generated module's code with
``g`` (:class:`pedsl.compiler.codegen.SiteCode`) declaring its sub-modules and buffers.
"""

from __future__ import annotations

import math

from pedsl import limits
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue, need_num, scalar
from pedsl.lang.types import Ty, num

FROZEN_CHUNK = 1024  # frozen_random(position) is drawn in chunks of positions, so any prefix is stable

# ------------------------------------------------------------------ typing rules


def _index(t: Ty, arg: str) -> None:
    if t.kind not in ("token",) and not (t.kind == "num" and t.axes == frozenset({"pos"}) and t.integer):
        raise TypeIssue(f"'{arg}' must be 'token' or 'position'", arg)


def _frozen_random_rule(a: dict[str, Ty]) -> Ty:
    _index(a["index"], "index")
    scalar(a, "seed", integer=True)
    return num("pos", "pair")


def _axis(t: Ty, arg: str) -> str:
    if t.kind != "axis" or t.detail not in ("head", "pair", "channel"):
        raise TypeIssue(f"'{arg}' must be one of head, pair, channel", arg)
    return {"channel": "chan"}.get(t.detail, t.detail)


def _embedding_rule(a: dict[str, Ty]) -> Ty:
    if a["index"].kind != "token":
        raise TypeIssue("embedding() is indexed by 'token'", "index")
    to = _axis(a["to"], "to")
    scalar(a, "init")
    axes = {"pos", "head"} | ({to} if to != "head" else set())
    return num(*axes)


def _linear_rule(a: dict[str, Ty]) -> Ty:
    if a["input"].kind != "hidden":
        raise TypeIssue("linear() reads the hidden state 'x'", "input")
    to = _axis(a["to"], "to")
    scalar(a, "rank", integer=True)
    scalar(a, "init_bias")
    axes = {"pos", "head"} | ({to} if to != "head" else set())
    return num(*axes)


def _shortconv_rule(a: dict[str, Ty]) -> Ty:
    need_num(a["v"], "v")
    scalar(a, "width", integer=True)
    if "pos" not in a["v"].axes:
        raise TypeIssue("shortconv() convolves along positions; its input must vary with position", "v")
    return a["v"]


def _normalize_rule(a: dict[str, Ty]) -> Ty:
    need_num(a["v"], "v")
    if "chan" not in a["v"].axes:
        raise TypeIssue("normalize() works on vectors over channels (num[..., chan])", "v")
    return a["v"].with_(integer=False)


# ------------------------------------------------------------------ run-time values at a call site


def _frozen_random(at, *, index, seed):
    P = at.pairs
    if index == "token":
        tokens = at.tokens()
        table = at.frozen(("token", seed, P, at.vocab_size), (at.vocab_size, P), (seed,))
        return at.wrap(at.ops.rows(table, tokens), ("batch", "pos", "pair"))
    pos = at.position()  # the rows of the actual positions
    idx = pos.t.clip(min=0)
    rows = int(idx.max()) + 1 if math.prod(idx.shape) else 1
    table = at.ops.concat([at.frozen(("position", seed, P, c), (FROZEN_CHUNK, P), (seed, c // FROZEN_CHUNK))
                           for c in range(0, max(rows, 1), FROZEN_CHUNK)])[:rows]
    return at.wrap(at.ops.rows(table, idx), (*pos.axes, "pair"))


def _per_head(at, out, axis: str, width: int):
    """(B, L, heads * width) -> a value over batch, head, pos (and the width's axis)."""
    B, L = out.shape[:2]
    out = at.ops.moveaxis(out.reshape(B, L, -1, width), 2, 1)  # (B, H, L, W)
    if axis == "head":
        return at.wrap(out[..., 0], ("batch", "head", "pos"))
    return at.wrap(out, ("batch", "head", "pos", axis))


def _embedding(at, *, index, to, init):
    axis, width = at.width(to)
    return _per_head(at, at.lookup(at.heads * width, init), axis, width)


def _linear(at, *, input, to, rank, init_bias):
    axis, width = at.width(to)
    return _per_head(at, at.dense(at.heads * width, rank, init_bias), axis, width)


def _shortconv(at, v, *, width):
    t, axes = at.aligned_with(v, ("batch", "head", "pos"))
    t = at.ops.moveaxis(t, axes.index("pos"), -1)  # (B|1, H|1, W?, L)
    lead, L = t.shape[:-1], t.shape[-1]
    out = at.causal_conv(t.reshape(lead[0], math.prod(lead[1:]), L), width)  # taps near the identity
    return at.wrap(at.ops.moveaxis(out.reshape(*lead, L), -1, axes.index("pos")), axes)


# ------------------------------------------------------------------ emitted code


def _emit_frozen_random(g, *, index, seed):
    P = g.pairs
    if index == "token":
        table = g.buffer(("token", seed, P), f"_frozen_token_table({seed}, VOCAB_SIZE, {P})")
        return f"self.{table}.to(dev)[tokens.long()].view(B, 1, L, 1, {P})"
    return f"_frozen_at({seed}, {P}, pos5)"


def _emit_embedding(g, *, index, to, init):
    width = g.width(to)
    m = g.learned(f"nn.Embedding(VOCAB_SIZE, HEADS * {width})")
    g.init(f"nn.init.normal_({m}.weight, std={init})")
    return f"_per_head_site({m}, tokens.long(), B, L, HEADS, {width})"


def _emit_linear(g, *, input, to, rank, init_bias):
    width = g.width(to)
    g.need_d_model()
    if int(rank) > 0:
        m = g.learned(f"nn.Sequential(nn.Linear(D_MODEL, {rank}, bias=False), nn.Linear({rank}, HEADS * {width}))")
        g.init(f"nn.init.constant_({m}[1].bias, {init_bias})")
    else:
        m = g.learned(f"nn.Linear(D_MODEL, HEADS * {width})")
        g.init(f"nn.init.constant_({m}.bias, {init_bias})")
    return f"_per_head_site({m}, x, B, L, HEADS, {width})"


def _emit_shortconv(g, v, *, width):
    feats, w = g.heads * (g.chans or 1), int(width)
    m = g.learned(f"nn.Conv1d({feats}, {feats}, {w}, groups={feats}, padding={w - 1}, bias=False)")
    g.history(w - 1)  # earlier tokens a decoding step re-reads
    return f"_shortconv({m}, {v}, seg)"


RECORDS = [
    Builtin("frozen_random", (("index", REQUIRED), ("seed", 0)),
            "standard normal values per (token or position, pair), frozen from a seed", _frozen_random_rule, "source",
            names=("index",), static=(("seed", int),),
            arg_rules={"seed": (0, limits.MAX_SEED, False, "a torch seed")},
            site=_frozen_random, emit=_emit_frozen_random),
    Builtin("embedding", (("index", REQUIRED), ("to", "pair"), ("init", 1.0)),
            "a learned table indexed by token, one value per head and pair (init: std of the start values)",
            _embedding_rule, "source", names=("index", "to"), static=(("init", float),),
            arg_rules={"init": (0, limits.MAX_INIT, False, "a standard deviation")},
            learned=True, site=_embedding, emit=_emit_embedding),
    Builtin("linear", (("input", REQUIRED), ("to", "pair"), ("rank", 0), ("init_bias", 0.0)),
            "a learned linear map of the hidden state x to a value per head (and pair or channel)", _linear_rule,
            "source", names=("input", "to"), static=(("rank", int), ("init_bias", float)),
            arg_rules={"rank": (0, limits.MAX_RANK, False, "0 (full rank) or a rank up to the cap"),
                       "init_bias": (-limits.MAX_INIT, limits.MAX_INIT, False, "the start value of the bias")},
            learned=True, site=_linear, emit=_emit_linear),
    Builtin("shortconv", (("v", REQUIRED), ("width", 3)), "a learned causal depthwise convolution over positions",
            _shortconv_rule, "source", static=(("width", int),),
            arg_rules={"width": (1, limits.MAX_RANK, False, "taps of the convolution")},
            learned=True, site=_shortconv, emit=_emit_shortconv),
    Builtin("normalize", (("v", REQUIRED),), "l2-normalise each vector over channels", _normalize_rule, "source",
            run=lambda ops, v: v / ops.norm(v).clip(min=1e-6),  # channels are the last axis
            emit=lambda v: f"F.normalize({v}, dim=-1, eps=1e-6)"),
]
