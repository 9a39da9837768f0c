"""Training a small byte-level language model on a compiled scheme, and the run directory.

Run directory format (``pedsl train ... --out RUN``; read by :func:`load_run` and by eval)::

    RUN/config.yaml       the resolved TrainConfig (pedsl.config), YAML
    RUN/scheme.pe         the scheme's source text
    RUN/scheme.sha256     its sha256 (Scheme.source_hash), one line
    RUN/<name>.pe         copies of the .pe files scheme.pe imports (relative paths inside its
                          folder), so ``load(RUN/scheme.pe, scheme=<scheme_name>)`` works alone
    RUN/metrics.jsonl     one JSON object per log step:
                          {"step", "loss", "lr", "grad_norm", "tokens_per_s"}
                          (+ "val_loss" when evaluated)
                          losses are mean next-byte cross-entropy in nats/byte
    RUN/checkpoints/step_XXXXXXX/   (7-digit step; the newest ``keep_checkpoints`` are kept)
        model.safetensors           model state_dict
        optim.safetensors           AdamW state, ``state.{param_index}.{exp_avg|exp_avg_sq|step}``
        state.json                  step, rng (torch base64, python), data {"next_step"},
                                    scheme_name, scheme_hash, config_hash, shapes {name: [..]},
                                    param_groups, files {name: sha256}
    RUN/DONE.json         written at the end: steps, val_loss, unigram_baseline (nats/byte),
                          wall_time_s, tokens_per_s, n_params, scheme, scheme_hash, data, world_size

API: :func:`pedsl.train.loop.train` (what ``pedsl train`` runs) and :func:`load_run`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pedsl.errors import CheckpointError, ConfigError, EvalError, PedslError
from pedsl.fsio import read_text

__all__ = ["load_run", "train"]


def train(*args, **kwargs):
    from pedsl.train.loop import train as _train

    return _train(*args, **kwargs)


def load_run(run_dir: str | Path, *, device: str = "cpu", step: int | None = None, attention=None):
    """Rebuild a trained model from its run directory.

    Returns ``(model, cfg, meta)``: the :class:`~pedsl.model.TransformerLM` in eval mode with the
    latest checkpoint (or ``step``) loaded, its :class:`~pedsl.config.TrainConfig`, and ``meta``
    with ``step``, ``checkpoint`` (path), ``scheme`` (the loaded Scheme), ``scheme_hash``,
    ``done`` (DONE.json or None), ``run_dir``. ``attention`` (a
    :class:`~pedsl.train.attention.SchemeAttention`) replaces the scheme of the run (tests).
    """
    import torch

    from pedsl.config import TrainConfig
    from pedsl.model import TransformerLM
    from pedsl.train import checkpoint as ck
    from pedsl.train.attention import from_scheme, load_scheme

    run = Path(run_dir)
    if not run.is_dir():
        raise EvalError(f"run directory '{run}' does not exist", hint="pass the --out directory of `pedsl train`")
    cfg_file = run / "config.yaml"
    if not cfg_file.exists():
        raise EvalError(f"'{run}' is not a training run: it has no config.yaml", file=str(cfg_file),
                        hint="pass the --out directory of `pedsl train`")
    try:
        cfg = TrainConfig.from_yaml(cfg_file)
    except ConfigError as err:
        raise EvalError(f"the run's config '{cfg_file}' is invalid: {err}", file=str(cfg_file)) from None
    src_file, hash_file = run / "scheme.pe", run / "scheme.sha256"
    ckpts = ck.list_checkpoints(run / "checkpoints")
    name = None
    if ckpts:
        try:
            name = json.loads(read_text(ckpts[-1] / "state.json")).get("scheme_name")
        except (OSError, ValueError):
            pass
    recorded = read_text(hash_file).strip() if hash_file.exists() else None
    scheme, first_err = None, None
    candidates = () if attention is not None else (src_file, Path(cfg.scheme) if cfg.scheme else None)
    for candidate in candidates:
        if candidate is None or not candidate.exists():
            continue
        try:
            s = load_scheme(candidate, cfg.params, name)
        except PedslError as err:  # e.g. RUN/scheme.pe extends a file next to the original
            first_err = first_err or err
            continue
        if recorded is None or s.source_hash == recorded:
            scheme = s
            break
    if scheme is None and attention is None:
        if first_err is not None:
            raise EvalError(f"the scheme of run '{run}' cannot be loaded: {first_err}", file=str(src_file)) from None
        raise EvalError(f"run '{run}' has no scheme.pe matching its scheme.sha256", file=str(src_file),
                        hint="the run directory is incomplete or was edited")
    if not ckpts:
        raise CheckpointError(f"run '{run}' has no checkpoint", file=str(run / "checkpoints"),
                              hint="train it first (or resume it with --resume)")
    if step is not None:
        ckpts = [p for p in ckpts if int(p.name[len(ck.PREFIX):]) == step]
        if not ckpts:
            raise CheckpointError(f"run '{run}' has no checkpoint for step {step}")
    path = ckpts[-1]
    model_t, _, state = ck.read_checkpoint(path)
    attn = attention or from_scheme(cfg, scheme)
    torch.manual_seed(cfg.seed)
    model = TransformerLM(cfg.model, attn.factory(cfg.model))
    ck.check_compatible(path, state, scheme_hash=attn.source_hash, config_hash=cfg.digest(), model=model)
    ck.load_into(model, None, model_t, {}, state)
    model.to(device).eval()
    done_file = run / "DONE.json"
    done = json.loads(read_text(done_file)) if done_file.exists() else None
    meta: dict[str, Any] = {"step": int(state["step"]), "checkpoint": path, "scheme": scheme,
                            "scheme_hash": attn.source_hash, "done": done, "run_dir": run}
    return model, cfg, meta
