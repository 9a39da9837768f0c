"""Learned values and learned functions of distance: learned, bucket, table, mlp.

``learned(init)`` is a trainable parameter that starts at the static value ``init`` and has its axes:
a scalar, one value per head (``learned(slopes(heads))``), per rotary pair (``learned(geometric(base))``),
or per head and pair (``learned(geometric(base), per = head)``: ``per`` adds an axis the start value does
not vary along, every copy starting equal). It stands wherever a number of those axes does - a bias's
slope, a rotation's frequencies, a temperature - and reads nothing at run time but its parameter.

Its call site (:class:`pedsl.runtime.walk.At`) asks the backend for the parameter by the walk's site
name: the torch module holds it as ``learned.sites[<key>].value`` (the module's parameter dtype, float32
unless the model is cast), the numpy sampler of ``pedsl diff --numeric`` starts from ``init`` itself.
The value enters the walk in float64, like a static table, so that products with positions are formed
in float64 and rounded once where they are used.
"""

from __future__ import annotations

import math

from pedsl import limits
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue, need_num, scalar
from pedsl.lang.types import Ty, num

_PER = {"head": "head", "pair": "pair"}


def _learned_rule(a: dict[str, Ty]) -> Ty:
    t = a["init"]
    need_num(t, "init", {"head", "pair"}, " (a start value: a number, or one per head and / or rotary pair)")
    if t.reads:
        raise TypeIssue(f"'init' must be known at compile time, but it reads {', '.join(sorted(d.value for d in t.reads))}",
                        "init", hint="start from a number, a parameter, slopes(heads) or a frequency grid")
    axes = set(t.axes)
    per = a.get("per")
    if per is not None and per.kind != "none":
        if per.kind != "axis" or per.detail not in _PER:
            raise TypeIssue("'per' must be head or pair (the axis the start value is copied along)", "per")
        if _PER[per.detail] in axes:
            raise TypeIssue(f"'init' already has one value per {per.detail}; drop 'per = {per.detail}'", "per")
        axes.add(_PER[per.detail])
    return num(*axes)


def _shape(at, axes: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(at.heads if a == "head" else at.width("pair")[1] for a in axes)


def _learned(at, init, *, per):
    """The parameter at this call site, over the start value's axes and ``per``'s (canonical order)."""
    axes = tuple(a for a in ("head", "pair") if a in init.axes or a == per)
    start, _ = at.aligned_with(init, axes)
    return at.wrap(at.parameter(start, _shape(at, axes)), axes)


def _emit_learned(g, init, *, per):
    heads = g.heads if "head" in g.axes else None
    pairs = g.pairs if "pair" in g.axes else None
    m = g.learned(f"_LearnedValue((lambda dev: {init})(None), {heads}, {pairs})")  # the init's code reads dev
    return f"{m}.at5()"


RECORDS = [
    Builtin("learned", (("init", REQUIRED), ("per", None)),
            "a trainable value starting at the static init, with its axes (a number, per head, per pair); "
            "per = head or per = pair copies it along one more axis", _learned_rule, "source", names=("per",),
            learned=True, site=_learned, emit=_emit_learned, checked_args=("init",)),
]


# ------------------------------------------------------------------ bucket, table, mlp: learned functions of distance


def bucket_of(d: float, buckets: int, max_distance: int, bidirectional: bool) -> int:
    """T5's bucket of a distance d = i - j (Hugging Face's ``_relative_position_bucket`` at relative_position
    = j - i): a key after its query (d < 0) lands in the upper half of a bidirectional layout and in bucket 0
    of a causal one. A plain ``distance`` is never negative; a per-axis one (``distance.t``) is signed."""
    n = buckets // 2 if bidirectional else buckets
    later = bidirectional and d < 0
    d = abs(d) if bidirectional else max(d, 0)
    exact = n // 2
    if d < exact:
        return int(d) + n * later
    large = exact + int(math.log(d / exact) / math.log(max_distance / exact) * (n - exact))
    return min(large, n - 1) + n * later


def _bucket_rule(a: dict[str, Ty]) -> Ty:
    d = a["distance"]
    need_num(d, "distance", {"dist"}, " (the distance i - j)")
    if not d.integer:
        raise TypeIssue("'distance' must be an integer distance (distance, or an integer expression of it)", "distance")
    scalar(a, "buckets", "max_distance", integer=True)
    if a["bidirectional"].kind != "bool":
        raise TypeIssue("'bidirectional' must be true or false", "bidirectional")
    return d.with_(integer=True)


def _bucket_check(buckets: int = 32, max_distance: int = 128, bidirectional: bool = False) -> str | None:
    exact = (buckets // 2 if bidirectional else buckets) // 2
    if exact < 1:
        return f"{buckets} buckets leave no exact bucket" + (" (bidirectional: half of them are for later keys)"
                                                           if bidirectional else "")
    if max_distance <= exact:
        return (f"max_distance = {max_distance} must exceed the {exact} exact buckets (the log-spaced ones reach "
                "from there to max_distance)")
    return None


def _bucket_run(ops, d, *, buckets, max_distance, bidirectional):
    n = buckets // 2 if bidirectional else buckets
    later = (d < 0) * float(n) if bidirectional else d * 0.0  # a key after its query: the upper half
    d = ops.maximum(d, -d) if bidirectional else ops.maximum(d, d * 0)
    exact = n // 2
    far = exact + ops.floor(ops.log(ops.maximum(d, d * 0 + exact) / exact) / math.log(max_distance / exact)
                            * (n - exact))
    small = (d < exact) * 1.0
    return small * d + (1.0 - small) * ops.minimum(far, far * 0 + (n - 1)) + later


def _emit_bucket(d, *, buckets, max_distance, bidirectional):
    return f"_t5_bucket(_t({d}, dev), {buckets}, {max_distance}, {bidirectional})"


def _table_rule(a: dict[str, Ty]) -> Ty:
    i = a["index"]
    need_num(i, "index", {"dist"}, " (an integer index per distance, such as bucket(distance))")
    if not i.integer:
        raise TypeIssue("'index' must be an integer (bucket(distance, ...), or an integer expression of distance)",
                        "index", hint="floor(...) or bucket(...) give integers")
    if i.learned or i.data:
        raise TypeIssue("'index' must be a function of the distance, not of learned values or the data", "index")
    to = a["to"]
    if to.kind != "axis" or to.detail != "head":
        raise TypeIssue("a table gives one value per head: write to = head", "to")
    scalar(a, "size", integer=True)
    scalar(a, "init")
    return num(*(i.axes | {"head"}))


def _table(at, index, *, to, size, init):
    """The learned (size, heads) table read at the index (clamped into the table), over index axes + head."""
    t, axes = at.aligned_with(index, ())
    rows = at.indexed(t.clip(0, size - 1), size, at.heads, init)  # (*index dims, H)
    out_axes = tuple(a for a in ("batch", "head", "pos", "dist") if a in axes or a == "head")
    return at.wrap(at.ops.moveaxis(rows, -1, out_axes.index("head")), out_axes)


def _emit_table(g, index, *, to, size, init):
    m = g.learned(f"nn.Embedding({int(size)}, HEADS)")
    g.init(f"nn.init.normal_({m}.weight, std={init})")
    return f"_table_at({m}, {index}, {int(size)})"


def _mlp_rule(a: dict[str, Ty]) -> Ty:
    f = a["features"]
    need_num(f, "features", {"dist", "pos"}, " (one input feature per distance, such as log(1 + distance))")
    if f.data:
        raise TypeIssue("'features' must be a function of the distance (and query_position), not of the data",
                        "features")
    to = a["to"]
    if to.kind != "axis" or to.detail != "head":
        raise TypeIssue("an mlp gives one value per head: write to = head", "to")
    scalar(a, "hidden", "depth", integer=True)
    if a["relu"].kind != "bool":
        raise TypeIssue("'relu' must be true or false", "relu")
    return num(*(f.axes | {"head"}))


def _mlp(at, features, *, to, hidden, depth, relu):
    """x-transformers' DynamicPositionBias MLP of one feature per distance: Linear(1, hidden), SiLU (ReLU: FIRE),
    then depth - 1 x (Linear(hidden, hidden), SiLU), then Linear(hidden, heads)."""
    t, axes = at.aligned_with(features, ())
    out = at.mlp(t[..., None], hidden, depth, at.heads, relu)  # (*feature dims, H)
    out_axes = tuple(a for a in ("batch", "head", "pos", "dist") if a in axes or a == "head")
    return at.wrap(at.ops.moveaxis(out, -1, out_axes.index("head")), out_axes)


def _emit_mlp(g, features, *, to, hidden, depth, relu):
    m = g.learned(f"_mlp_module({int(hidden)}, {int(depth)}, HEADS, {relu})")
    return f"_mlp_at({m}, {features})"


RECORDS += [
    Builtin("bucket", (("distance", REQUIRED), ("buckets", 32), ("max_distance", 128), ("bidirectional", False)),
            "T5's bucket of the distance: exact below buckets / 2, log-spaced up to max_distance, then the last "
            "(Hugging Face's _relative_position_bucket; bidirectional: the encoder's layout, the upper half for keys "
            "after the query, which a signed per-axis distance such as distance.t reaches)",
            _bucket_rule, "bias", static=(("buckets", int), ("max_distance", int), ("bidirectional", bool)),
            arg_rules={"buckets": (2, limits.MAX_LIST, False, "the number of buckets"),
                       "max_distance": (1, limits.MAX_LENGTH, False, "the distance where the last bucket starts")},
            check=_bucket_check, run=_bucket_run, emit=_emit_bucket, index_rows=lambda buckets, **_: int(buckets)),
    Builtin("table", (("index", REQUIRED), ("to", "head"), ("size", 0), ("init", 0.0)),
            "a learned table, one value per head and index (size rows; 0: the index's own range, e.g. a bucket "
            "count), starting at N(0, init^2)", _table_rule, "source", names=("to",),
            static=(("size", int), ("init", float)),
            arg_rules={"size": (0, limits.MAX_LIST, False, "rows of the table (0: the index's range)"),
                       "init": (0, limits.MAX_INIT, False, "a standard deviation")},
            check=None, derive={"size": "index"}, learned=True, site=_table, emit=_emit_table),
    Builtin("mlp", (("features", REQUIRED), ("hidden", 32), ("to", "head"), ("depth", 2), ("relu", False)),
            "a learned MLP of one feature per distance to a value per head (x-transformers' dynamic position "
            "bias: Linear(1, hidden), SiLU, (depth - 1) x [Linear(hidden, hidden), SiLU], Linear(hidden, heads); "
            "relu = true: ReLU instead of SiLU, as FIRE)",
            _mlp_rule, "source", names=("to",), static=(("hidden", int), ("depth", int), ("relu", bool)),
            arg_rules={"hidden": (1, limits.MAX_RANK, False, "the width of the hidden layers"),
                       "depth": (1, 16, False, "hidden layers")},
            learned=True, site=_mlp, emit=_emit_mlp),
]
