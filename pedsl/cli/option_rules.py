"""The rule every command keeps: an option either acts or is refused, and a ``--set`` key that no
part of the run reads is an error naming it.

An option that a mode does not use, an option whose value a ``--set`` of the same setting would
silently replace, a ``--set`` key that nothing reads: each is a usage error (exit 2) naming the
option or key, never a run that quietly answers another question.
``compiler_tests/cli/test_cli_option_sweep.py`` walks the command tree and holds every command to it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import click
from click.core import ParameterSource

from pedsl.errors import UsageError, did_you_mean

# --set keys that are part of a training config but that no command lets --set change: they would
# be recorded in config.yaml without reaching the scheme or the weights.
NOT_SETTABLE = {
    "params": "scheme parameters are -P NAME=VALUE (pedsl train), not --set params=",
    "init_from": "a fine-tune starts with `pedsl train --init-from RUN`",
    "scheme": "the scheme is the file (or library name) the command is given",
}


def given(name: str, ctx: click.Context | None = None) -> bool:
    """Whether the parameter ``name`` (its Python name) was written on the command line."""
    ctx = ctx or click.get_current_context()
    return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def flag_of(name: str, ctx: click.Context | None = None) -> str:
    """The option's long name as the user writes it (``seeds`` -> ``--seeds``)."""
    ctx = ctx or click.get_current_context()
    for p in ctx.command.params:
        if p.name == name:
            longs = [o for o in p.opts if o.startswith("--")]
            return (longs or p.opts)[0]
    return "--" + name.replace("_", "-")


def refuse_given(names: Iterable[str], why: str, hint: str | None = None, ctx: click.Context | None = None) -> None:
    """A usage error naming every option of ``names`` that was given: ``why`` says what makes them unused."""
    ctx = ctx or click.get_current_context()
    used = [flag_of(n, ctx) for n in names if given(n, ctx)]
    if used:
        raise UsageError(f"{', '.join(used)}: {why}", hint=hint)


def check_set_keys(sets: Mapping[str, Any], known: Iterable[str], *, what: str = "training setting",
                   flag: str = "--set") -> None:
    """Every key of ``sets`` is one the run reads; otherwise a usage error naming it with a did-you-mean."""
    known = set(known)
    for key in sets:
        if key in NOT_SETTABLE:
            raise UsageError(f"{flag} {key}=: not a setting {flag} can change", hint=NOT_SETTABLE[key])
        if key not in known:
            plain = sorted(k for k in known if "." not in k)
            raise UsageError(f"{flag} {key}=: no part of this run reads a {what} '{key}'",
                             hint=did_you_mean(key, known) or f"known: {', '.join(plain)}"
                             + (" (also as model.NAME / data.NAME)" if len(plain) < len(known) else ""))


def set_conflicts(sets: Mapping[str, Any], options: Mapping[str, str], ctx: click.Context | None = None) -> None:
    """An option given on the command line and ``--set`` of the setting it sets, with another value:
    one of them would be silently dropped, so a usage error naming both. ``options``: option name ->
    the --set keys (comma-separated) of the same setting."""
    ctx = ctx or click.get_current_context()
    for name, keys in options.items():
        if not given(name, ctx):
            continue
        value = ctx.params[name]
        for key in keys.split(","):
            if key in sets and sets[key] != value:
                raise UsageError(f"{flag_of(name, ctx)} {value} and --set {key}={sets[key]} set the same thing "
                                 "differently", hint="give one of them (or the same value in both)")


def train_set_keys() -> set[str]:
    """The --set keys of a training run (pedsl.config's flat keys), less those no command may set."""
    from pedsl.config import train_block_keys

    return train_block_keys() - set(NOT_SETTABLE)
