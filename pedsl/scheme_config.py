"""The training and evaluation configs a scheme file implies: the presets under its ``train {}`` /
``eval {}`` blocks and the overrides.

Above both :mod:`pedsl.config` (settings, which the checker reads to validate those blocks) and
:mod:`pedsl.lang` (which loads the scheme), so neither of them imports the other's way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pedsl.config import EvalConfig, TrainConfig, resolve_eval_config, resolve_train_config
from pedsl.lang.api import load


def train_config_from_scheme(scheme_path: str | Path, params: Mapping[str, Any] | None = None,
                             overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    scheme = load(str(scheme_path), params=dict(params) if params else None)
    return resolve_train_config(scheme=str(scheme_path), params=params, block=scheme.train,
                                overrides=overrides)


def eval_config_from_scheme(scheme_path: str | Path, params: Mapping[str, Any] | None = None,
                            overrides: Mapping[str, Any] | None = None,
                            context: int | None = None) -> EvalConfig:
    """defaults <- scheme ``eval {}`` block <- overrides; ``context`` from the train config."""
    scheme = load(str(scheme_path), params=dict(params) if params else None)
    if context is None:
        context = resolve_train_config(scheme=str(scheme_path), block=scheme.train).context
    return resolve_eval_config(block=scheme.eval, overrides=overrides, context=context)
