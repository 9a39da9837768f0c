"""Helpers shared by the training tests (not a test module): the stand-in attention modules of
``fixtures/train_helper.py`` (loaded as ``helper``; also run as a script by the subprocess tests),
a small training config and the CLI options of a tiny run."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from pedsl.config import TrainConfig, resolve_train_config

HELPER = Path(__file__).resolve().parent / "train" / "fixtures" / "train_helper.py"
_spec = importlib.util.spec_from_file_location("train_helper", HELPER)
helper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helper)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def torchrun_env() -> dict:
    """The environment of a ``torchrun`` test: one thread per process, gloo over the loopback."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    env.pop("WORLD_SIZE", None)
    return env


SMALL = dict(steps=40, threads=1, context=32, batch_size=8, n_layers=1, d_model=32, n_heads=2, log_every=5,
             eval_every=20, checkpoint_every=10, eval_batches=2, lr=1e-2, warmup=5, max_bytes=200_000)


def lm_depth(cfg, length: int, layers: int | None = None) -> int:
    """The longest chain of roundings in a TransformerLM's logits (``cfg`` its ModelConfig): per layer the
    d_model-long projections (q, k, v, out, the MLP's input), the keys (softmax and its weighted sum), and
    the MLP's width; then the output head."""
    d, n = cfg.d_model, cfg.n_layers if layers is None else layers
    return n * (5 * d + 2 * length + int(cfg.mlp_ratio * d)) + d


def loss_bound(cfg, length: int, tokens: int, loss: float) -> float:
    """How far two float32 computations of a mean next-token loss (``cfg`` the ModelConfig) may be apart: each
    within eps32 x its chain of roundings (the logits' :func:`lm_depth`, the log-softmax over the vocabulary,
    the mean over ``tokens``) x the loss, so twice that (compiler_helpers.float32_bound's argument)."""
    from compiler_helpers import F32_EPS

    return 2 * (lm_depth(cfg, length) + cfg.vocab_size + tokens) * F32_EPS * abs(loss)


def curve_bound(cfg: TrainConfig, step: int, value: float, extra: int = 0) -> float:
    """How far two float32 runs of one training (``cfg``) that differ only in the order of their reductions
    (one process against several) may be apart in a value logged after ``step`` steps: each step's loss and
    gradient are within :func:`loss_bound` of their exact values, Adam's update is a ratio of gradient moments
    (a relative error of the gradient moves it relatively as much), and each step's rounding enters the
    weights once and is carried forward: so ``step`` x loss_bound. ``extra``: the value's own reduction
    beyond the loss (for the gradient norm, its sum over a parameter tensor's squares)."""
    from compiler_helpers import F32_EPS

    m = cfg.model
    depth = lm_depth(m, cfg.context) + m.vocab_size + cfg.batch_size * cfg.context + extra
    return step * 2 * depth * F32_EPS * abs(value)


def small_cfg(**kw) -> TrainConfig:
    return resolve_train_config(overrides={**SMALL, **kw})


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# `pedsl train` options of a tiny run
TINY = ["--context", "32", "--batch-size", "8", "--threads", "1", "--set", "n_layers=1", "--set", "d_model=32",
        "--set", "n_heads=2", "--set", "eval_every=15", "--set", "eval_batches=2", "--set", "log_every=5",
        "--set", "checkpoint_every=15", "--set", "data.max_bytes=200000", "--set", "warmup=5", "--lr", "1e-2", "-q"]
