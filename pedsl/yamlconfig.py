"""Reading a YAML config file (strictly: :mod:`pedsl.strictparse`) and validating it against a pydantic model, with one-paragraph
errors: a missing, oversized, non-UTF-8 or malformed file, a setting that is not known (with a
did-you-mean), or a value out of range (naming the setting, for a positioned diagnostic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from pedsl import limits as L
from pedsl.errors import ConfigError, did_you_mean, quoted
from pedsl.fsio import read_bytes
from pedsl.strictparse import StrictParseError, load_yaml

MAX_YAML_BYTES = L.MAX_CONFIG_BYTES  # a config is a screenful of settings: more is the wrong file


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        raw = read_bytes(p, MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError(f"config file '{p}' is larger than {MAX_YAML_BYTES:,} bytes", file=str(p),
                              hint="a config is a screenful of settings: is this the right file?")
        data = load_yaml(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file '{p}' does not exist", file=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{p}': {exc.strerror or exc}", file=str(p)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file '{p}' is not UTF-8 text ({exc.reason} at byte {exc.start})",
                          file=str(p)) from None
    except StrictParseError as exc:
        raise ConfigError(f"'{p}' is not a config pedsl reads: {exc.message}", file=str(p), line=exc.line,
                          hint="a config is plain YAML: no aliases (*name), each key once, a few levels deep") from None
    if not isinstance(data, dict):
        raise ConfigError(f"'{p}' must hold a mapping of settings, not {type(data).__name__}", file=str(p))
    return data


def validate_model(cls: type[BaseModel], data: Mapping[str, Any], *, where: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            name = str(err["loc"][-1])
            owner: type[BaseModel] = cls
            for part in err["loc"][:-1]:
                f = owner.model_fields.get(str(part))
                ann = getattr(f, "annotation", None) if f else None
                if isinstance(ann, type) and issubclass(ann, BaseModel):
                    owner = ann
            raise ConfigError(f"{where}: unknown setting '{loc}'",
                              hint=did_you_mean(name, owner.model_fields)
                              or f"known: {', '.join(owner.model_fields)}") from None
        got = f" (got {quoted(err.get('input'))})" if loc else ""
        msg = err["msg"].removeprefix("Value error, ")
        error = ConfigError(f"{where}: invalid value for '{loc or cls.__name__}': {msg}{got}",
                            hint=_LIMIT_HINT if "less than or equal" in err["msg"] else None)
        error.field = loc  # the setting at fault, for a positioned diagnostic in `pedsl check`
        raise error from None


_LIMIT_HINT = "pedsl caps the values that size memory or time: see pedsl/limits.py or docs/safety.md (Resource caps)"
