"""Option values shared by several commands: ``-P name=value`` (raw text for the resolver, or read as
YAML where a run takes them) and ``--set key=value``."""

from __future__ import annotations

from typing import Iterable

from pedsl.errors import UsageError


def key_values(items: tuple[str, ...], flag: str = "--set", example: str = "batch_size=8") -> dict:
    """``("a=1", "b=[2, 3]")`` -> ``{"a": 1, "b": [2, 3]}``: each value read as YAML (a number, a
    list, true/false), or kept as text when it is not valid YAML (validation then says what is wrong)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"{flag} expects NAME=VALUE, got '{item}'", hint=f"e.g. {flag} {example}")
        name, value = item.split("=", 1)
        try:
            out[name.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[name.strip()] = value
    return out


def raw_params(items: Iterable[str]) -> dict[str, str]:
    """``-P name=value`` options -> {name: raw value}; the resolver coerces and checks them."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(
                f"-P expects name=value, got {item!r}", code="E991",
                hint="e.g. -P factor=8 or -P train_length=256",
            )
        out[name] = value
    return out


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
