"""The general forward of a compiled scheme, written once: positions, documents, padding and attention
masks, grouped-query attention, queries behind their keys, and the decoding cache.

This package needs nothing but torch and :mod:`pedsl.ops.window_kernels` (the O(L N) banded
kernels of sliding windows and chunks, torch only too); the C++ kernels (a sliding window's band kernel, biases
in the rows of the causal kernel, FIRE's MLP-bias kernel, PaTH's rows) it reaches through its ``kernels``
argument, pedsl's in process and the carried copies in a generated module, where they are built. ``SchemeAttention``
runs it (through :mod:`pedsl.compiler.stream`) whenever a call is more than one full causal sequence at
positions 0..L-1 with as many key/value heads as query heads (that case keeps the fused kernels of
``module.py``). ``pedsl compile`` copies the marked section of each of its modules, in the order of
``embedded.EMBEDDED`` and into one flat namespace, verbatim into the module it writes (a test checks the
copy byte for byte). Its modules, each after those it reads: ``masks`` (which pairs a mask statement
opens), ``remap`` (scores of remapped positions), ``inputs`` (the layout of a call), ``cache`` (the
decoding cache), ``windows`` (sliding windows and chunks), ``values`` (what the expressions read),
``transport`` (rotations and Householder steps), ``bias`` (float64 coordinates and distance tables),
``attention`` (blocks of queries and the kernels they dispatch to), ``path`` (PaTH) and ``forward``
(:func:`general_forward`). What a call means:

* k, v ``(B, Hkv, L, D)`` are L new tokens; q ``(B, Hq, Lq, D)`` are the queries of the *last* Lq
  of them (Lq <= L); with a cache, every cached token precedes them. ``Hq`` is a multiple of
  ``Hkv``: query head ``h`` reads key/value head ``h // (Hq / Hkv)`` (GQA / MQA). k and v stay at
  ``Hkv`` heads unless the scheme's transport differs per head (learned per-head angles, PaTH),
  which needs one transported key per query head.
* ``positions (B, L)``: integer positions, read by every position-indexed quantity (RoPE phases,
  distance biases, position-indexed steps, temperatures). Default: the index of the token inside
  its document, counting only unpadded tokens, continuing the cache.
  A scheme with ``axes a_1, ..., a_A`` (A > 1) takes ``positions (A, B, L)``, Hugging Face's layout of
  multi-axis ``position_ids``: ``position.a`` reads row a. Its one-axis position (the run-time length,
  where decoding continues) is the largest over the axes; without positions every axis reads the
  default above, so decoding after an image continues every axis at the largest position of the row's
  last token + 1 (HF's ``rope_deltas``). Positions may go back along an axis (rows of an image).
* ``document_ids (B, L)``: a token attends only inside its document; every accumulated quantity
  (cumulative angles, forget-gate sums, Householder products, short convolutions) restarts at a
  boundary. (Transports and gate sums between two tokens of one document only involve that
  document's steps, so they restart by construction; short convolutions are cut explicitly.)
* ``attn_mask``: boolean. ``(B, L)`` or ``(B, Lc + L)`` marks padding: a padded token does not
  exist - no query attends to it, its steps are the identity (angle 0, log-gate 0, beta 0) and
  short convolutions read zeros there - so a left-padded row equals the row unpadded. ``(B, 1|Hq,
  Lq, Lc + L)`` restricts attention only. An additive float mask of zeros and ``-inf`` (or the
  dtype's minimum) is read as the boolean ``mask == 0``. A query with no key left gives zeros.
* ``span_ids (B, L)``: integers, read by a scheme with ``mask = spans`` only (refused elsewhere): tokens
  sharing a nonzero id see each other both ways. A scheme's ``mask`` (bidirectional, prefix, spans;
  :mod:`pedsl.compiler.general.masks`, docs/semantics.md §11a) widens the causal mask per block of queries; a
  bidirectional scheme has no cache, and a call may not join a span some cached token is in.
* ``cache``: an :class:`AttentionCache` from ``module.new_cache(batch_size)``: it stores the keys
  as the scheme transports them to the newest token (RoPE family: rotated at their positions;
  accumulated SO(2): rotated by their cumulative angles; PaTH: moved through every later
  Householder step), the values (rotated when values are transported), the bias coordinates
  (ALiBi ``slope * position``, forget gates ``G_j = sum log f``, float64) and the running state
  (cumulative angles, gate sums, the last tokens' inputs for short convolutions). Prefill plus
  decoding equals one full forward, with one documented exception: a table that depends on the
  run-time length n (dynamic NTK; n = the largest position of the call + 1) rotates each key with
  the table in force when it was cached, as Hugging Face does, so past the original length a
  decoded sequence differs from one full forward of it (tested in test_compiler_stream.py).

Biases are differences of per-token float64 coordinates ``b(i, j) = c_i - c_j`` (the ALiBi and
forget-gate forms), formed per block of queries in float64 and only then cast to the compute dtype,
so a bfloat16 call is as exact as a hand-written bfloat16 bias.

What the scheme supplies (``scheme`` below; ``SchemeAttention``'s adapter in :mod:`pedsl.compiler.module_values`,
the generated class in a compiled module): ``heads``, ``head_dim``, ``axes`` (its position axes),
``conv_history`` (earlier tokens a short convolution re-reads), ``transforms`` (records with ``kind``,
``values``, ``channels``, ``scale``), ``normalize`` and ``attend_current`` (softmax or stick-breaking weights),
``cope_max_pos`` (None, or CoPE's positions, with its ``contextual_embedding``), ``token_values(window, dtype)``
(a :class:`TokenValues`), ``distance_table(i, size, device)`` (bias i over distances 0..size-1, ``(H, size)``
float64) and the rest of the ``SchemeSide`` Protocol of :mod:`pedsl.compiler.general.protocols`. The
primitives (rotations, cumulative sums of angles, the blockwise PaTH kernel, the Toeplitz kernel of distance
tables) come as ``kernels``: :class:`TorchKernels` here, pedsl's fused ones in process; what the forward reads
of them is the ``Kernels`` Protocol there. Every supplier of either gives every member, None for what it has
not.
"""

from pedsl.compiler.general.inputs import (AXIS_BIAS, F64, GATE_BIAS, HOUSEHOLDER, LINEAR_BIAS, QUERY_BIAS, ROPE, SO2,
                                           TABLE_BIAS, InputError, Layout, angle_dtype, layout)
from pedsl.compiler.general.cache import AttentionCache, advance_rows, cached, token_axis
from pedsl.compiler.general.windows import Shape, shape_of, trim_cache, visible
from pedsl.compiler.general.values import TokenValues, Window
from pedsl.compiler.general.transport import TWO_PI, Transform, xpos_scale
from pedsl.compiler.general.forward import TorchKernels, general_forward

__all__ = ["AXIS_BIAS", "F64", "GATE_BIAS", "HOUSEHOLDER", "LINEAR_BIAS", "QUERY_BIAS", "ROPE", "SO2", "TABLE_BIAS",
           "TWO_PI", "AttentionCache", "InputError", "Layout", "Shape", "TokenValues", "TorchKernels", "Transform",
           "Window", "advance_rows", "angle_dtype", "cached", "general_forward", "layout", "shape_of", "token_axis",
           "trim_cache", "visible", "xpos_scale"]
