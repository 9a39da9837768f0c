"""Option values shared by several commands: ``-P name=value`` (one reading everywhere: the text the
resolver coerces, :func:`pedsl.lang.params.parse_override`) and ``--set key=value`` (read as YAML,
strictly: :mod:`pedsl.strictparse`)."""

from __future__ import annotations

from typing import Iterable

from pedsl.errors import UsageError, clip, quoted
from pedsl.lang.params import parse_override
from pedsl.strictparse import MalformedText, StrictParseError, load_yaml


def key_values(items: tuple[str, ...], flag: str = "--set", example: str = "batch_size=8") -> dict:
    """``("a=1", "b=[2, 3]")`` -> ``{"a": 1, "b": [2, 3]}``: each value read as YAML (a number, a
    list, true/false), or kept as text when it is not valid YAML (validation then says what is wrong);
    an alias, a duplicate key or deep nesting is a usage error."""
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"{flag} expects NAME=VALUE, got '{item}'", hint=f"e.g. {flag} {example}")
        name, value = item.split("=", 1)
        try:
            out[name.strip()] = load_yaml(value)
        except MalformedText:
            out[name.strip()] = value
        except StrictParseError as exc:
            raise UsageError(f"{flag} {clip(name.strip(), 60)}=...: {exc.message}",
                             hint="give the value written out as plain YAML (a number, a list, a mapping)") from None
    return out


def raw_params(items: Iterable[str]) -> dict[str, str]:
    """``-P name=value`` options -> {name: raw value}; the resolver coerces and checks them."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(
                f"-P expects name=value, got {quoted(item)}", code="E991",
                hint="e.g. -P factor=8 or -P train_length=256",
            )
        out[name] = value
    return out


def param_values(items: Iterable[str]) -> dict[str, object]:
    """``-P`` options read as every command reads them (:func:`raw_params`, then the resolver's
    :func:`~pedsl.lang.params.parse_override`: int, float, bool or text), for the commands that record
    the values (a run's config.yaml): ``-P base=0x10`` is the text '0x10' here as in ``pedsl check``."""
    return {name: parse_override(value) for name, value in raw_params(items).items()}


def jobs(text: str) -> int | str:
    """``--jobs``: a count of worker processes (1: the study runs in this process) or ``auto`` (the idle cores)."""
    from pedsl.limits import MAX_THREADS

    if text.strip().lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise UsageError(f"--jobs expects a number of worker processes from 1 to {MAX_THREADS} or 'auto', got '{text}'",
                         hint="e.g. --jobs 2, or --jobs auto for one per idle core")
    return n


def output_path(ctx, param, value):
    """Click callback of every output path option (``-o`` / ``--out``): a path the system cannot hold (a name
    past 255 bytes, the whole past 4095) is refused by :func:`pedsl.fsio.check_path` before anything runs."""
    from pedsl.fsio import check_path

    if value is not None:
        check_path(value)
    return value
