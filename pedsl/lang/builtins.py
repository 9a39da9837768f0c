"""The fixed registry of builtin names and functions, and the language's fixed names.

Every builtin is one record of :mod:`pedsl.lang.builtin_defs` (named parameters, positional or
keyword, with defaults; a typing rule; a one-line doc; its static fold, run-time value and emitted
code): :data:`FUNCTIONS` lists them in table order. What a call reads beyond its arguments (the
positions, the run-time length, trainable parameters) is read off its record by
:func:`~pedsl.lang.builtin_defs.record.own_reads`, and the checker stores it in each expression's
type (docs/semantics.md §1a) - consumers ask the type, not a set of builtin names. Nothing outside
this registry can be called from a `.pe` file.
"""

from __future__ import annotations

from pedsl.lang.builtin_defs import RECORDS
from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, TypeIssue
from pedsl.lang.types import BOOL, GROUP, INT, NONE, NUM, Dep, Kind, Ty, num

FUNCTIONS: dict[str, Builtin] = dict(RECORDS)

# The families of builtins (a record's ``category``) and what their values are, in the order of the
# tables of docs/language.md (and of an editor's hover).
CATEGORIES = [
    ("math", "Math (elementwise; broadcast by axis)"),
    ("grid", "Frequency grids (num[pair]; rot_dim = the group's channel count)"),
    ("bias", "Biases"),
    ("temperature", "Temperatures"),
    ("channels", "Channel groups (inside `channels { ... }`)"),
    ("transport", "Transports and steps"),
    ("source", "Step sources (data-dependent or learned)"),
    ("axes", "Position axes (schemes with `axes ...`)"),
]

# Names with a fixed meaning. Structural ones (heads, head_dim) come from the model.
CONSTANTS: dict[str, Ty] = {
    "pi": NUM,
    "e": NUM,
    "position": num("pos", integer=True, reads=frozenset({Dep.POSITION})),
    "distance": num("dist", integer=True, reads=frozenset({Dep.POSITION})),
    # the query's position i, readable in a bias (FIRE's normaliser); elsewhere it is ``position``
    "query_position": num("pos", integer=True, reads=frozenset({Dep.POSITION})),
    "n": INT.with_(reads=frozenset({Dep.LENGTH})),
    "heads": INT,
    "head_dim": INT,
    "x": Ty(Kind.HIDDEN, reads=frozenset({Dep.DATA})),
    "token": Ty(Kind.TOKEN, reads=frozenset({Dep.TOKEN})),
    "none": NONE,
    "all": GROUP,
    "rest": GROUP,
    "head": Ty(Kind.AXIS, detail="head"),
    "pair": Ty(Kind.AXIS, detail="pair"),
    "channel": Ty(Kind.AXIS, detail="channel"),
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

__all__ = ["FUNCTIONS", "CATEGORIES", "CONSTANTS", "WARNINGS", "REQUIRED", "Builtin", "TypeIssue", "BOOL"]
