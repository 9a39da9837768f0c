"""How a training or evaluation config is resolved: defaults <- preset <- the scheme's block <- overrides,
with flat keys (see :mod:`pedsl.config`)."""

from __future__ import annotations

from typing import Any, Mapping

from pedsl.config.models import DataConfig, EvalConfig, ModelConfig, TrainConfig
from pedsl.config.presets import PRESETS
from pedsl.errors import ConfigError, did_you_mean, quoted
from pedsl.yamlconfig import validate_model


def train_block_keys() -> set[str]:
    """Every key a scheme's ``train {}`` block (or an override) may use."""
    keys = set(TrainConfig.model_fields)
    keys |= set(ModelConfig.model_fields)
    keys |= set(DataConfig.model_fields) - set(TrainConfig.model_fields)
    keys |= {f"model.{k}" for k in ModelConfig.model_fields}
    keys |= {f"data.{k}" for k in DataConfig.model_fields}
    return keys


def eval_block_keys() -> set[str]:
    return set(EvalConfig.model_fields)


def _set_flat(d: dict[str, Any], key: str, value: Any, *, where: str) -> None:
    train_fields = set(TrainConfig.model_fields)
    if key == "scheme" and value not in ("", d.get("scheme")):  # config.yaml must name the scheme the command was given
        raise ConfigError(f"{where}: 'scheme' cannot be set here",
                          hint="the scheme is the file (or library name) the command is given")
    if key in ("model", "data") and isinstance(value, Mapping):
        for k, v in value.items():
            _set_flat(d, f"{key}.{k}", v, where=where)
    elif key == "data" and isinstance(value, str):
        d.setdefault("data", {})["source"] = value
    elif key == "params" and isinstance(value, Mapping):
        d.setdefault("params", {}).update(value)
    elif key in ("model", "data", "params"):
        raise ConfigError(f"{where}: '{key}' must be a mapping of settings"
                          + (" (or the name of a data source)" if key == "data" else "")
                          + f", not {type(value).__name__}")
    elif key in train_fields:
        d[key] = value
    elif key in ModelConfig.model_fields:
        d.setdefault("model", {})[key] = value
    elif key in DataConfig.model_fields:
        d.setdefault("data", {})[key] = value
    elif "." in key and key.split(".", 1)[0] in ("model", "data"):
        head, tail = key.split(".", 1)
        fields = (ModelConfig if head == "model" else DataConfig).model_fields
        if tail not in fields:
            raise ConfigError(f"{where}: unknown {head} setting '{tail}'",
                              hint=did_you_mean(tail, fields) or f"known: {', '.join(fields)}")
        d.setdefault(head, {})[tail] = value
    else:
        raise ConfigError(f"{where}: unknown training setting '{key}'",
                          hint=did_you_mean(key, train_block_keys()) or "see `pedsl.config.train_block_keys()`")


def resolve_train_config(
    *,
    scheme: str = "",
    params: Mapping[str, Any] | None = None,
    block: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    step_memory: bool = True,
) -> TrainConfig:
    """defaults <- preset <- scheme ``train {}`` block <- overrides, validated; ``step_memory``: also
    refuse a batch x context whose training step would not fit (off when a scheme is only loaded)."""
    block = dict(block or {})
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    preset = overrides.get("preset", block.get("preset", "tiny"))
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"unknown preset {quoted(preset)}",
                          hint=did_you_mean(str(preset), PRESETS) or f"presets: {', '.join(PRESETS)}")
    d: dict[str, Any] = {"scheme": scheme, "preset": preset}
    for k, v in PRESETS[preset].items():
        _set_flat(d, k, v, where=f"preset {preset}")
    for k, v in block.items():
        _set_flat(d, k, v, where="train block")
    for k, v in overrides.items():
        _set_flat(d, k, v, where="override")
    if params:
        d.setdefault("params", {}).update(params)
    # A new peak lr without a floor: decay to a tenth of it (the presets' ratio).
    lr = d.get("lr")
    if ("lr" in block or "lr" in overrides) and not ("min_lr" in block or "min_lr" in overrides) \
            and isinstance(lr, (int, float)) and not isinstance(lr, bool):  # else validation reports it
        d["min_lr"] = lr / 10
    # A preset's head_dim only holds with its own d_model / n_heads.
    # (a head_dim is re-derived when a later layer changes d_model or n_heads without giving one).
    bl, ov = _flat_model(block), _flat_model(overrides)
    resized_by_ov = "head_dim" not in ov and bool({"d_model", "n_heads"} & set(ov))
    resized_by_bl = "head_dim" not in ov and "head_dim" not in bl and bool({"d_model", "n_heads"} & set(bl))
    if resized_by_ov or resized_by_bl:
        d.get("model", {}).pop("head_dim", None)
    cfg = validate_model(TrainConfig, d, where="training config")
    issue = cfg.step_memory_issue() if step_memory else None
    if issue:
        raise ConfigError(f"training config: {issue}",
                          hint="pass --batch-size or --context (or --set batch_size=...) with smaller values")
    return cfg


def _flat_model(d: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in d.items() if k in ModelConfig.model_fields}
    out.update({k.split(".", 1)[1]: v for k, v in d.items() if k.startswith("model.")})
    if isinstance(d.get("model"), Mapping):
        out.update(d["model"])
    return out


def resolve_eval_config(*, block: Mapping[str, Any] | None = None,
                        overrides: Mapping[str, Any] | None = None, context: int = 128) -> EvalConfig:
    d: dict[str, Any] = {"context": context}
    for src, where in ((block or {}, "eval block"), (overrides or {}, "override")):
        for k, v in src.items():
            if v is None:
                continue
            if k not in EvalConfig.model_fields:
                raise ConfigError(f"{where}: unknown evaluation setting '{k}'",
                                  hint=did_you_mean(k, EvalConfig.model_fields)
                                  or f"known: {', '.join(EvalConfig.model_fields)}")
            d[k] = v
    return validate_model(EvalConfig, d, where="evaluation config")
