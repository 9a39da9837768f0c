"""Length-dependent temperatures: log_length (one record)."""

from __future__ import annotations

import math

from pedsl.lang.builtin_defs.record import REQUIRED, Builtin, scalar
from pedsl.lang.types import Ty, num


def _log_length(a: dict[str, Ty]) -> Ty:
    scalar(a, "length")
    return num("pos")


RECORDS = [
    Builtin(
        "log_length", (("length", REQUIRED),), "max(1, ln(i + 1) / ln(length)) per query position", _log_length,
        "temperature", inputs=("position",), static=(("length", float),),
        arg_rules={"length": (1, math.inf, True, "ln(length) divides: it must be > 1")},
        fold=lambda i, length: max(1.0, math.log(i + 1) / math.log(length)),
        run=lambda ops, pos, length: (ops.log(pos + 1) / math.log(length)).clip(min=1.0),
        emit=lambda pos, length: f"torch.clamp(torch.log({pos} + 1) / math.log({length}), min=1.0)",
    ),
]
