"""pedsl's on/off environment variables, read by one parser.

Each switch is a record in :data:`SWITCHES` (its default and what it turns on). A value is read the same
way everywhere: ``1 / true / on / yes`` and ``0 / false / off / no``, in any case, with spaces around it
ignored (``" 0"``, ``OFF``), a run of digits by its number (``00`` is 0); unset or empty is the default.
Anything else is refused by name (:class:`SwitchError`, exit code 2): a typo must never leave a switch
quietly in its other position. The CLI checks every switch before a command runs (:func:`check_all`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pedsl.errors import UsageError, quoted

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Switch:
    default: bool
    meaning: str  # what the switch does when on


SWITCHES: dict[str, Switch] = {
    "PEDSL_CPU_KERNELS": Switch(True, "build (once per machine) and use pedsl's C++ CPU kernels for sliding "
                                      "windows and FIRE; off: the torch paths, same results"),
    "PEDSL_DEBUG": Switch(False, "an internal error shows its Python traceback"),
    "PEDSL_NO_CACHE": Switch(False, "the parser's tables are rebuilt instead of cached in ~/.cache/pedsl"),
}


class SwitchError(UsageError):
    """An environment switch set to a value that is neither on nor off."""

    default_code = "E995"


def parse(name: str, value: str | None) -> bool:
    """The position of switch ``name`` given its raw environment ``value`` (None: unset)."""
    text = "" if value is None else value.strip().lower()
    if not text:
        return SWITCHES[name].default
    if text.isdigit() and int(text) in (0, 1):
        return bool(int(text))
    if text in ON or text in OFF:
        return text in ON
    raise SwitchError(f"environment variable {name}={quoted(value)} is neither on nor off",
                      hint=f"{name}: {SWITCHES[name].meaning}. Set it to 1, true, on or yes, or to 0, false, off "
                           "or no (any case), or unset it")


def switch(name: str) -> bool:
    """Whether switch ``name`` is on in this process's environment; :class:`SwitchError` for another value."""
    return parse(name, os.environ.get(name))


def switch_or_default(name: str) -> bool:
    """:func:`switch`, with an unreadable value taken as the default: for the one place that must not raise
    (the CLI's report of an internal error)."""
    try:
        return switch(name)
    except SwitchError:
        return SWITCHES[name].default


def check_all() -> None:
    """Refuse the first switch whose value is neither on nor off (the CLI calls this before any command)."""
    for name in SWITCHES:
        switch(name)
