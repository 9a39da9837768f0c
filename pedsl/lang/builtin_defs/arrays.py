"""The array namespace a builtin's run-time evaluation is written over.

:class:`Ops` names the functions a record's ``run`` may call beyond Python's operators and
``.clip`` (which mean the same on numpy arrays and torch tensors). The numpy backend
(:data:`NUMPY`, for ``pedsl diff --numeric``, which must never import torch) is built here; the
torch backend is built by :mod:`pedsl.runtime.torch_backend` from the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Ops:
    log: Callable
    exp: Callable
    sqrt: Callable
    sin: Callable
    cos: Callable
    tanh: Callable
    abs: Callable
    sigmoid: Callable
    log_sigmoid: Callable
    erf: Callable
    floor: Callable
    ceil: Callable
    minimum: Callable
    maximum: Callable
    norm: Callable  # l2 norm over the last axis, kept as a size-1 axis
    moveaxis: Callable  # (array, source, destination)
    concat: Callable  # arrays joined along the first axis
    rows: Callable  # (table, indices) -> the table's rows at the (integer-valued) indices


def _stable_sigmoid(np) -> Callable:
    """1 / (1 + exp(-x)) to full relative precision in both tails (0.5 (1 + tanh(x / 2)) loses the
    negative tail: silu(-21) came out 0 instead of -1.6e-8)."""

    def sigmoid(x):
        e = np.exp(-np.abs(x))
        return np.where(np.asarray(x) >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    return sigmoid


def numpy_ops() -> Ops:
    import math

    import numpy as np

    return Ops(log=np.log, exp=np.exp, sqrt=np.sqrt, sin=np.sin, cos=np.cos, tanh=np.tanh, abs=np.abs,
               sigmoid=_stable_sigmoid(np), log_sigmoid=lambda x: -np.logaddexp(0.0, -x),
               erf=np.vectorize(math.erf, otypes=[np.float64]),
               floor=np.floor, ceil=np.ceil, minimum=np.minimum, maximum=np.maximum,
               norm=lambda x: np.linalg.norm(x, axis=-1, keepdims=True), moveaxis=np.moveaxis,
               concat=np.concatenate, rows=lambda table, idx: table[np.asarray(idx).astype(np.int64)])
