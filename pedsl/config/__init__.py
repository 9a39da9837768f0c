"""Configuration models for training and evaluation (pydantic v2, ``extra="forbid"``).

Resolution order for a training run (later wins)::

    field defaults  <-  preset (tiny/small/base)  <-  the scheme's `train { ... }` block  <-  CLI overrides

Keys in a scheme's ``train {}`` block and in CLI/YAML overrides are *flat*: any field of
:class:`TrainConfig` (``steps``, ``context``, ``lr`` ...), any field of :class:`ModelConfig`
(``n_layers``, ``d_model`` ...), any field of :class:`DataConfig` that does not collide with a
train field (``source``, ``val_fraction`` ...), or a dotted path (``model.d_model``,
``data.seed``). ``data = "passkey"`` is short for ``data.source = "passkey"``.
:func:`train_block_keys` / :func:`eval_block_keys` list what the checker should accept.

The same models are what ``pedsl compile`` writes as ``train.yaml`` / ``eval.yaml`` and what
``pedsl train train.yaml`` reads back (:meth:`TrainConfig.from_yaml`).

Modules: :mod:`.models` (the Pydantic models), :mod:`.presets` (``PRESETS``) and :mod:`.overrides`
(the resolution above). Everything is importable from ``pedsl.config``.
"""

from __future__ import annotations

from pedsl.config.models import (RESUMABLE_FIELDS, DataConfig, EvalConfig, EvalTask, InitFrom, ModelConfig,
                                 TrainConfig)
from pedsl.config.overrides import eval_block_keys, resolve_eval_config, resolve_train_config, train_block_keys
from pedsl.config.presets import PRESETS

__all__ = ["PRESETS", "RESUMABLE_FIELDS", "DataConfig", "EvalConfig", "EvalTask", "InitFrom", "ModelConfig",
           "TrainConfig", "eval_block_keys", "resolve_eval_config", "resolve_train_config", "train_block_keys"]
