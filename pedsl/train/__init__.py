"""Training a small byte-level language model on a compiled scheme, and the run directory.

Run directory format (``pedsl train ... --out RUN``; read by :func:`load_run` and by eval)::

    RUN/.pedsl-run        {"pedsl": "run folder", "format": 1}: written first, the proof that the
                          folder is a pedsl run (pedsl.train.rundir.is_run)
    RUN/config.yaml       the resolved TrainConfig (pedsl.config), YAML
    RUN/scheme.pe         the main scheme file's source text
    RUN/scheme/           a copy of every file of the resolved scheme (the main file and its whole
                          import closure, library files included) under the relative names its
                          imports use, so the copy loads by itself (pedsl.train.rundir)
    RUN/scheme.json       {"main": relative name in scheme/, "name", "sha256", "files": {name: sha256}}
    RUN/scheme.sha256     the sha256 of the resolved scheme (all its files; of the bytes alone for a
                          single file), one line
    RUN/.pedsl.lock       the lock of the process training into the folder (pid, host)
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
    RUN/checkpoints/step_XXXXXXX.bad[.N]/  a checkpoint that did not restore, moved aside on --resume
    RUN/DONE.json         written at the end: steps, val_loss, unigram_baseline (nats/byte),
                          wall_time_s, tokens_per_s, n_params, scheme, scheme_hash, data, world_size

API: :func:`pedsl.train.loop.train` (what ``pedsl train`` runs) and :func:`load_run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pedsl.errors import CheckpointError
from pedsl.fsio import read_text
from pedsl.strictparse import load_json

__all__ = ["load_run", "train"]


def train(*args, **kwargs):
    """:func:`pedsl.train.loop.train` (imported on call: ``import pedsl.train`` stays free of torch)."""
    from pedsl.train import loop

    return loop.train(*args, **kwargs)


def load_run(run_dir: str | Path, *, device: str = "cpu", step: int | None = None, attention=None):
    """Rebuild a trained model from its run directory.

    Returns ``(model, cfg, meta)``: the :class:`~pedsl.model.TransformerLM` in eval mode with the
    latest checkpoint (or ``step``) loaded, its :class:`~pedsl.config.TrainConfig`, and ``meta``
    with ``step``, ``checkpoint`` (path), ``scheme`` (the loaded Scheme), ``scheme_hash``,
    ``done`` (DONE.json or None), ``run_dir``. ``attention`` (a
    :class:`~pedsl.train.recipe.SchemeRecipe`) replaces the scheme of the run (tests).
    """
    import torch

    from pedsl.lang.imports import allow_import_roots
    from pedsl.model import TransformerLM
    from pedsl.train import checkpoint as ck
    from pedsl.train import rundir
    from pedsl.train.recipe import from_scheme

    r = rundir.read(run_dir)
    run, cfg, ckpts = r.path, r.cfg, r.checkpoints
    scheme = None
    if attention is None:
        scheme, _ = r.load_scheme()  # from the run's own copy, verified against scheme.sha256
    if not ckpts:
        raise CheckpointError(f"run '{run}' has no checkpoint", file=str(run / "checkpoints"),
                              hint="train it first (or resume it with --resume)")
    if step is not None:
        ckpts = [p for p in ckpts if int(p.name[len(ck.PREFIX):]) == step]
        if not ckpts:
            raise CheckpointError(f"run '{run}' has no checkpoint for step {step}")
    path = ckpts[-1]
    model_t, _, state = ck.read_checkpoint(path)
    with allow_import_roots(r.copy_root()):  # the compiler reloads the copy with the model's head sizes
        attn = attention or from_scheme(cfg, scheme)
        torch.manual_seed(cfg.seed)
        model = TransformerLM(cfg.model, attn.factory(cfg.model))
    ck.check_compatible(path, state, scheme_hash=attn.source_hash, config_hash=cfg.digest(), model=model)
    ck.load_into(model, None, model_t, {}, state)
    model.to(device).eval()
    done_file = run / "DONE.json"
    try:
        done = load_json(read_text(done_file, 16 << 20)) if done_file.exists() else None  # never read whole
    except (OSError, ValueError):
        done = None  # a damaged DONE.json: the checkpoint is what counts
    meta: dict[str, Any] = {"step": int(state["step"]), "checkpoint": path, "scheme": scheme,
                            "scheme_hash": attn.source_hash, "done": done, "run_dir": run}
    return model, cfg, meta
