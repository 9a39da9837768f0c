"""The first part of the general forward's :class:`~pedsl.compiler.general.protocols.SchemeSide`: what the
masks read of a scheme. A module of its own because the modules below the forward's values (inputs, cache,
masks) read it too, and the protocols module imports those values: from there it would close a circle.

For annotations only: the modules that name it import it under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from typing import Protocol


class MaskSide(Protocol):
    """What :mod:`pedsl.compiler.general.masks` reads of a scheme: its mask. A lowering plan and
    ``SchemeAttention`` supply it too (``shape_of(plan)``, ``AttentionCache(module)``)."""

    @property
    def mask(self) -> str:
        """causal, bidirectional, prefix or spans."""

    @property
    def mask_prefix(self) -> int | None:
        """``mask = prefix(N)``: N, the positions below it see each other; None for the other masks."""
