"""The run folder's integrity: the resolved scheme and its copy, the lock, what may be written.

- **The resolved scheme.** A run records the sha256 of every file its scheme is made of (the main
  file and its whole import closure, library files included) in ``RUN/scheme.sha256`` and keeps a
  copy of each under ``RUN/scheme/`` with the relative names the imports use, so the copy loads by
  itself; ``RUN/scheme.json`` lists each file's sha256, so a mismatch names the file that changed.
  A scheme of a single file hashes to the sha256 of its bytes.
  The files and their hash: :mod:`pedsl.train.schemefiles`.
- **The lock.** ``RUN/.pedsl.lock`` under an exclusive ``fcntl.flock``: a second ``pedsl train`` into
  the same folder is refused (:mod:`pedsl.train.runlock`, with the temporary checkpoint folders).
- **What may be written.** A run goes only into a new or empty folder or a pedsl run folder, which
  pedsl proves by ``RUN/.pedsl-run`` (a marker it writes first, with the folder's format version);
  a complete run from before the marker is recognised by its manifest, hashes and config (and gets
  the marker when it is next trained). Anything else is refused unmodified. Neither the folder nor
  any file or folder of a run is written through a symbolic link.
- **One reader.** :func:`read` opens a run folder for ``load_run`` (eval, analyze, compare) and
  loads its scheme from the copy, verified against the recorded sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pedsl.config import TrainConfig
from pedsl.errors import CheckpointError, ConfigError, EvalError, OutputError, PedslError, quoted
from pedsl.fsio import atomic_write_bytes, atomic_write_text, read_bytes, read_text, refuse_symlink
from pedsl.strictparse import StrictParseError, load_json
from pedsl.train.runlock import LOCK_NAME, RunLock, clean_temporary, describe_owner
from pedsl.train.schemefiles import SchemeFiles, describe_change, scheme_files

SCHEME_DIR = "scheme"
MANIFEST = "scheme.json"


# ---------------------------------------------------------------------------------------------
# Writing: which folders may hold a run, no symbolic links, the copy of the scheme


MARKER = ".pedsl-run"  # written first into every run folder: the proof that pedsl made it
RUN_FORMAT = 1  # the layout of a run folder; a newer pedsl that changes it raises this


def marker_format(run: Path) -> int | None:
    """The format version in ``RUN/.pedsl-run``, or None when the folder has no valid marker."""
    p = run / MARKER
    if p.is_symlink() or not p.is_file():
        return None
    try:
        data = load_json(read_text(p, 4096))
    except (OSError, UnicodeDecodeError, StrictParseError):
        return None
    fmt = data.get("format") if isinstance(data, dict) and data.get("pedsl") == "run folder" else None
    return fmt if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt >= 1 else None


def write_marker(run: Path) -> None:
    atomic_write_text(run / MARKER, json.dumps({"pedsl": "run folder", "format": RUN_FORMAT}) + "\n")


def is_run(run: Path) -> bool:
    """A pedsl run folder: it holds pedsl's marker, or is a complete run of a pedsl from before the
    marker (:func:`is_unmarked_run`), or holds nothing but pedsl's lock file (a run that stopped
    before writing anything)."""
    if marker_format(run) is not None:
        return True
    try:
        if all(p.name == LOCK_NAME for p in run.iterdir()):
            return True
    except OSError:
        return False
    return is_unmarked_run(run)


def is_unmarked_run(run: Path) -> bool:
    """A run written before runs carried a marker, proven by what only pedsl writes together:
    ``scheme.sha256`` equal to the manifest's sha256, ``scheme/`` holding exactly the files the
    manifest lists (each with its sha256, no links), and a ``config.yaml`` that is a training config.
    A folder that merely looks like a run (a hash file, a ``scheme/`` folder of other files) is not one."""
    recorded, manifest, root = recorded_hash(run), recorded_manifest(run), run / SCHEME_DIR
    if recorded is None or re.fullmatch(r"[0-9a-f]{64}", recorded) is None or manifest is None:
        return False
    listed = manifest.get("files")
    if manifest.get("sha256") != recorded or not isinstance(listed, dict) or not listed:
        return False
    if root.is_symlink() or not root.is_dir() or _copied_files(root) != set(listed):
        return False
    for rel, digest in listed.items():
        try:
            if hashlib.sha256(read_bytes(root / rel, MAX_COPY_BYTES)).hexdigest() != digest:
                return False
        except OSError:
            return False
    try:
        TrainConfig.from_yaml(run / "config.yaml")
    except ConfigError:
        return False
    return not (run / "config.yaml").is_symlink()


MAX_COPY_BYTES = 1 << 24  # a scheme's file is a few kB


def _copied_files(root: Path) -> set[str] | None:
    """The relative names of the regular files under ``root``; None when it holds anything else."""
    out = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                return None
        out |= {(Path(folder) / name).relative_to(root).as_posix() for name in files}
    return out


def check_out_folder(run: Path) -> None:
    """Refuse a ``--out`` that exists, is not empty and is not a pedsl run (its files would be overwritten)."""
    refuse_symlink(run)  # a run is never written through a link (into the folder it points to)
    if not run.exists():
        return
    if not run.is_dir():
        raise OutputError(f"cannot write the run directory '{run}': it is a file", hint="choose another --out")
    try:
        entries = sorted(p.name for p in run.iterdir())
    except OSError as exc:
        raise OutputError(f"cannot read the run directory '{run}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    if entries and not is_run(run):
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise OutputError(f"'{run}' is not empty and is not a pedsl run folder (it holds {shown})",
                          file=str(run), hint="choose a new or empty --out: a run never writes into "
                                              "another folder's files")
    fmt = marker_format(run)
    if fmt is not None and fmt > RUN_FORMAT:
        raise OutputError(f"'{run}' is a run folder of a newer pedsl (format {fmt}; this one writes format "
                          f"{RUN_FORMAT})", file=str(run / MARKER), hint="use the newer pedsl, or another --out")


def no_links(run: Path, *names: str) -> None:
    """Refuse when any of ``RUN/name`` (or a folder on the way to it) is a symbolic link."""
    for name in names:
        p = run
        for part in Path(name).parts:
            p = p / part
            refuse_symlink(p)


def write_scheme(run: Path, files: SchemeFiles, source: str) -> None:
    """``RUN/scheme.pe`` (the main file's text), ``RUN/scheme/`` (every file), the manifest and the sha256."""
    no_links(run, SCHEME_DIR, "scheme.pe", "scheme.sha256", MANIFEST)
    atomic_write_text(run / "scheme.sha256", files.digest + "\n")  # first: the folder is a run from here on
    root = run / SCHEME_DIR
    if root.exists():
        shutil.rmtree(root)
    for rel, data in sorted(files.files.items()):
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data)
    atomic_write_text(run / "scheme.pe", source)
    atomic_write_text(run / MANIFEST, json.dumps(files.manifest(), indent=1) + "\n")


def recorded_manifest(run: Path) -> dict[str, Any] | None:
    try:
        data = load_json(read_text(run / MANIFEST, 1 << 20))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_hash(run: Path) -> str | None:
    try:
        return read_text(run / "scheme.sha256", 100).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def verify_scheme(run: Path, files: SchemeFiles, *, what: str) -> None:
    """CheckpointError when the run was trained with another resolved scheme than ``files``."""
    recorded = recorded_hash(run)
    if recorded is None or recorded == files.digest:
        return
    manifest = recorded_manifest(run)
    detail = describe_change(manifest, files)
    main = (manifest or {}).get("main")
    own = (f"to continue the run as it was, train its own copy: `pedsl train {run / SCHEME_DIR / main} --out {run} "
           f"--resume`; " if isinstance(main, str) and (run / SCHEME_DIR / main).is_file() else "")
    raise CheckpointError(
        f"cannot {what} '{run}': it was trained with another scheme ({detail}; sha256 {recorded[:12]}... in "
        f"the run, {files.digest[:12]}... now)", file=str(run / "scheme.sha256"),
        hint=own + "for the changed scheme choose a new --out, or pass --force-new to discard this run and start over")


def open_for_training(run: Path, quiet: bool = False) -> RunLock:
    """Check that ``run`` may hold a run, create it, lock it and clean up after interrupted
    checkpoint writes. Returns the held lock (release it when training ends)."""
    check_out_folder(run)
    try:
        run.mkdir(parents=True, exist_ok=True)
        if not os.access(run, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise OutputError(f"cannot write the run directory '{run}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    lock = RunLock(run).acquire()
    try:
        no_links(run, MARKER, "checkpoints", "config.yaml", "metrics.jsonl", "DONE.json")
        if marker_format(run) is None:  # a new folder, or a run from before the marker: from here on a run
            write_marker(run)
        removed = clean_temporary(run / "checkpoints")
    except BaseException:
        lock.release()
        raise
    if not quiet:
        if lock.stale:
            print(f"pedsl train: took over the lock of a run that ended without releasing it "
                  f"({describe_owner(lock.stale)})", file=sys.stderr)
        if removed:
            print(f"pedsl train: removed {len(removed)} temporary checkpoint folder(s) of interrupted runs: "
                  + ", ".join(p.name for p in removed), file=sys.stderr)
    return lock


# ---------------------------------------------------------------------------------------------
# Reading a run folder


@dataclass
class Run:
    """A run folder opened for reading: its config, recorded scheme and checkpoints."""

    path: Path
    cfg: Any
    scheme_hash: str | None
    manifest: dict[str, Any] | None
    checkpoints: list[Path]

    def scheme_name(self) -> str | None:
        if self.manifest and isinstance(self.manifest.get("name"), str):
            return self.manifest["name"]
        if self.checkpoints:
            try:
                return load_json(read_text(self.checkpoints[-1] / "state.json", 64 << 20)).get("scheme_name")
            except (OSError, ValueError, AttributeError):
                return None
        return None

    def copy_root(self) -> Path:
        return self.path / SCHEME_DIR

    def own_copy(self) -> Path | None:
        """The run's copy of its main scheme file (``RUN/scheme/<main>`` as ``scheme.json`` names it),
        None when the manifest names none. EvalError when the name leads out of ``RUN/scheme/``
        (an absolute path, ``..``, a symbolic link): a run is read only through what it holds."""
        main = (self.manifest or {}).get("main")
        if not isinstance(main, str) or not main:
            return None
        root = self.copy_root()
        if Path(main).is_absolute() or ".." in Path(main).parts or not _inside(root / main, root) \
                or root.is_symlink():
            raise EvalError(f"run '{self.path}' names its scheme {quoted(main, 120)}, which is outside its "
                            f"copy of the scheme ({root})", file=str(self.path / MANIFEST),
                            hint="the run directory was edited; train the run again")
        return root / main

    def load_scheme(self):
        """``(scheme, files)``: the run's scheme from its own copy (``RUN/scheme/``; older runs:
        ``RUN/scheme.pe``), verified against ``RUN/scheme.sha256``. Nothing outside the run is read
        for it (the library files its copy imports by name are hashed with it)."""
        from pedsl.lang.imports import allow_import_roots  # on use: lark only when the scheme is read
        from pedsl.lang.api import load

        if self.scheme_hash is None or re.fullmatch(r"[0-9a-f]{64}", self.scheme_hash) is None:
            raise EvalError(f"run '{self.path}' records no scheme hash (scheme.sha256): which scheme it was "
                            "trained with cannot be checked", file=str(self.path / "scheme.sha256"),
                            hint="the run directory is incomplete or was edited; train the run again")
        candidates = [p for p in (self.own_copy(), self.path / "scheme.pe")
                      if p is not None and _inside(p, self.path)]
        first_err, mismatch = None, None
        name = self.scheme_name()
        for candidate in candidates:
            if not candidate.is_file():
                continue
            try:
                with allow_import_roots(self.copy_root()):
                    s = load(str(candidate), params=dict(self.cfg.params) if self.cfg.params else None,
                             scheme=name)
                    files = scheme_files(s)
            except PedslError as err:
                first_err = first_err or err
                continue
            if files.digest == self.scheme_hash:
                return s, files
            mismatch = mismatch or describe_change(self.manifest, files)
        if first_err is not None and mismatch is None:
            raise EvalError(f"the scheme of run '{self.path}' cannot be loaded: {first_err}",
                            file=str(self.path / "scheme.pe")) from None
        raise EvalError(f"run '{self.path}' has no copy of its scheme matching its scheme.sha256"
                        + (f" ({mismatch})" if mismatch else ""), file=str(self.path / "scheme.sha256"),
                        hint="the run directory is incomplete or was edited")


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, links followed, lies within ``folder`` (links followed too)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def read(run_dir: str | Path) -> Run:
    """Open a run folder: EvalError when it is missing or not a run, with a hint."""
    from pedsl.train import checkpoint as ck

    run = Path(run_dir)
    if not run.exists():
        raise EvalError(f"run directory '{run}' does not exist",
                        hint="pass the --out directory of `pedsl train` (or of `pedsl compare`: DIR/runs/<scheme>)")
    if not run.is_dir():
        raise EvalError(f"'{run}' is a file, not a run directory", hint="pass the --out directory of `pedsl train`")
    if not is_run(run):
        raise EvalError(f"'{run}' is not a pedsl run folder (no {MARKER} marker, and not a complete run of an "
                        "earlier pedsl)", file=str(run), hint="pass the --out directory of `pedsl train`")
    cfg_file = run / "config.yaml"
    if not cfg_file.exists():
        raise EvalError(f"'{run}' is not a training run: it has no config.yaml", file=str(cfg_file),
                        hint="pass the --out directory of `pedsl train`")
    try:
        cfg = TrainConfig.from_yaml(cfg_file)
    except ConfigError as err:
        raise EvalError(f"the run's config '{cfg_file}' is invalid: {err}", file=str(cfg_file)) from None
    return Run(run, cfg, recorded_hash(run), recorded_manifest(run), ck.list_checkpoints(run / "checkpoints"))
