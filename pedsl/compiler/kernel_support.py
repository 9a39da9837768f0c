"""Which fast kernel may run a call, declared by the kernels themselves (opt in, never opt out).

Every fast path states positively what it computes: a :class:`KernelDecl` lists the plan features it
takes (``takes``: "a window, a sink logit, a rotation by a static table, ..."), the features of which it
needs one (``needs``: a window kernel needs a window or a chunk), the dtypes it computes in, and in words
the call modes its call function admits. Two halves, both here:

* **static**, decided once per plan: :func:`plan_features` names every feature of a lowering plan;
  :func:`static_kernels` the kernels whose declaration takes all of them. The last pass records the answer
  as ``Plan.kernels`` (a generated module as ``FAST_PATHS``); the executors read it and never decide again.
  A feature no declaration lists (a new statement, a new bias kind) sends every call to the general path.
* **call time**: one function per kernel (``*_call``) says whether this call's mode - the cache, masks,
  padding, packed documents, grouped heads, fewer queries than keys, positions, dtype - is one it takes.

Import free: the plan is read by its attributes and the tensors by their methods, so the passes import it
without torch and ``pedsl compile`` copies the text below the banner into every module it writes.
Hugging Face's rotary path (:mod:`pedsl.hf.attention`: the model rotates q and k with the scheme's cos and
sin, then attends by its own SDPA) is one of these declarations too (``hf-rotary``), decided once per
model by :func:`hf_rotary_call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # for the checker only: the module imports nothing at run time
    from pedsl.compiler.general.protocols import Kernels

# <embedded>
# ---------------------------------------------------------------------------------------------
# Kernel support (pedsl.compiler.kernel_support, copied verbatim): what each fast path declares it
# computes, the features of a plan, and one call-time check per kernel.
# ---------------------------------------------------------------------------------------------
# the features of statements' values that some kernel declares: the words of their records (Carried.feature,
# pedsl.lang.statements), which name every statement's feature; a plan's are its statement_features
WINDOW, CHUNK, SOFTCAP = "window", "chunk", "softcap"
# a mask other than causal (docs/semantics.md §11a): every pair visible, the pairs of a static prefix, or those of
# the call's span_ids
BIDIRECTIONAL, PREFIX, SPANS = "mask bidirectional", "mask prefix", "mask spans"
SINK_LOGIT, SINK_TOKEN = "sink logit", "sink token"
SOFTMAX_ONE = "softmax plus one"  # a normaliser (no kernel declares the others yet)
CONTEXTUAL = "contextual positions"
SEVERAL_AXES = "several position axes"
RELATIVE = "content-position terms"  # relative = shaw / transformer_xl / deberta: the general path's blocks only
REMAP = "remapped positions"  # the rotation's positions by distance regime: the general path's blocks only
VALUE_TRANSPORT, XPOS, PAIR_AXES = "value transport", "xpos", "pairs read per axis"
TOKEN_COUNT = "linear bias counting tokens"
# RoPE folded from constant accumulated steps: equal to the steps at consecutive positions only (a kernel that
# rotates by the positions of a call with gaps, or continues a cache's positions, computes another function)
ROTATION_TOKEN_COUNT = "rotation counting tokens"
SEVERAL_QUERY_BIASES = "several biases reading the query position"
HALF_VIA_GENERAL = "coordinate bias outside the scan"  # a key channel g(j) loses it in half precision
FULL_DTYPES, HALF_DTYPES = ("float32", "float64"), ("bfloat16", "float16")


def transport_feature(kind: str) -> str:
    return "transport " + kind


def table_feature(table: str) -> str:
    return "table " + table


def bias_feature(kind: str) -> str:
    return "bias " + kind


def carrier_feature(carried: str) -> str:
    return "carried as " + carried


def backend_feature(backend: str) -> str:
    return "backend " + backend


def temperature_feature(table: str) -> str:
    return "temperature " + table


# what every kernel takes: plan fields no executor branches on (checked complete by compiler_tests). The values
# the statements carry (pedsl.lang.statements.CARRIED: the window, the normaliser ...) are features by their
# records, read as the plan's statement_features (settings holds those without a field of their own)
NOT_FEATURES = {
    "Plan": ("scheme", "layout", "heads", "head_dim", "backend_why", "kernels", "settings"),
    # dense: DENSE's generators' shape, computed wherever the kind "transport dense-rotation" is
    "TransportStep": ("group", "index", "channels", "kernel", "sites", "scale", "orthogonal", "why", "xpos_zeta",
                      "dense"),
    "BiasTerm": ("index", "site", "slope", "why", "axes"),
    "Temperature": ("site", "carried", "why"),
}


def _transport_features(t) -> set:
    out = {transport_feature(t.kind)}
    if t.kind == "rope-table":
        out.add(table_feature(t.table))
    if t.targets == "qkv":
        out.add(VALUE_TRANSPORT)
    if t.xpos_gamma:
        out.add(XPOS)
    if t.pair_axes:
        out.add(PAIR_AXES)
    if t.step is not None:
        out.add(ROTATION_TOKEN_COUNT)
    return out


def _bias_features(biases) -> set:
    out = set()
    for b in biases:
        out |= {bias_feature("query-table" if b.query else b.kind), carrier_feature(b.carried)}
        if b.kind == "linear-distance" and b.counts == "tokens":
            out.add(TOKEN_COUNT)
    if sum(1 for b in biases if b.query) > 1:
        out.add(SEVERAL_QUERY_BIASES)
    return out


def plan_features(plan) -> frozenset:
    """Every feature of a lowering plan (``pedsl.compiler.plan.Plan``) a kernel must compute."""
    out = {backend_feature(plan.backend)} | _bias_features(plan.biases)
    for t in plan.transports:
        out |= _transport_features(t)
    if plan.temperature is not None:
        out.add(temperature_feature(plan.temperature.table))
    flags = ((plan.half_via_general, HALF_VIA_GENERAL), (len(plan.axes) > 1, SEVERAL_AXES),
             (plan.contextual is not None, CONTEXTUAL), (plan.remap is not None, REMAP),
             (plan.relative is not None, RELATIVE))
    # the statements' own features (the window, the mask, the normaliser ...: each record's declaration)
    return frozenset(out | {name for on, name in flags if on} | plan.statement_features)


class KernelDecl(NamedTuple):
    """One fast path's declaration: ``takes`` every plan feature it computes, ``needs`` (one of them at
    least; empty: nothing), ``dtypes`` (names) it computes in, ``modes`` the call modes its call function
    admits, in words."""

    name: str
    takes: frozenset
    needs: frozenset = frozenset()
    dtypes: tuple = FULL_DTYPES + HALF_DTYPES
    modes: str = ""

    def covers(self, features: frozenset) -> bool:
        return features <= self.takes and (not self.needs or bool(features & self.needs))


# (a general-path kernel attends over q and k the general forward rotated, by the tokens where the steps count them)
ROTATIONS = frozenset({transport_feature("rope-table"), transport_feature("accumulated-so2"), VALUE_TRANSPORT,
                       XPOS, PAIR_AXES, SEVERAL_AXES, ROTATION_TOKEN_COUNT, *(table_feature(t) for t in (
                           "static", "run-time length", "learned", "per token"))})
TEMPERATURES = frozenset({temperature_feature("position table"), temperature_feature("run-time")})
PRE_TRANSFORM = frozenset(backend_feature(b) for b in ("sdpa", "flex", "masked"))  # q, k moved absolutely
ANY_CARRIER = frozenset(carrier_feature(c) for c in (
    "key channel", "table", "materialised", "score_mod", "step log term", "table per query block"))
COORDINATES = frozenset({bias_feature("linear-distance"), bias_feature("forget-gate"), TOKEN_COUNT})
PATH = frozenset({transport_feature("householder"), backend_feature("blockwise"), carrier_feature("step log term")})
# the flex backend's fresh calls run its lowering (kernel "flex"), never the fused full-sequence path
FUSED = (ROTATIONS | TEMPERATURES | (PRE_TRANSFORM - {backend_feature("flex")}) | PATH | COORDINATES
         | {backend_feature("reference"), bias_feature("distance-table"), bias_feature("query-table"),
            bias_feature("axis-distance"), SEVERAL_QUERY_BIASES}
         | {carrier_feature(c) for c in ("key channel", "materialised", "score_mod")})
CAUSAL = ROTATIONS | TEMPERATURES | PRE_TRANSFORM
BIAS_KINDS = frozenset({bias_feature("linear-distance"), bias_feature("forget-gate"), bias_feature("distance-table")})
BIASES_IN_ROWS = BIAS_KINDS | {carrier_feature("key channel"), carrier_feature("table per query block")}
# what the C++ causal kernel computes after the bias in its rows: a soft cap, a sink logit per query (softmax plus
# one: the logit 0), a sliding window; it needs one of them or a bias (a plain causal call is SDPA's)
ROW_MODIFIERS = frozenset({SOFTCAP, SINK_LOGIT, SOFTMAX_ONE, WINDOW})
# the score pipeline as FlexAttention's score_mod, mask_mod and block mask (pedsl.compiler.flex_lowering): every
# bias (carried as a score_mod), temperature, soft cap, window, chunk, mask and sink column; not PaTH's
# Householder steps, nor the normalisers and positions that read the scores (stick-breaking, sigmoid, CoPE, remap)
# (its score_mod differences the float64 coordinates per pair: half precision keeps the bias, no general path)
FLEX = (ROTATIONS | TEMPERATURES | COORDINATES | {backend_feature("flex"), carrier_feature("score_mod")}
        | {bias_feature(b) for b in ("distance-table", "query-table", "axis-distance")} | {SEVERAL_QUERY_BIASES}
        | {WINDOW, CHUNK, SOFTCAP, SINK_LOGIT, SINK_TOKEN, SOFTMAX_ONE, BIDIRECTIONAL, PREFIX, SPANS})

KERNELS = (
    KernelDecl("fused", FUSED | {HALF_VIA_GENERAL}, dtypes=FULL_DTYPES,
               modes="one full causal sequence at positions 0..L-1: no positions, documents, mask, cache; as "
                     "many key/value heads and keys as queries"),
    KernelDecl("fused-half", FUSED, dtypes=HALF_DTYPES, modes="as fused"),
    KernelDecl("bidirectional", ROTATIONS | TEMPERATURES | {backend_feature("sdpa"), BIDIRECTIONAL},
               frozenset({BIDIRECTIONAL}),
               modes="as fused: one full sequence at positions 0..L-1, no positions, documents, mask, cache; "
                     "non-causal SDPA over every key"),
    KernelDecl("decode", PRE_TRANSFORM | {transport_feature("rope-table"), table_feature("static"), VALUE_TRANSPORT,
                                          PAIR_AXES, SEVERAL_AXES, temperature_feature("position table"), WINDOW,
                                          CHUNK},
               modes="one token, no gradient, after a cached prefill of one document with no padding; no "
                     "positions, documents, mask or inputs; GQA"),
    KernelDecl("causal-sdpa", CAUSAL, modes="a fresh call of one document, no padding or mask, as many "
                                            "queries as keys; any positions; GQA"),
    KernelDecl("flash-window", CAUSAL | {WINDOW, CHUNK}, frozenset({WINDOW, CHUNK}),
               modes="as causal-sdpa, at consecutive positions (a chunk's from a multiple of the chunk); CPU"),
    KernelDecl("band", CAUSAL | {WINDOW}, frozenset({WINDOW}), FULL_DTYPES,
               modes="a sliding window narrower than the call, CPU, the C++ kernels built"),
    KernelDecl("distance", CAUSAL | ANY_CARRIER | {bias_feature("distance-table")},
               frozenset({bias_feature("distance-table")}), FULL_DTYPES,
               modes="one fresh sequence at consecutive positions: no cache, padding, documents, mask; as many "
                     "key/value heads and keys as queries; CPU"),
    KernelDecl("bias", CAUSAL | BIASES_IN_ROWS | ROW_MODIFIERS | {HALF_VIA_GENERAL},
               BIAS_KINDS | (ROW_MODIFIERS - {WINDOW}), FULL_DTYPES,
               modes="one full causal sequence, as many keys as queries, of one document, no padding or mask (a "
                     "distance table or a window: at consecutive positions; a sink: its logit, no value); GQA; "
                     "CPU, the C++ kernels built"),
    KernelDecl("mlp", CAUSAL | ANY_CARRIER | {bias_feature("query-table")}, frozenset({bias_feature("query-table")}),
               FULL_DTYPES, modes="as distance, every row starting at one position; the bias of FIRE's form"),
    KernelDecl("path-blockwise", PATH | ROTATIONS | TEMPERATURES | COORDINATES,
               frozenset({transport_feature("householder")}),
               modes="a fresh call (no cache or mask, as many queries as keys); documents and left padding"),
    # softmax plus one: the sink column path-window takes, its logit 0 (scores.sink_column)
    KernelDecl("path-window", PATH | ROTATIONS | TEMPERATURES | COORDINATES | {WINDOW, CHUNK, SINK_LOGIT, SINK_TOKEN,
                                                                               SOFTMAX_ONE},
               frozenset({WINDOW, CHUNK}), modes="a fresh call inside a window or chunk; documents and any padding"),
    KernelDecl("flex", FLEX, frozenset({backend_feature("flex")}),
               modes="a fresh call (nothing cached, as many queries as keys): any positions, documents, padding, "
                     "attention mask, span ids; GQA; no gradient on CPU (torch has no CPU backward for it)"),
    # HF's model computes one rotation of q and k by its cos and sin (a static table, one of the run-time
    # length, M-RoPE's pairs per axis) and a plain causal softmax under its own masks: nothing else
    KernelDecl("hf-rotary", PRE_TRANSFORM | {transport_feature("rope-table"), table_feature("static"),
                                             table_feature("run-time length"), PAIR_AXES, SEVERAL_AXES},
               frozenset({transport_feature("rope-table")}),
               modes="every call of a Hugging Face model whose rotary application computes the scheme's "
                     "rotation (its rope fields exported, its cos width probed once)"),
)


def explicit_scores(normalize: str, contextual) -> bool:
    """The weights are not a softmax of q.k plus a bias known beforehand (stick-breaking, sigmoid weights,
    CoPE's ``contextual`` positions): no fused kernel computes them, the general path's explicit blocks of
    scores do. (softmax1 is a softmax with one more column, a sink's: SDPA's blocks take it.)"""
    return normalize in ("stick_breaking", "sigmoid") or contextual is not None


def kernel_decl(name: str) -> KernelDecl:
    return next(d for d in KERNELS if d.name == name)


def static_kernels(plan) -> tuple:
    """The kernels whose declaration covers every feature of ``plan`` (``Plan.kernels``)."""
    features = plan_features(plan)
    return tuple(d.name for d in KERNELS if d.covers(features))


def dtype_name(t) -> str:
    return str(t.dtype).rpartition(".")[2]


def takes_dtype(fast, name: str, t) -> bool:
    """Whether the plan lets kernel ``name`` run (``fast``: ``Plan.kernels``) and it computes in t's dtype."""
    return name in fast and dtype_name(t) in kernel_decl(name).dtypes


def fused_call(fast, q, k, *, band, positions, document_ids, cache, attn_mask) -> bool:
    """SchemeAttention's fused path: one full causal sequence at positions 0..L-1, as many key/value
    heads and keys as queries, the module's own band."""
    fresh = (band and positions is None and document_ids is None and cache is None and attn_mask is None
             and q.shape == k.shape)
    return fresh and (takes_dtype(fast, "fused", q) or takes_dtype(fast, "fused-half", q))


def bidirectional_call(fast, q, k, *, band, positions, document_ids, cache, attn_mask, span_ids) -> bool:
    """SchemeAttention's non-causal fused path: the call :func:`fused_call` takes (and no span_ids), the
    plan's mask bidirectional."""
    fresh = (band and positions is None and document_ids is None and cache is None and attn_mask is None
             and span_ids is None and q.shape == k.shape)
    return fresh and takes_dtype(fast, "bidirectional", q)


def decode_call(fast, q, k, v, cache, grad: bool) -> bool:
    """The one-token decoding path: one query and key, no gradient, a cache of one document with nothing
    padded, the same batch and key/value heads, no short-convolution inputs kept."""
    return ("decode" in fast and not grad and cache.last_pos is not None and cache.one_doc and cache.all_valid
            and bool(cache.length) and q.shape[2] == 1 and k.shape[2] == 1 and cache.batch_size == q.shape[0]
            and cache.heads_kv == k.shape[1] and cache.window is None and takes_dtype(fast, "decode", q))


def causal_call(fast, name: str, q, fresh: bool, one_doc: bool, unmasked: bool) -> bool:
    """The general path's causal SDPA (``causal-sdpa``) or banded kernels (``flash-window``): a fresh call
    (as many queries as keys, nothing cached), one document per row, no padding and no mask."""
    return fresh and one_doc and unmasked and takes_dtype(fast, name, q)


def consecutive(pos) -> bool:
    """Positions (B, L) that count up by one along every row."""
    return pos.shape[1] < 2 or bool((pos[:, 1:] - pos[:, :-1] == 1).all())


def window_call(fast, flash: bool, window, chunk, pos) -> bool:
    """The banded kernels on top of :func:`causal_call`: the flash kernel takes q (``flash``), at least two
    consecutive positions per row (a chunk's from a multiple of the chunk), so that the band by positions
    is the band by token index."""
    if not (flash and pos.shape[1] >= 2 and consecutive(pos)):
        return False
    return chunk is None or bool((pos[:, 0] % chunk == 0).all())


def band_call(q, k, v, window: int) -> bool:
    """The C++ band kernel: a window narrower than the call, q, k, v on the CPU in one dtype it computes in."""
    same = q.dtype == k.dtype == v.dtype and q.device.type == k.device.type == v.device.type == "cpu"
    return window < q.shape[2] and same and dtype_name(q) in kernel_decl("band").dtypes


def bias_call(fast, kernels: Kernels, q, k, v) -> bool:
    """The C++ causal kernel with its biases in the rows (``bias``): q, k, v on the CPU in one dtype it
    computes in, as many keys as queries, and ``kernels`` has it built (``kernels.bias_ready``; asked last:
    the first ask builds the C++ kernels)."""
    same = q.dtype == k.dtype == v.dtype and q.device.type == k.device.type == v.device.type == "cpu"
    if not ("bias" in fast and same and q.shape[2] == k.shape[2] and dtype_name(q) in kernel_decl("bias").dtypes):
        return False
    return kernels.bias_ready is not None and kernels.bias_ready()


def fresh_sequence_call(fast, name: str, kernels: Kernels, q, k, lay, cache) -> bool:
    """The Toeplitz (``distance``) or MLP-bias (``mlp``) kernel: one fresh sequence at consecutive positions
    (each row may start anywhere), no cache, padding, packed documents or mask, as many key/value heads and
    keys as queries, a dtype the kernels take (``kernels.distance_supported``)."""
    supported = kernels.distance_supported
    if not (name in fast and cache is None and q.shape == k.shape and not lay.padded and lay.mask4 is None
            and supported is not None and supported(q) and dtype_name(q) in kernel_decl(name).dtypes):
        return False
    docs = lay.docs
    if docs.shape[1] > 1 and bool((docs[:, 1:] != docs[:, :-1]).any()):
        return False
    return consecutive(lay.positions)


def mlp_call(fast, kernels: Kernels, q, k, lay, cache) -> bool:
    """:func:`fresh_sequence_call` of the MLP-bias kernel, its rows all starting at one position (w reads it)."""
    if kernels.mlp_attention is None or not fresh_sequence_call(fast, "mlp", kernels, q, k, lay,
                                                                                  cache):
        return False
    pos = lay.positions
    return pos.shape[0] == 1 or bool((pos == pos[:1]).all())


def path_call(fast, kernels: Kernels, lay, fresh: bool) -> str | None:
    """Which of PaTH's blockwise kernels takes a call, or None (the decode rule): ``path-window`` inside a
    window or chunk (its mask decides documents and padding), ``path-blockwise`` over the whole sequence
    (documents and left padding as hard resets); either only for a fresh call (as many queries as keys,
    nothing cached) without an attention mask."""
    if not (fresh and lay.mask4 is None and lay.key_valid_cached is None):
        return None
    if "path-window" in fast and kernels.path_local_attention is not None:
        return "path-window"
    left_pad = not lay.padded or bool((lay.valid.long().diff(dim=1) >= 0).all())
    if "path-blockwise" in fast and left_pad and kernels.path_attention is not None:
        return "path-blockwise"
    return None


def hf_rotary_call(fast, exported: bool, rotates_like: bool) -> bool:
    """Hugging Face's rotary path for a model (decided once, when it is installed): the plan lets it run
    (``fast``: ``Plan.kernels``), the scheme's rotation has HF's rope fields (``exported``: halves layout,
    the first channels, frequencies rope_parameters can hold) and the model's own rotary application was
    probed to compute it (``rotates_like``)."""
    return "hf-rotary" in fast and exported and rotates_like
# </embedded>
