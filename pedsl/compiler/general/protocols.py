"""What the general forward (:mod:`pedsl.compiler.general`) reads of its ``kernels`` argument, as a Protocol the
type checker holds every supplier to: :class:`~pedsl.compiler.general.forward.TorchKernels` (plain torch, and a
generated module's ``Kernels`` subclass of it) and :class:`~pedsl.compiler.module_values.FusedKernels` (pedsl's
own, in process). Every supplier provides every member; a kernel it has not is None, never a missing attribute.

For annotations only: the modules that name it import it under ``TYPE_CHECKING``, so a generated module (which
carries their marked sections, with ``from __future__ import annotations``) needs none of it at run time.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor


class Kernels(Protocol):
    """The primitives of the general forward: rotations of a transform's channel pairs, the cumulative sum of
    step angles, and the optional fast kernels (None where the supplier has none; ``kernel_support`` asks)."""

    @property
    def layout(self) -> str | None:
        """The pair layout the rotations assume ("interleaved" or "halves"), None: any pairs they are given."""

    @property
    def path_attention(self) -> Callable[..., Any] | None:
        """PaTH's blockwise kernel over a fresh sequence."""

    @property
    def path_local_attention(self) -> Callable[..., Any] | None:
        """PaTH's blockwise kernel inside a window or chunk."""

    @property
    def path_transported_keys(self) -> Callable[..., Any] | None:
        """Every key of a fresh PaTH sequence moved to its last token (what a cache stores)."""

    @property
    def distance_attention(self) -> Callable[..., Any] | None:
        """The Toeplitz kernel of a (heads, distances) bias table."""

    @property
    def distance_supported(self) -> Callable[[Tensor], bool] | None:
        """Whether the Toeplitz and MLP-bias kernels take q (its device and dtype)."""

    @property
    def mlp_attention(self) -> Callable[..., Any] | None:
        """FIRE's MLP-bias kernel."""

    @property
    def bias_attention(self) -> Callable[..., Any] | None:
        """The C++ causal kernel with its bias in the rows."""

    @property
    def bias_ready(self) -> Callable[[], bool] | None:
        """Whether :attr:`bias_attention` is built (the first ask builds it)."""

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor, t: Any, channels: Any) -> Tensor:
        """x with transform t's channel pairs rotated by the angles behind cos and sin."""

    def rotate_by_angles(self, xs: list[Tensor], angles: Tensor, t: Any, channels: Any) -> list[Tensor]:
        """Each of xs with transform t's channel pairs rotated by ``angles``."""

    def cumulative_angles(self, a: Tensor) -> Tensor:
        """The float64 cumulative sum of step angles ``a`` along the token axis."""
