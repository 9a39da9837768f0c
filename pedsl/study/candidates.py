"""A study's default schemes as data: candidates that join the study once this pedsl loads them.

A study lists :class:`Candidate` records; :func:`pick` runs the SCHEMES a user named (a candidate's
name meaning its file) or, when none were named, the candidates that load, and says why each of the
others is left out (a library scheme this pedsl does not have yet, a construct its language lacks).
"""

from __future__ import annotations

from dataclasses import dataclass

from pedsl.errors import PedslError
from pedsl.lang.library import scheme_file
from pedsl.train.recipe import load_scheme


@dataclass(frozen=True)
class Candidate:
    """A scheme a study compares by default: its run name, library name or file, and what it is."""

    name: str
    source: str
    title: str


def available(c: Candidate) -> str | None:
    """None when this pedsl loads the candidate, else why not (one line)."""
    try:
        load_scheme(scheme_file(c.source))
    except PedslError as err:
        return err.diagnostics[0].message.splitlines()[0]
    return None


def pick(schemes: list[str], candidates: tuple[Candidate, ...]) -> tuple[list[str], dict[str, str]]:
    """The scheme items to run (``schemes`` as given, a candidate's name meaning its file; else the
    loadable candidates) and the candidates left out, ``{name: why}``."""
    if schemes:
        by_name = {c.name: c.source for c in candidates}
        return [by_name.get(s, s) for s in schemes], {}
    items, skipped = [], {}
    for c in candidates:
        why = available(c)
        if why is None:
            items.append(c.source)
        else:
            skipped[c.name] = why
    return items, skipped
