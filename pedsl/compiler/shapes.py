"""Labelled run-time values (:class:`~pedsl.runtime.torch_backend.LT`) as the tensor shapes the kernels take.

Shared by the module (:mod:`pedsl.compiler.module`), its general forward (:mod:`pedsl.compiler.module_values`)
and the reference backend (:mod:`pedsl.compiler.reference`), so none imports another's internals.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pedsl.runtime.torch_backend import LT
from pedsl.errors import CompileError

F64 = torch.float64


def as_table(v: LT, L: int, P: int) -> Tensor:
    if not set(v.axes) <= {"pos", "pair"}:
        raise CompileError(f"a rotation phase must vary only with position and pair, got axes {v.axes}")
    return v.align(("pos", "pair")).expand(L, P).to(F64)


def as_bhlp(v: LT, L: int, P: int) -> Tensor:
    t = v.align(("batch", "head", "pos", "pair"))
    return t.expand(t.shape[0], t.shape[1], L, P)


def as_bhl(v: LT, L: int, H: int) -> Tensor:
    t = v.align(("batch", "head", "pos"))
    return t.expand(t.shape[0], H, L)


def as_hd(v: LT, L: int, H: int) -> Tensor:
    t = v.align(("head", "dist"))
    return t.expand(H, L)


def per_head(v: LT, H: int) -> Tensor:
    t = v.align(("head",)) if v.axes else v.t.reshape(1)
    return t.expand(H)
