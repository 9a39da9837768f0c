"""What the general forward (:mod:`pedsl.compiler.general`) reads of its ``scheme`` and ``kernels`` arguments,
as Protocols the type checker holds every supplier to.

``scheme`` (:class:`SchemeSide`): :class:`~pedsl.compiler.module_values.ModuleScheme` (``SchemeAttention``'s
adapter, in process) and the class of a generated module (:mod:`pedsl.compiler.codegen`; no checker reads that
text, so compiler_tests/compiler/test_compiler_codegen.py checks its members at run time); a lowering plan
supplies its window part (:class:`WindowSide`: ``shape_of(plan)``). Every supplier provides every member; what
it has not is None (or an empty tuple), never a missing attribute.

``kernels`` (:class:`Kernels`): :class:`~pedsl.compiler.general.forward.TorchKernels` (plain torch, and a
generated module's ``Kernels`` subclass of it) and :class:`~pedsl.compiler.module_values.FusedKernels` (pedsl's
own, in process). Every supplier provides every member; a kernel it has not is None, never a missing attribute.

For annotations only: the modules that name it import it under ``TYPE_CHECKING``, so a generated module (which
carries their marked sections, with ``from __future__ import annotations``) needs none of it at run time.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor, device as Device, dtype as DType

from pedsl.compiler.general.mask_side import MaskSide
from pedsl.compiler.general.values import TokenValues, Window


class WindowSide(MaskSide, Protocol):
    """What ``shape_of`` reads: the mask (a symmetric window beside a non-causal one), the window and chunk."""

    @property
    def window(self) -> int | None:
        """Each query sees the keys less than this far back (both ways beside a non-causal mask), or None."""

    @property
    def chunk(self) -> int | None:
        """Each query sees the keys of its own chunk of this many positions, or None."""

    def __getattr__(self, name: str) -> Any:
        """The value a statement carries (pedsl.lang.statements.CARRIED) with no member declared here, by its
        name: every supplier has every carried value (a plan, ``ModuleScheme``, a generated module's class)."""


class SchemeSide(WindowSide, Protocol):
    """Everything the general forward reads of ``scheme``: the plan's decisions, the scheme's values and tables,
    its learned parameters."""

    heads: int
    head_dim: int
    axes: tuple[str, ...]  # the position axes (none: one)
    conv_history: int  # earlier tokens a short convolution re-reads
    transforms: tuple[Any, ...]  # the transports' records: kind, channels, scale (and the pairs' halves)
    normalize: str  # softmax, softmax1, sigmoid, stick-breaking or differential
    attend_current: bool  # stick-breaking: whether a query's own key counts
    sigmoid_bias: float  # normalize = sigmoid: the bias inside sigmoid(s + b)
    lambda_init: float  # normalize = differential: lambda's constant
    sink: str | None  # "logit", "token" or None
    softcap: float | None
    fast_paths: tuple[str, ...]  # Plan.kernels: the fast kernels the plan's features allow
    cope_max_pos: int | None  # CoPE's positions, with its contextual_embedding
    remap_bounds: tuple[tuple[int, int | None], ...]  # remapped positions: each regime's distances; (): none
    remap_chunk: int | None  # remap(chunk = c): the bounds are of floor(p_i / c) - floor(p_j / c), not p_i - p_j
    # content-position terms: (kind, max_distance, dim, buckets, c2p, p2c) or None (pedsl.compiler.general.relative)
    relative: tuple[str, int, int, int, bool, bool] | None

    @property
    def sink_logit(self) -> Tensor | None:
        """sink = logit: the learned logit of each head (heads,)."""

    @property
    def sink_key(self) -> Tensor | None:
        """sink = token: the learned key (heads, head_dim)."""

    @property
    def sink_value(self) -> Tensor | None:
        """sink = token: the learned value (heads, head_dim)."""

    @property
    def contextual_embedding(self) -> Tensor | None:
        """CoPE's embedding ((heads,) cope_max_pos, head_dim)."""

    @property
    def relative_keys(self) -> Tensor | None:
        """The table the queries read: Shaw's (2K + 1, D), DeBERTa's (2 buckets, H, D), Transformer-XL's W_R
        (dim, H, D)."""

    @property
    def relative_queries(self) -> Tensor | None:
        """DeBERTa's p2c table (2 buckets, H, D) the keys read, or None."""

    @property
    def relative_u(self) -> Tensor | None:
        """Transformer-XL's u (H, D), dotted with every key, or None."""

    @property
    def relative_v(self) -> Tensor | None:
        """Transformer-XL's v (H, D), added to the queries reading the table, or None."""

    @property
    def differential_lambda(self) -> Tensor | None:
        """normalize = differential: the learned lambda rows (4, head_dim)."""

    @property
    def dense(self) -> Any:
        """The learned generators of each dense rotation, by its transform's index as text (an ``nn.ModuleDict`` of
        :class:`pedsl.compiler.general.dense.DenseGenerators`; empty without one)."""

    @property
    def query_mlp(self) -> Callable[[int, Tensor, Device], tuple[Tensor, ...] | None] | None:
        """Bias i's FIRE factors for the MLP-bias kernel (None: not of that form), or None: the supplier never
        gives them (its bias runs by blocks of queries)."""

    @property
    def remap_rotate(self) -> Callable[[Tensor, Tensor, int, str, int], Tensor] | None:
        """``(x, positions, regime, role, n)``: x rotated at a regime's query or key positions; None where
        ``remap_bounds`` is empty."""

    def token_values(self, win: Window, dtype: DType) -> TokenValues:
        """The per-token values of the window's tokens."""

    def distance_table(self, i: int, size: int, device: Device) -> Tensor:
        """Bias i over distances 0..size-1, (heads, size) float64."""

    def query_table(self, i: int, qpos: Tensor, size: int, device: Device, n_run: int | None = None) -> Tensor:
        """Bias i (it reads query_position) at the queries' positions (B, rows): (B|1, heads, rows, size)."""

    def axis_table(self, i: int, dist: Tensor, qpos: Tensor) -> Tensor:
        """Bias i over per-axis distances (B, rows, keys, A) at a block of pairs: (B|1, heads, rows, keys)."""


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
        """FIRE's MLP-bias kernel; it may answer None for a call it does not take (the blocks of queries run)."""

    @property
    def band_attention(self) -> Callable[..., Any] | None:
        """The C++ sliding-window kernel ``(q, k, v, window)``."""

    @property
    def bias_attention(self) -> Callable[..., Any] | None:
        """The C++ causal kernel with its bias in the rows."""

    @property
    def bias_ready(self) -> Callable[[], bool] | None:
        """Whether :attr:`bias_attention` and :attr:`band_attention` are built (the first ask builds them)."""

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor, t: Any, channels: Any) -> Tensor:
        """x with transform t's channel pairs rotated by the angles behind cos and sin."""

    def rotate_by_angles(self, xs: list[Tensor], angles: Tensor, t: Any, channels: Any) -> list[Tensor]:
        """Each of xs with transform t's channel pairs rotated by ``angles``."""

    def cumulative_angles(self, a: Tensor) -> Tensor:
        """The float64 cumulative sum of step angles ``a`` along the token axis."""
