"""The inputs the scheme's expressions read (:class:`Window`: the cache's last tokens then the call's) and
what the scheme computes from them per token (:class:`TokenValues`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from pedsl.compiler.general.inputs import Layout, document_ids_vary
from pedsl.compiler.general.cache import AttentionCache

# <embedded>
# ---------------------------------------------------------------------- values
class Window:
    """The inputs the expressions read: the cache's last tokens (short convolutions) then this call's.
    ``parts`` holds x, tokens, positions, docs and valid over ``Lw`` tokens (``L`` of them new)."""

    def __init__(self, lay: Layout, x, tokens, cache, device):
        self.L = lay.positions.shape[1]
        parts = dict(x=x, tokens=tokens, positions=lay.positions, docs=lay.docs, valid=lay.valid, axes_pos=lay.axes_pos)
        w = cache.window if cache is not None else None
        if w is not None and w["positions"].shape[1]:
            parts = {k: (None if v is None else torch.cat([w[k].to(v.dtype), v], dim=1)) for k, v in parts.items()}
        self.parts = parts
        self.Lw = parts["positions"].shape[1]
        self.n, self.device = lay.n, device
        self.segmented = lay.padded or document_ids_vary(lay.docs) or self.Lw != self.L

    def keep(self, cache: AttentionCache, history: int) -> None:
        """Store the last ``history`` tokens' inputs in the cache (what the widest short convolution reads)."""
        if history:
            cache.window = {k: (None if v is None else v[:, v.shape[1] - min(history, v.shape[1]):].detach())
                            for k, v in self.parts.items()}


class TokenValues(NamedTuple):
    """What the scheme computes per token over a window (float64 where static):

    ``transports[i]`` for transform i: ROPE a phase ``(B|1, H|1, Lw, P)`` or ready ``(cos, sin)`` tables
    (scale included, angle dtype); SO2 the step angles ``(B|1, H|1, Lw, P)``; HOUSEHOLDER ``(w, beta)``,
    w ``(B|1, H, Lw, C)`` over the group's channels, beta ``(B|1, H|1, Lw)``. ``biases[i]`` is
    ``(kind, value)``: LINEAR_BIAS the slope ``(H,)``, GATE_BIAS the log gates ``(B|1, H|1, Lw)``,
    TABLE_BIAS None (read through ``distance_table``). ``tau``: the temperature ``(B|1, H|1, Lw)`` or None.
    """

    transports: list
    biases: list
    tau: Tensor | None = None
# </embedded>
