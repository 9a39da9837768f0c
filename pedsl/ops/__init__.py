"""Functional attention kernels for positional encodings (layout ``(B, H, L, D)``).

- :mod:`rotary`: RoPE-family pair rotations (docs/semantics.md §2a);
- :mod:`accumulate`: accumulated SO(2) transports (docs/semantics.md §2b, 5.1, 5.2);
- :mod:`alibi`: ALiBi slopes (docs/semantics.md §3);
- :mod:`bias`: separable / materialised / FlexAttention biased causal attention (docs/semantics.md §5.6, 5.7);
- :mod:`distance_bias`: causal attention with a bias of the distance only (a Toeplitz bias: T5, DPB,
  KERPLE, Sandwich), the table read in place per block of queries (docs/semantics.md §3);
- :mod:`path`: PaTH Householder transports (docs/semantics.md §2b, 5.3);
- :mod:`reference`: the naive float64 oracle of docs/semantics.md §1 (tests only).
"""

from pedsl.ops.accumulate import cumulative_angles, so2_accumulated_attention
from pedsl.ops.alibi import alibi_slopes
from pedsl.ops.bias import (
    alibi_bias,
    alibi_key_term,
    alibi_score_mod,
    flex_bias_attention,
    forget_key_term,
    materialized_bias_attention,
    separable_bias_attention,
)
from pedsl.ops.distance_bias import distance_bias_attention
from pedsl.ops.rotary import (
    apply_rotary,
    apply_rotary_channels,
    geometric_freqs,
    rotary_cos_sin,
    rotate_by_angles,
    rotate_many_by_angles,
)

from pedsl.ops.path import path_attention, path_attention_naive

__all__ = [
    "alibi_bias",
    "alibi_key_term",
    "alibi_score_mod",
    "alibi_slopes",
    "apply_rotary",
    "apply_rotary_channels",
    "cumulative_angles",
    "distance_bias_attention",
    "flex_bias_attention",
    "forget_key_term",
    "geometric_freqs",
    "materialized_bias_attention",
    "path_attention",
    "path_attention_naive",
    "rotary_cos_sin",
    "rotate_by_angles",
    "rotate_many_by_angles",
    "separable_bias_attention",
    "so2_accumulated_attention",
]
