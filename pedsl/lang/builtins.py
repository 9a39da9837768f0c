"""The fixed registry of builtin names and functions, with the signatures the checker knows.

Each function has named parameters (positional or keyword), defaults, a typing
rule and a one-line doc. Nothing outside this registry can be called from a
`.pe` file. Families converted to records (:mod:`pedsl.lang.builtin_defs`: elementwise math,
slopes, log_length) carry every part in their record; for the others the static (compile-time) values of
grids and slopes are computed in :mod:`pedsl.lang.grids` (folded by :mod:`pedsl.lang.fold`) and
the run-time parts in :mod:`pedsl.compiler`.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs import bias, channels, elementwise, grids, temperature
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue
from pedsl.lang.builtin_defs.record import need_num as _need_num
from pedsl.lang.builtin_defs.record import scalar as _scalar
from pedsl.lang.types import BOOL, GROUP, INT, NONE, NUM, Ty, num

# ------------------------------------------------------------------ typing helpers


def _rotate(a: dict[str, Ty]) -> Ty:
    t = a["phase"]
    _need_num(t, "phase", {"pos", "pair"}, " (a phase per position and rotary pair)")
    _scalar(a, "scale")
    if t.data or t.learned:
        raise TypeIssue(
            "a position-indexed rotation cannot depend on the data",
            "phase",
            hint="use accumulate(rotation(...)) for data-dependent angles",
        )
    return Ty("transport", detail="rotate", runtime=t.runtime)


def _rotation(a: dict[str, Ty]) -> Ty:
    t = a["angle"]
    _need_num(t, "angle", {"pos", "pair", "head"}, " (a step angle per position, head and rotary pair)")
    return Ty("step", detail="rotation", data=t.data, learned=t.learned, runtime=t.runtime)


def _householder(a: dict[str, Ty]) -> Ty:
    w, beta = a["w"], a["beta"]
    _need_num(w, "w", {"pos", "head", "chan"}, " (a direction per position, head and channel)")
    if "chan" not in w.axes:
        raise TypeIssue(
            "'w' must be a vector over the channels of a head (num[..., chan])",
            "w",
            hint="make it with linear(x, to = channel)",
        )
    _need_num(beta, "beta", {"pos", "head"}, " (a scalar per position and head)")
    return Ty("step", detail="householder", data=w.data or beta.data, learned=w.learned or beta.learned)


def _accumulate(a: dict[str, Ty]) -> Ty:
    t = a["step"]
    if t.kind == "step":
        return Ty("transport", detail="accumulate " + t.detail, data=t.data, learned=t.learned)
    if t.kind == "num":
        _need_num(t, "step", {"pos", "head"}, " (a log-gate per position and head)")
        return Ty("bias", detail="gate", data=t.data, learned=t.learned)
    raise TypeIssue(
        f"accumulate() takes a step (rotation(...), householder(...)) or a log-gate, not {t.show()}",
        "step",
    )


def _index(t: Ty, arg: str) -> None:
    if t.kind not in ("token",) and not (t.kind == "num" and t.axes == frozenset({"pos"}) and t.integer):
        raise TypeIssue(f"'{arg}' must be 'token' or 'position'", arg)


def _frozen_random(a: dict[str, Ty]) -> Ty:
    _index(a["index"], "index")
    _scalar(a, "seed", integer=True)
    return num("pos", "pair", data=a["index"].kind == "token")


def _axis(t: Ty, arg: str) -> str:
    if t.kind != "axis" or t.detail not in ("head", "pair", "channel"):
        raise TypeIssue(f"'{arg}' must be one of head, pair, channel", arg)
    return {"channel": "chan"}.get(t.detail, t.detail)


def _embedding(a: dict[str, Ty]) -> Ty:
    if a["index"].kind != "token":
        raise TypeIssue("embedding() is indexed by 'token'", "index")
    to = _axis(a["to"], "to")
    _scalar(a, "init")
    axes = {"pos", "head"} | ({to} if to != "head" else set())
    return num(*axes, data=True, learned=True)


def _linear(a: dict[str, Ty]) -> Ty:
    if a["input"].kind != "hidden":
        raise TypeIssue("linear() reads the hidden state 'x'", "input")
    to = _axis(a["to"], "to")
    _scalar(a, "rank", integer=True)
    _scalar(a, "init_bias")
    axes = {"pos", "head"} | ({to} if to != "head" else set())
    return num(*axes, data=True, learned=True)


def _shortconv(a: dict[str, Ty]) -> Ty:
    _need_num(a["v"], "v")
    _scalar(a, "width", integer=True)
    if "pos" not in a["v"].axes:
        raise TypeIssue("shortconv() convolves along positions; its input must vary with position", "v")
    return a["v"].with_(learned=True)


def _normalize(a: dict[str, Ty]) -> Ty:
    _need_num(a["v"], "v")
    if "chan" not in a["v"].axes:
        raise TypeIssue("normalize() works on vectors over channels (num[..., chan])", "v")
    return a["v"].with_(integer=False)


B = Builtin
_BUILTINS = [
    *elementwise.RECORDS,  # families converted to records (pedsl.lang.builtin_defs), in table order
    *grids.RECORDS,
    # biases and temperatures
    *bias.RECORDS,
    *temperature.RECORDS,
    *channels.RECORDS,
    # transports
    B("rotate", (("phase", REQUIRED), ("scale", 1.0)),
      "position-indexed rotation of each pair by its phase; q and k of the group are also multiplied by scale "
      "(Hugging Face's attention factor: the group's logits scale by scale^2)", _rotate, "transport"),
    B("accumulate", (("step", REQUIRED),),
      "ordered product of per-token steps from j+1 to i (or sum of log-gates: a bias)", _accumulate, "transport"),
    B("rotation", (("angle", REQUIRED),), "SO(2) step: rotate each pair by -angle", _rotation, "transport"),
    B("householder", (("w", REQUIRED), ("beta", REQUIRED)), "Householder-like step I - beta w w^T",
      _householder, "transport"),
    # step sources
    B("frozen_random", (("index", REQUIRED), ("seed", 0)),
      "standard normal values per (token or position, pair), frozen from a seed", _frozen_random, "source"),
    B("embedding", (("index", REQUIRED), ("to", "pair"), ("init", 1.0)),
      "a learned table indexed by token, one value per head and pair (init: std of the start values)",
      _embedding, "source"),
    B("linear", (("input", REQUIRED), ("to", "pair"), ("rank", 0), ("init_bias", 0.0)),
      "a learned linear map of the hidden state x to a value per head (and pair or channel)", _linear, "source"),
    B("shortconv", (("v", REQUIRED), ("width", 3)), "a learned causal depthwise convolution over positions",
      _shortconv, "source"),
    B("normalize", (("v", REQUIRED),), "l2-normalise each vector over channels", _normalize, "source"),
]
del B

FUNCTIONS: dict[str, Builtin] = {b.name: b for b in _BUILTINS}

# Names with a fixed meaning. Structural ones (heads, head_dim) come from the model.
# Builtins that own trainable parameters (one call site each, named by the run-time walk).
LEARNED = frozenset({"linear", "embedding", "shortconv"})

# Builtins whose static value reads the run-time length n without naming it (their type is
# ``runtime``): a value folded once must not be reused at another length.
READS_LENGTH = frozenset(b.name for b in _BUILTINS if b.reads_length)

CONSTANTS: dict[str, Ty] = {
    "pi": NUM,
    "e": NUM,
    "position": num("pos", integer=True),
    "distance": num("dist", integer=True),
    "n": INT.with_(runtime=True),
    "heads": INT,
    "head_dim": INT,
    "x": Ty("hidden", data=True),
    "token": Ty("token", data=True),
    "none": NONE,
    "all": GROUP,
    "rest": GROUP,
    "head": Ty("axis", detail="head"),
    "pair": Ty("axis", detail="pair"),
    "channel": Ty("axis", detail="channel"),
}

# Structural names the model fixes; schemes may override them with a param of the same name.
STRUCTURAL_DEFAULTS = {"heads": 4, "head_dim": 32}

# Lint warnings that `allow NAME` may silence.
WARNINGS = {
    "frayed_frequencies": "W101",
    "temperature_without_length": "W102",
    "nonorthogonal_value": "W103",
    "no_spectral_gap": "W104",
    "unused": "W105",
    "constant_bias": "W106",
}

KEYWORDS = {
    "scheme", "extends", "import", "param", "let", "layout", "channels", "on", "bias",
    "temperature", "train", "eval", "allow", "qk", "qkv", "true", "false",
    "int", "float", "bool", "str", "halves", "interleaved",
}

__all__ = ["FUNCTIONS", "CONSTANTS", "WARNINGS", "REQUIRED", "Builtin", "TypeIssue", "BOOL", "KEYWORDS"]
