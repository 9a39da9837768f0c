"""The scheme library, and the one rule for "a path or a library name" every command follows.

``pedsl explain rope``, ``pedsl diff rope yarn``, ``pedsl train rope``, ``pedsl compile rope -o out``,
``pedsl compare rope yarn``: an argument that names no file and does not look like a path is the
name of a library scheme (``schemes/<name>.pe``, shipped inside the wheel as ``pedsl/schemes``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pedsl.errors import CheckError, did_you_mean


def library_dir() -> Path:
    """The scheme library: the installed copy (pedsl/schemes) or the checkout's schemes/."""
    pkg = Path(__file__).resolve().parent.parent
    installed = pkg / "schemes"
    return installed if installed.is_dir() else pkg.parent / "schemes"


def library_names() -> list[str]:
    lib = library_dir()
    return sorted(p.stem for p in lib.glob("*.pe")) if lib.is_dir() else []


def looks_like_path(item: str | Path) -> bool:
    """A ``.pe`` (or other) suffix, a folder separator, or an existing file: a path, never a library name."""
    text = str(item)
    seps = {"/", os.sep, os.altsep or "/"}
    return bool(Path(text).suffix) or any(s in text for s in seps) or Path(text).is_file()


def is_library_name(item: str | Path) -> bool:
    """A bare name (no suffix, no separator) that is not a file here: looked up in the library."""
    return not looks_like_path(item)


def scheme_file(item: str | Path) -> Path:
    """The `.pe` file an argument means: a path as given, or the library's ``<name>.pe`` for a bare name.

    A bare name that the library does not have is a :class:`CheckError` (E209) with a did-you-mean
    over the library's names; whether a path exists is left to the reader.
    """
    if looks_like_path(item):
        return Path(item)
    name = str(item)
    cand = library_dir() / f"{name}.pe"
    if cand.is_file():
        return cand
    known = library_names()
    raise CheckError(f"no scheme '{name}': not a file here, nor a scheme of the library ({library_dir()})",
                     code="E209", file=name,
                     hint=did_you_mean(name, known) or ("library schemes: " + ", ".join(known) if known
                                                        else "give the path of a .pe file"))
