"""The fixed registry of builtin names and functions, with the signatures the checker knows.

Each function has named parameters (positional or keyword), defaults, a typing
rule and a one-line doc. Nothing outside this registry can be called from a
`.pe` file. Families converted to records (:mod:`pedsl.lang.builtin_defs`: elementwise math,
slopes, log_length) carry every part in their record; for the others the static (compile-time) values of
grids and slopes are computed in :mod:`pedsl.lang.grids` (folded by :mod:`pedsl.lang.fold`) and
the run-time parts in :mod:`pedsl.compiler`.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs import bias, elementwise, temperature
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue
from pedsl.lang.builtin_defs.record import need_num as _need_num
from pedsl.lang.builtin_defs.record import scalar as _scalar
from pedsl.lang.types import BOOL, GROUP, INT, NONE, NUM, Dep, Ty, num

# ------------------------------------------------------------------ typing helpers


def _grid(*scalars: str):
    def rule(a: dict[str, Ty]) -> Ty:
        _scalar(a, *scalars)
        return num("pair")

    return rule


def _yarn(a: dict[str, Ty]) -> Ty:
    _scalar(a, "base", "factor", "original", "beta_fast", "beta_slow")
    _flag(a, "truncate")
    return num("pair")


def _flag(a: dict[str, Ty], name: str) -> None:
    if a[name].kind != "bool":
        raise TypeIssue(f"'{name}' must be true or false, not {a[name].show()}", name)


def _static_scalar(*names: str):
    def rule(a: dict[str, Ty]) -> Ty:
        _scalar(a, *names)
        return num()

    return rule


def _longrope(a: dict[str, Ty]) -> Ty:
    _scalar(a, "base", "original")
    for name in ("short_factor", "long_factor"):
        if a[name].kind != "list":
            raise TypeIssue(f"'{name}' must be a list of numbers, one per rotary pair", name)
    return num("pair")


def _group_spec(a: dict[str, Ty]) -> Ty:
    for k, t in a.items():
        _scalar(a, k)
    return GROUP


def _quarters(a: dict[str, Ty]) -> Ty:
    for k in a:
        _scalar(a, k, integer=True)
    return GROUP


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
    return Ty("transport", detail="rotate")


def _rotation(a: dict[str, Ty]) -> Ty:
    t = a["angle"]
    _need_num(t, "angle", {"pos", "pair", "head"}, " (a step angle per position, head and rotary pair)")
    return Ty("step", detail="rotation")


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
    return Ty("step", detail="householder")


def _accumulate(a: dict[str, Ty]) -> Ty:
    t = a["step"]
    if t.kind == "step":
        return Ty("transport", detail="accumulate " + t.detail)
    if t.kind == "num":
        _need_num(t, "step", {"pos", "head"}, " (a log-gate per position and head)")
        return Ty("bias", detail="gate")
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
    return num("pos", "pair")


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
    return num(*axes)


def _linear(a: dict[str, Ty]) -> Ty:
    if a["input"].kind != "hidden":
        raise TypeIssue("linear() reads the hidden state 'x'", "input")
    to = _axis(a["to"], "to")
    _scalar(a, "rank", integer=True)
    _scalar(a, "init_bias")
    axes = {"pos", "head"} | ({to} if to != "head" else set())
    return num(*axes)


def _shortconv(a: dict[str, Ty]) -> Ty:
    _need_num(a["v"], "v")
    _scalar(a, "width", integer=True)
    if "pos" not in a["v"].axes:
        raise TypeIssue("shortconv() convolves along positions; its input must vary with position", "v")
    return a["v"]


def _normalize(a: dict[str, Ty]) -> Ty:
    _need_num(a["v"], "v")
    if "chan" not in a["v"].axes:
        raise TypeIssue("normalize() works on vectors over channels (num[..., chan])", "v")
    return a["v"].with_(integer=False)


def _per_pair(a: dict[str, Ty]) -> Ty:
    if a["values"].kind != "list":
        raise TypeIssue("per_pair() takes a list of numbers, one per rotary pair", "values")
    return num("pair")


B = Builtin
_BUILTINS = [
    *elementwise.RECORDS,  # families converted to records (pedsl.lang.builtin_defs), in table order
    # frequency grids (num[pair]); rot_dim is the channel group's size
    B("geometric", (("base", 10000.0),), "RoPE grid w_k = base^(-2k / rot_dim)", _grid("base"), "grid"),
    B("ntk", (("base", REQUIRED), ("factor", REQUIRED)),
      "NTK-aware grid: base * factor^(rot_dim / (rot_dim - 2))", _grid("base", "factor"), "grid"),
    B("dynamic_ntk", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED)),
      "dynamic NTK: the NTK grid with factor (factor * n / original) - (factor - 1) when n > original",
      _grid("base", "factor", "original"), "grid", reads=(Dep.LENGTH,)),
    B("yarn", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED), ("beta_fast", 32.0),
               ("beta_slow", 1.0), ("truncate", True)),
      "YaRN as Hugging Face and the authors compute it: blend w / factor and w by a ramp over the pair index "
      "between the correction dimensions of beta_fast and beta_slow rotations (floor/ceil when truncate)",
      _yarn, "grid"),
    B("yarn_wavelength", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED), ("alpha", 1.0),
                          ("beta", 32.0)),
      "YaRN's paper formula: blend w / factor and w by the ramp of r = original * w / (2 pi) from alpha to beta",
      _grid("base", "factor", "original", "alpha", "beta"), "grid"),
    B("longrope", (("base", REQUIRED), ("short_factor", REQUIRED), ("long_factor", REQUIRED), ("original", REQUIRED)),
      "LongRoPE: geometric(base) / short_factor while n <= original, / long_factor beyond (lists, one per pair)",
      _longrope, "grid", reads=(Dep.LENGTH,)),
    B("llama3", (("base", REQUIRED), ("factor", REQUIRED), ("original", REQUIRED),
                 ("low_freq_factor", 1.0), ("high_freq_factor", 4.0)),
      "Llama 3 wavelength rule: keep high frequencies, divide low ones by factor, smooth between",
      _grid("base", "factor", "original", "low_freq_factor", "high_freq_factor"), "grid"),
    B("span", (("length", REQUIRED), ("cycles", 2.0), ("period", 32.0)),
      "RoPE-ID grid: geometric from 2 pi cycles / length (>= cycles turns in length) to 2 pi / period",
      _grid("length", "cycles", "period"), "grid"),
    B("logspace", (("first", REQUIRED), ("last", REQUIRED)),
      "one value per pair, geometrically spaced from first to last", _grid("first", "last"), "grid"),
    B("per_pair", (("values", REQUIRED),), "a list with one number per rotary pair", _per_pair, "grid"),
    # biases and temperatures
    *bias.RECORDS,
    *temperature.RECORDS,
    B("yarn_mscale", (("factor", REQUIRED), ("mscale", 0.0), ("mscale_all_dim", 0.0), ("attention_factor", 0.0)),
      "Hugging Face's YaRN attention factor (0 means unset): attention_factor, else "
      "g(mscale) / g(mscale_all_dim) when both are set, else g(1); g(m) = 0.1 m ln(factor) + 1 (1 if factor <= 1)",
      _static_scalar("factor", "mscale", "mscale_all_dim", "attention_factor"), "temperature"),
    B("longrope_mscale", (("factor", REQUIRED), ("original", REQUIRED), ("attention_factor", 0.0)),
      "Hugging Face's LongRoPE attention factor: attention_factor if set (not 0), else "
      "sqrt(1 + ln(factor) / ln(original)) (1 if factor <= 1)",
      _static_scalar("factor", "original", "attention_factor"), "temperature"),
    # channel groups
    B("fraction", (("f", REQUIRED),), "the first f * head_dim channels", _group_spec, "channels"),
    B("quarters", (("a", REQUIRED), ("b", None), ("c", None), ("d", None)),
      "the listed quarters (1-4) of the head's channels", _quarters, "channels"),
    B("range", (("start", REQUIRED), ("stop", REQUIRED)), "channels start .. stop - 1", _group_spec, "channels"),
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
      _embedding, "source", reads=(Dep.LEARNED,)),
    B("linear", (("input", REQUIRED), ("to", "pair"), ("rank", 0), ("init_bias", 0.0)),
      "a learned linear map of the hidden state x to a value per head (and pair or channel)", _linear, "source",
      reads=(Dep.LEARNED,)),
    B("shortconv", (("v", REQUIRED), ("width", 3)), "a learned causal depthwise convolution over positions",
      _shortconv, "source", reads=(Dep.LEARNED,)),
    B("normalize", (("v", REQUIRED),), "l2-normalise each vector over channels", _normalize, "source"),
]
del B

FUNCTIONS: dict[str, Builtin] = {b.name: b for b in _BUILTINS}


# Names with a fixed meaning. Structural ones (heads, head_dim) come from the model.
CONSTANTS: dict[str, Ty] = {
    "pi": NUM,
    "e": NUM,
    "position": num("pos", integer=True, reads=frozenset({Dep.POSITION})),
    "distance": num("dist", integer=True, reads=frozenset({Dep.POSITION})),
    "n": INT.with_(reads=frozenset({Dep.LENGTH})),
    "heads": INT,
    "head_dim": INT,
    "x": Ty("hidden", reads=frozenset({Dep.DATA})),
    "token": Ty("token", reads=frozenset({Dep.TOKEN})),
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
