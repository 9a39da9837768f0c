"""The training and evaluation configs a scheme implies: the presets under its ``train {}`` /
``eval {}`` blocks and the overrides.

Every command that turns a scheme into a config goes through :func:`train_config` /
:func:`eval_config` (``pedsl train``, ``pedsl compile``, the fine-tunes of :mod:`pedsl.train.swap`,
the studies). This module sits above both :mod:`pedsl.config` (settings, which the checker reads to
validate those blocks) and :mod:`pedsl.lang` (which loads the scheme), so neither of them imports
the other's way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pedsl.config import EvalConfig, TrainConfig, resolve_eval_config, resolve_train_config
from pedsl.lang.api import load


def train_config(scheme, source: str | Path, *, params: Mapping[str, Any] | None = None,
                 overrides: Mapping[str, Any] | None = None, base: TrainConfig | None = None) -> TrainConfig:
    """The training config of the loaded ``scheme`` (read from ``source``, which the config records).

    defaults <- preset <- the scheme's ``train {}`` block <- ``overrides`` (None values are not
    given). With ``base`` (a train.yaml, or the run a fine-tune starts from) its settings take the
    place of the scheme's block: the model, data and optimizer are that config's.
    """
    if base is None:
        block = dict(getattr(scheme, "train", None) or {})
    else:
        block = base.model_dump(mode="json")
        block.pop("scheme")
        block.pop("params")
    return resolve_train_config(scheme=str(source), params=dict(params) if params else None, block=block,
                                overrides=overrides)


def eval_config(scheme, *, context: int, overrides: Mapping[str, Any] | None = None) -> EvalConfig:
    """defaults <- the scheme's ``eval {}`` block <- ``overrides``; lengths scale from ``context``."""
    return resolve_eval_config(block=dict(getattr(scheme, "eval", None) or {}), overrides=overrides or {},
                               context=context)


def train_config_from_scheme(scheme_path: str | Path, params: Mapping[str, Any] | None = None,
                             overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """:func:`train_config` of the scheme file (or library name) ``scheme_path``."""
    scheme = load(str(scheme_path), params=dict(params) if params else None)
    return train_config(scheme, scheme_path, params=params, overrides=overrides)


def eval_config_from_scheme(scheme_path: str | Path, params: Mapping[str, Any] | None = None,
                            overrides: Mapping[str, Any] | None = None,
                            context: int | None = None) -> EvalConfig:
    """:func:`eval_config` of the scheme file ``scheme_path``; ``context`` defaults to its training config's."""
    scheme = load(str(scheme_path), params=dict(params) if params else None)
    if context is None:
        context = train_config(scheme, scheme_path).context
    return eval_config(scheme, context=context, overrides=overrides)
