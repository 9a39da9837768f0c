"""Resource caps: every user value that sizes memory or time is checked against one of these.

A value over its cap is refused before anything is allocated - by the checker with a
positioned diagnostic (a ``.pe`` file, ``-P``), by the configuration models (``train.yaml``,
a ``train {}`` / ``eval {}`` block, ``--set``) or by the command-line options - with a
message that names the cap. Where a per-value cap would be arbitrary, the cap is an estimate
of memory: the bytes of the largest tensor a command builds.

=========================  ==================  ==================================================
cap                        value               what it bounds
=========================  ==================  ==================================================
``MAX_HEADS``              1,024               heads (``heads``, ``n_heads``, ``--heads``, ``slopes(h)``)
``MAX_HEAD_DIM``           4,096               channels per head (``head_dim``, ``--head-dim``)
``MAX_LIST``               4,096               items of a list (a list literal, ``per_pair``, eval lengths)
``MAX_LENGTH``             1,048,576           tokens of one sequence (context, eval/analysis lengths)
``MAX_COPE_POSITIONS``     65,536              ``cope(max_pos = N)``: rows of CoPE's learned embedding
``MAX_RELATIVE_ROWS``      65,536              ``relative = ...``: its distances, buckets and sinusoid width
``MAX_D_MODEL``            65,536              model width
``MAX_LAYERS``             1,024               transformer layers
``MAX_VOCAB``              1,048,576           vocabulary (the models read bytes: 256 is enough)
``MAX_BATCH``              65,536              sequences per step (training, evaluation)
``MAX_STEPS``              1,000,000,000       optimizer steps (and every ``*_every`` period)
``MAX_PARAMETERS``         2,000,000,000       estimated model parameters (8 GB of float32 weights)
``MAX_RANK``               4,096               ``linear(rank = r)``, ``shortconv(width = w)``
``MAX_INIT``               10,000              start values of learned builtins (``init``, ``init_bias``)
``MAX_THREADS``            256                 ``--threads`` (torch crashes or hangs at thousands)
``MAX_SEED``               2**63 - 1           seeds (0 .. MAX_SEED: what a torch generator takes)
``MAX_TENSOR_BYTES``       2 GiB               the largest tensor of a training step (batch x context
                                               x the widest activation: logits, MLP, q/k/v),
                                               of ``eval`` (windows x length),
                                               ``analyze`` (samples x heads x L x L) and
                                               ``diff --numeric`` (samples x lmax x width),
                                               ``profile`` (``--max-bytes`` int64 symbols, the
                                               ``--vocab`` x ``--vocab`` pair counts);
                                               and ``data.max_bytes``
``MAX_TEMPERATURE``        10,000              a temperature's magnitude (probed at positions 0, 1 and
                                               MAX_LENGTH - 1): it scales every attention score
``MAX_CONFIG_BYTES``       1 MB                a ``train.yaml`` / ``eval.yaml`` file
``MAX_IMPORTS``            256                 ``.pe`` files loaded for one input (imports, transitively)
``MAX_IMPORT_DEPTH``       64                  nested imports (a imports b imports c ...)
``MAX_NAME``               100                 characters of a name in a ``.pe`` file (a scheme's name
                                               becomes file names, which stop at 255 bytes)
=========================  ==================  ==================================================

Every static number of a scheme (a folded constant, a frequency table, a slope) must also be
finite: ``1e308 * 10`` or ``sqrt(-1)`` is a positioned error, never a NaN at training time.
"""

from __future__ import annotations

MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_LIST = 4096
MAX_LENGTH = 1 << 20
MAX_COPE_POSITIONS = 1 << 16
MAX_RELATIVE_ROWS = 1 << 16
MAX_D_MODEL = 65536
MAX_LAYERS = 1024
MAX_VOCAB = 1 << 20
MAX_BATCH = 65536
MAX_STEPS = 10**9
MAX_PARAMETERS = 2 * 10**9
MAX_RANK = 4096
MAX_THREADS = 256
MAX_INIT = 1e4
MAX_SEED = 2**63 - 1
MAX_TENSOR_BYTES = 2 << 30
MAX_TEMPERATURE = 1e4
MAX_CONFIG_BYTES = 1 << 20
MAX_IMPORTS = 256
MAX_IMPORT_DEPTH = 64
MAX_NAME = 100

# The largest float32 value: a static number beyond it overflows once it reaches a tensor.
FLOAT32_MAX = 3.4028234663852886e38


def gib(n: float) -> str:
    """Bytes as a short human figure: 4294967296 -> '4.0 GiB'."""
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


MAX_QK_CONV = 16  # ModelConfig.qk_conv: taps of the causal q/k convolution


def model_parameters(*, vocab_size: int, n_layers: int, d_model: int, n_heads: int, head_dim: int,
                     mlp_ratio: float, tie_embeddings: bool = True, mlp_matrices: int = 2) -> int:
    """Parameters of the transformer of :mod:`pedsl.model`, estimated without building it
    (attention q, k, v, o; the MLP, 3 matrices for arch llama's SwiGLU; the embeddings; norms are negligible)."""
    inner = n_heads * head_dim
    per_layer = 4 * d_model * inner + mlp_matrices * int(mlp_ratio * d_model) * d_model
    emb = vocab_size * d_model * (1 if tie_embeddings else 2)
    return n_layers * per_layer + emb


def check_tensor(what: str, elements: int, itemsize: int, how: str) -> str | None:
    """A one-sentence refusal when ``elements * itemsize`` bytes exceed MAX_TENSOR_BYTES, else None."""
    size = elements * itemsize
    if size <= MAX_TENSOR_BYTES:
        return None
    return (f"{what} would need a tensor of {gib(size)} ({how}); the limit is {gib(MAX_TENSOR_BYTES)}")
