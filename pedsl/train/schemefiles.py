"""The resolved scheme of a run: every file it is made of (the main file and its import closure), hashed.

A run records the sha256 of every file its scheme is made of (library files included); a scheme of a
single file hashes to the sha256 of its bytes. :mod:`pedsl.train.rundir` writes the copy and checks it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pedsl.errors import OutputError

MAX_FILES = 1000  # files in one scheme's import closure


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class SchemeFiles:
    """The files of a resolved scheme: ``main`` and every import, by relative name (posix)."""

    main: str
    files: dict[str, bytes]
    digest: str = ""
    name: str | None = None  # the scheme's name (a file may declare several)

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", closure_digest(self.files))

    def manifest(self) -> dict[str, Any]:
        return {"main": self.main, "name": self.name, "sha256": self.digest,
                "files": {rel: _sha(data) for rel, data in sorted(self.files.items())}}


def closure_digest(files: dict[str, bytes]) -> str:
    """sha256 of the files in name order (name, length, bytes); of the bytes alone for one file."""
    if len(files) == 1:
        return _sha(next(iter(files.values())))
    h = hashlib.sha256()
    for rel in sorted(files):
        data = files[rel]
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def scheme_files(scheme: Any) -> SchemeFiles:
    """The files of a loaded :class:`~pedsl.lang.scheme.Scheme` (from its file, following the
    imports as the loader does). Each file is named by where its import leads relative to the
    file that imports it, so the copy resolves alone; a library file imported by name sits next
    to its importer. A scheme given as text is that text alone."""
    from pedsl.lang.parser import decode, parse_module, read_bytes  # on use: lark only when copying
    from pedsl.lang.imports import import_roots, import_target

    name = getattr(scheme, "name", None)
    file = getattr(scheme, "file", None)
    if not file or not Path(file).is_file():
        return SchemeFiles("scheme.pe", {"scheme.pe": scheme.source.encode()}, name=name)
    path = Path(file)
    top = path.parent.resolve()
    roots = import_roots(path.parent)
    main = top / path.name
    entries: dict[Path, bytes] = {}
    todo = [(main, path, path.parent)]
    while todo:
        virt, real, base = todo.pop()
        if virt in entries:
            if entries[virt] != read_bytes(real):
                raise OutputError(f"two different files of the scheme {path} would be copied to one name "
                                  f"'{virt.name}' ({real} and another)", file=str(real),
                                  hint="import each file under one path (symbolic links make two paths meet)")
            continue
        if len(entries) >= MAX_FILES:
            raise OutputError(f"the scheme {path} imports more than {MAX_FILES} files",
                              hint="a scheme is a few files; check its imports")
        try:
            data = read_bytes(real)
        except OSError as exc:
            raise OutputError(f"cannot read {real} (imported by the scheme {path}): {exc.strerror or exc}",
                              file=str(real)) from None
        text = decode(data, str(real))
        if virt == main and text.removeprefix("\ufeff") != scheme.source:
            raise OutputError(f"the scheme file {path} changed while it was being loaded",
                              file=str(path), hint="run the command again")
        entries[virt] = data
        for imp in parse_module(text, str(real)).imports:
            target, refused = import_target(base, imp.path, roots)
            if refused:  # the loader accepted it a moment ago: the files are changing
                raise OutputError(f"{refused} (in {real})", file=str(real), hint="run the command again")
            todo.append((Path(os.path.normpath(virt.parent / imp.path)), target, target.parent))
    common = Path(os.path.commonpath([str(v.parent) for v in entries]))
    files = {v.relative_to(common).as_posix(): data for v, data in entries.items()}
    return SchemeFiles(main.relative_to(common).as_posix(), files, name=name)


def attention_files(attn: Any) -> SchemeFiles:
    """The files of a :class:`~pedsl.train.recipe.SchemeRecipe` (one file for a stand-in
    module without a scheme: its source, hashed as the attention says)."""
    files = getattr(attn, "files", None)
    if files is not None:
        return files
    return SchemeFiles("scheme.pe", {"scheme.pe": attn.source.encode()}, digest=attn.source_hash, name=attn.name)


def describe_change(recorded: dict[str, Any] | None, now: SchemeFiles) -> str:
    """Which files of a scheme differ from a run's manifest, in words."""
    if not recorded or not isinstance(recorded.get("files"), dict):
        return "the run's scheme.sha256 differs from this scheme's"
    old, new = recorded["files"], {rel: _sha(d) for rel, d in now.files.items()}
    parts = []
    changed = [rel for rel in sorted(set(old) & set(new)) if old[rel] != new[rel]]
    if changed:
        parts.append("changed: " + ", ".join(changed))
    if set(new) - set(old):
        parts.append("now imported: " + ", ".join(sorted(set(new) - set(old))))
    if set(old) - set(new):
        parts.append("no longer part of it: " + ", ".join(sorted(set(old) - set(new))))
    return "; ".join(parts) or "the files are the same but the recorded sha256 differs"
