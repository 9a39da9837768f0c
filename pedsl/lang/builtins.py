"""The fixed registry of builtin names and functions, and the language's fixed names.

Every builtin is one record of :mod:`pedsl.lang.builtin_defs` (named parameters, positional or
keyword, with defaults; a typing rule; a one-line doc; its static fold, run-time value and emitted
code): :data:`FUNCTIONS` lists them in table order, and the name sets consumers ask about
(:data:`LEARNED`, :data:`READS_LENGTH`, :data:`RUNTIME_SOURCES`) are read off the records. Nothing
outside this registry can be called from a `.pe` file.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue
from pedsl.lang.types import BOOL, GROUP, INT, NONE, NUM, Ty, num

FUNCTIONS: dict[str, Builtin] = dict(RECORDS)

# Builtins that own trainable parameters (one call site each, named by the run-time walk).
LEARNED = frozenset(b.name for b in RECORDS.values() if b.learned)

# Builtins whose value reads run-time inputs or state without naming them (a position, a frozen
# table, a learned site): never a static table.
RUNTIME_SOURCES = frozenset(b.name for b in RECORDS.values() if b.inputs or b.site)

# Builtins whose static value reads the run-time length n without naming it (their type is
# ``runtime``): a value folded once must not be reused at another length.
READS_LENGTH = frozenset(b.name for b in RECORDS.values() if b.reads_length)

# Names with a fixed meaning. Structural ones (heads, head_dim) come from the model.
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
