"""The settings of training and evaluation as Pydantic models (v2, ``extra="forbid"``, frozen):
:class:`ModelConfig`, :class:`DataConfig`, :class:`InitFrom`, :class:`TrainConfig` and
:class:`EvalConfig`. ``pedsl compile`` writes them as ``train.yaml`` / ``eval.yaml`` and ``pedsl train
train.yaml`` reads them back (:meth:`TrainConfig.from_yaml`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pedsl import limits as L
from pedsl.yamlconfig import read_yaml, validate_model


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(_Frozen):
    """A decoder-only pre-norm transformer (see :mod:`pedsl.model`)."""

    vocab_size: int = Field(256, ge=2, le=L.MAX_VOCAB)
    n_layers: int = Field(2, ge=1, le=L.MAX_LAYERS)
    d_model: int = Field(128, ge=2, le=L.MAX_D_MODEL)
    n_heads: int = Field(4, ge=1, le=L.MAX_HEADS)
    head_dim: int | None = Field(None, ge=2, le=L.MAX_HEAD_DIM,
                                 description="per-head width; default d_model // n_heads")
    mlp_ratio: float = Field(4.0, gt=0, le=64)
    tie_embeddings: bool = True
    arch: Literal["gpt", "llama"] = Field(
        "gpt", description="gpt: GELU MLP; llama: SwiGLU MLP and RMSNorm, exportable with `pedsl export --hf`")
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_eps: float = Field(1e-5, gt=0)
    init_std: float = Field(0.02, gt=0)
    qk_conv: int = Field(0, ge=0, le=L.MAX_QK_CONV, description=(
        "width of a causal depthwise convolution over the queries and keys of every layer, applied "
        "before the positional encoding (0: none). A short convolution as in linear-attention and PaTH "
        "layers: with it a 2-layer model forms induction heads (copying) within a few hundred steps; "
        "the retrieval study uses width 8 (docs/semantics.md §10)"))

    @model_validator(mode="after")
    def _derive_head_dim(self) -> "ModelConfig":
        head_dim = self.head_dim
        if head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; "
                    "set head_dim explicitly or change one of them"
                )
            head_dim = self.d_model // self.n_heads
            object.__setattr__(self, "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} must be even (rotary schemes pair channels)")
        if self.arch == "llama" and self.norm != "rmsnorm":
            raise ValueError("arch 'llama' uses RMSNorm: set norm: rmsnorm (or arch: gpt)")
        if head_dim > L.MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} (d_model // n_heads) is above the limit of {L.MAX_HEAD_DIM}")
        n = L.model_parameters(vocab_size=self.vocab_size, n_layers=self.n_layers, d_model=self.d_model,
                               n_heads=self.n_heads, head_dim=head_dim, mlp_ratio=self.mlp_ratio,
                               tie_embeddings=self.tie_embeddings, mlp_matrices=3 if self.arch == "llama" else 2)
        if n > L.MAX_PARAMETERS:
            raise ValueError(f"the model would have about {n:,} parameters; the limit is {L.MAX_PARAMETERS:,} "
                             "(fewer layers, a smaller d_model or mlp_ratio)")
        return self


DataSource = str  # "stdlib" | "passkey" | "blocks" | "multikey" | "kv" | a path | a mixture "stdlib:0.7,kv:0.3"


class DataConfig(_Frozen):
    """Where the bytes come from (see :mod:`pedsl.data.stream`)."""

    source: DataSource = "stdlib"
    seed: int = Field(0, ge=0, le=L.MAX_SEED)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    max_bytes: int = Field(8_000_000, ge=1024, le=L.MAX_TENSOR_BYTES, description="read at most this many bytes of text")
    passkey_digits: int = Field(5, ge=1, le=32, description="answer digits of passkey, multikey and kv")
    multikey_keys: int = Field(3, ge=1, le=64, description="needles of the multikey task (one asked)")
    train_digits: tuple[Annotated[int, Field(ge=1, le=32)], Annotated[int, Field(ge=1, le=32)]] | None = Field(
        None, description=("[lo, hi]: training rows of passkey, multikey and kv draw their answer's digit count "
                           "uniformly from lo..hi (per batch and task; evaluation keeps passkey_digits). A fixed "
                           "count lets a model find each digit by its offset from the needle's edges instead of "
                           "copying it; None: always passkey_digits"))
    answer_weight: float = Field(0.0, ge=0, le=1000, description=(
        "training loss = mean over all bytes + answer_weight x mean over the answer bytes of the "
        "retrieval-task rows (passkey, multikey, kv); 0: every byte weighs the same"))
    block_len: int = Field(16, ge=2, le=L.MAX_LENGTH, description="latent block length B of the block task")
    block_offset: int = Field(0, ge=0, description="the last token of a block copies this offset")
    grid_width: int | None = Field(None, ge=1, le=L.MAX_LENGTH, description=(
        "columns W of the grid tasks (grid_image, grid_copy: context = H x W); None: a square grid"))
    grid_offset: tuple[Annotated[int, Field(ge=-L.MAX_LENGTH, le=L.MAX_LENGTH)],
                       Annotated[int, Field(ge=-L.MAX_LENGTH, le=L.MAX_LENGTH)]] = Field((-2, 1), description=(
        "[dh, dw]: the cell a grid_copy cell copies (earlier in raster order: dh < 0, or dh = 0 and dw < 0)"))
    count_back: int = Field(3, ge=1, le=9, description=(
        "the counting tasks (select_last, sentence_first) ask for the k-th last write or sentence, k in 1..count_back"))

    @model_validator(mode="after")
    def _offset_inside(self) -> "DataConfig":
        if self.train_digits is not None and self.train_digits[0] > self.train_digits[1]:
            raise ValueError(f"train_digits {list(self.train_digits)} must be [lo, hi] with lo <= hi")
        if self.block_offset >= self.block_len - 1:
            raise ValueError(f"block_offset {self.block_offset} must be < block_len - 1 = {self.block_len - 1}")
        dh, dw = self.grid_offset
        if not (dh < 0 or (dh == 0 and dw < 0)):
            raise ValueError(f"grid_offset {list(self.grid_offset)} must point at an earlier cell in raster order "
                             "(dh < 0, or dh = 0 and dw < 0), e.g. [-2, 1]")
        return self


class InitFrom(_Frozen):
    """The run a fine-tune starts from (``pedsl train --init-from RUN``): its newest checkpoint."""

    run: str = Field(description="the source run directory (absolute)")
    step: int = Field(ge=0, description="the checkpoint's step")
    scheme: str | None = Field(None, description="the source run's scheme name")
    scheme_hash: str = Field(description="sha256 of the source run's scheme")
    model_sha256: str = Field(description="sha256 of the checkpoint's model.safetensors")


class TrainConfig(_Frozen):
    """Everything a training run depends on; saved as ``RUN/config.yaml``."""

    scheme: str = Field("", description="path of the .pe file")
    params: dict[str, Any] = Field(default_factory=dict, description="scheme parameter overrides")
    preset: str = "tiny"
    backend: str = "auto"
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    context: int = Field(128, ge=2, le=L.MAX_LENGTH)
    steps: int = Field(600, ge=1, le=L.MAX_STEPS)
    batch_size: int = Field(16, ge=1, le=L.MAX_BATCH)
    lr: float = Field(3e-3, gt=0)
    min_lr: float = Field(3e-4, ge=0)
    warmup: int = Field(50, ge=0, le=L.MAX_STEPS)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    seed: int = Field(0, ge=0, le=L.MAX_SEED)
    log_every: int = Field(10, ge=1, le=L.MAX_STEPS)
    eval_every: int = Field(200, ge=1, le=L.MAX_STEPS)
    eval_batches: int = Field(8, ge=1, le=L.MAX_BATCH)
    checkpoint_every: int = Field(200, ge=1, le=L.MAX_STEPS)
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    device: str = "auto"
    threads: int = Field(0, ge=0, le=L.MAX_THREADS, description="torch CPU threads per process; 0: the idle cores (load average)")
    compile: bool = False
    flush_denormal: bool = True
    init_from: InitFrom | None = Field(None, description="start from a trained run's weights (a fine-tune)")

    @model_validator(mode="after")
    def _check_schedule(self) -> "TrainConfig":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}")
        return self

    def step_memory_issue(self) -> str | None:
        """Why a training step of this batch and context would not fit (a sentence), or None. Checked
        where a training is asked for (:func:`resolve_train_config`), not when a scheme's ``train {}``
        block is read: an imported 1M-position scheme describes inference and loads."""
        m = self.model  # the widest activation of a step: logits, the MLP's hidden layer or q, k, v
        assert m.head_dim is not None  # ModelConfig's validator derives it when not given
        width = max(m.vocab_size, int(m.mlp_ratio * m.d_model), 3 * m.n_heads * m.head_dim)
        too_big = L.check_tensor("a training step", self.batch_size * self.context * width, 4,
                                 f"batch {self.batch_size} x context {self.context} x width {width}, float32")
        return None if too_big is None else too_big + ": a smaller batch_size or context"

    def to_yaml(self) -> str:
        d = self.model_dump(mode="json")
        if d.get("init_from") is None:
            d.pop("init_from", None)
        return yaml.safe_dump(d, sort_keys=False)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "TrainConfig":
        """Read a train.yaml (as ``pedsl compile`` writes it); ConfigError with a did-you-mean hint."""
        return validate_model(cls, read_yaml(path), where=str(path))

    def digest(self) -> str:
        """sha256 of the fields that change the math (used to match checkpoints)."""
        d = self.model_dump(mode="json")
        for k in RESUMABLE_FIELDS:
            d.pop(k, None)
        if d.get("init_from") is None:  # runs from before the field keep their digest
            d.pop("init_from", None)
        for key, default in (("answer_weight", 0), ("train_digits", None), ("grid_width", None),
                             ("grid_offset", [-2, 1]), ("count_back", 3)):  # likewise
            if d["data"].get(key) == default:
                d["data"].pop(key)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


# Changing these between a run and its --resume is allowed.
RESUMABLE_FIELDS = (
    "scheme", "steps", "log_every", "eval_every", "eval_batches", "checkpoint_every",
    "keep_checkpoints", "device", "threads", "compile", "backend",
)


EvalTask = Literal["ppl", "passkey", "blocks", "retrieval"]  # retrieval: pedsl.data.tasks by length and depth


def _default_eval_tasks() -> list[EvalTask]:
    return ["ppl", "passkey", "blocks"]


class EvalConfig(_Frozen):
    """Evaluation past the training length (read by :mod:`pedsl.study`)."""

    context: int = Field(128, ge=2, le=L.MAX_LENGTH, description="training length the defaults scale from")
    lengths: list[Annotated[int, Field(ge=1, le=L.MAX_LENGTH)]] | None = Field(
        None, min_length=1, max_length=L.MAX_LIST, description="default: context * [1, 2, 4, 8, 16, 32]")
    tasks: list[EvalTask] = Field(default_factory=_default_eval_tasks)
    windows: int = Field(4, ge=1, le=L.MAX_BATCH, description="windows (perplexity) or samples (tasks) per length")
    batch_size: int = Field(2, ge=1, le=L.MAX_BATCH)
    far_window: int = Field(32, ge=1, le=L.MAX_LENGTH, description="W of the far-mass instrument")
    analyze_lengths: list[Annotated[int, Field(ge=2, le=L.MAX_LENGTH)]] | None = Field(
        None, min_length=1, max_length=L.MAX_LIST, description="default: context * [1, 4, 16]")
    seed: int = Field(1234, ge=0, le=L.MAX_SEED)

    @model_validator(mode="after")
    def _derive_lengths(self) -> "EvalConfig":
        lengths = self.lengths
        if lengths is None:
            lengths = [self.context * m for m in (1, 2, 4, 8, 16, 32)]
            object.__setattr__(self, "lengths", lengths)
        if self.analyze_lengths is None:
            object.__setattr__(self, "analyze_lengths", [self.context * m for m in (1, 4, 16)])
        longest = max(lengths)
        too_big = L.check_tensor("evaluating", self.windows * (longest + 1), 8,
                                 f"{self.windows} windows of {longest + 1} tokens, int64")
        if too_big:
            raise ValueError(too_big + ": fewer windows or shorter lengths")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EvalConfig":
        return validate_model(cls, read_yaml(path), where=str(path))
