"""The run folder's integrity: the resolved scheme and its copy, the lock, what may be written.

- **The resolved scheme.** A run records the sha256 of every file its scheme is made of (the main
  file and its whole import closure, library files included) in ``RUN/scheme.sha256`` and keeps a
  copy of each under ``RUN/scheme/`` with the relative names the imports use, so the copy loads by
  itself; ``RUN/scheme.json`` lists each file's sha256, so a mismatch names the file that changed.
  A scheme of a single file hashes to the sha256 of its bytes.
  The files and their hash: :mod:`pedsl.train.schemefiles`.
- **The lock.** ``RUN/.pedsl.lock`` under an exclusive ``fcntl.flock``: a second ``pedsl train`` into
  the same folder is refused (:mod:`pedsl.train.runlock`, with the temporary checkpoint folders).
- **What may be written.** A run goes only into a new or empty folder or a pedsl run folder; no
  file or folder of a run is written through a symbolic link.
- **One reader.** :func:`read` opens a run folder for ``load_run`` (eval, analyze, compare) and
  loads its scheme from the copy, verified against the recorded sha256.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pedsl.errors import CheckpointError, EvalError, OutputError, PedslError
from pedsl.fsio import atomic_write_bytes, atomic_write_text, read_text, refuse_symlink
from pedsl.train.runlock import LOCK_NAME, RunLock, clean_temporary, describe_owner
from pedsl.train.schemefiles import SchemeFiles, describe_change, scheme_files

SCHEME_DIR = "scheme"
MANIFEST = "scheme.json"


# ---------------------------------------------------------------------------------------------
# Writing: which folders may hold a run, no symbolic links, the copy of the scheme


def is_run(run: Path) -> bool:
    """A pedsl run folder: it records a scheme hash, or holds nothing but pedsl's lock file."""
    sha = run / "scheme.sha256"
    if sha.is_file() and not sha.is_symlink():
        try:
            return re.fullmatch(r"[0-9a-f]{64}\s*", read_text(sha, 100)) is not None
        except (OSError, UnicodeDecodeError):
            return False
    try:  # a run that stopped before writing anything (its lock file, a write probe)
        return all(p.name == LOCK_NAME or p.name.startswith(".write-test-") for p in run.iterdir())
    except OSError:
        return False


def check_out_folder(run: Path) -> None:
    """Refuse a ``--out`` that exists, is not empty and is not a pedsl run (its files would be overwritten)."""
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
        data = json.loads(read_text(run / MANIFEST, 1 << 20))
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
        probe = run / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write the run directory '{run}': {exc.strerror or exc}",
                          hint="choose another --out") from None
    lock = RunLock(run).acquire()
    try:
        no_links(run, "checkpoints", "config.yaml", "metrics.jsonl", "DONE.json")
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
                return json.loads(read_text(self.checkpoints[-1] / "state.json")).get("scheme_name")
            except (OSError, ValueError, AttributeError):
                return None
        return None

    def copy_root(self) -> Path:
        return self.path / SCHEME_DIR

    def load_scheme(self):
        """``(scheme, files)``: the run's scheme from its own copy (``RUN/scheme/``; older runs:
        ``RUN/scheme.pe``, then the original path), verified against ``RUN/scheme.sha256``."""
        from pedsl.lang.imports import allow_import_roots  # on use: lark only when the scheme is read
        from pedsl.lang.api import load

        candidates = []
        main = (self.manifest or {}).get("main")
        if isinstance(main, str) and main:
            candidates.append(self.copy_root() / main)
        candidates.append(self.path / "scheme.pe")
        if self.cfg.scheme:
            candidates.append(Path(self.cfg.scheme))
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
            if self.scheme_hash is None or files.digest == self.scheme_hash:
                return s, files
            mismatch = mismatch or describe_change(self.manifest, files)
        if first_err is not None and mismatch is None:
            raise EvalError(f"the scheme of run '{self.path}' cannot be loaded: {first_err}",
                            file=str(self.path / "scheme.pe")) from None
        raise EvalError(f"run '{self.path}' has no copy of its scheme matching its scheme.sha256"
                        + (f" ({mismatch})" if mismatch else ""), file=str(self.path / "scheme.sha256"),
                        hint="the run directory is incomplete or was edited")


def read(run_dir: str | Path) -> Run:
    """Open a run folder: EvalError when it is missing or not a run, with a hint."""
    from pedsl.config import TrainConfig
    from pedsl.errors import ConfigError
    from pedsl.train import checkpoint as ck

    run = Path(run_dir)
    if not run.exists():
        raise EvalError(f"run directory '{run}' does not exist",
                        hint="pass the --out directory of `pedsl train` (or of `pedsl compare`: DIR/runs/<scheme>)")
    if not run.is_dir():
        raise EvalError(f"'{run}' is a file, not a run directory", hint="pass the --out directory of `pedsl train`")
    cfg_file = run / "config.yaml"
    if not cfg_file.exists():
        raise EvalError(f"'{run}' is not a training run: it has no config.yaml", file=str(cfg_file),
                        hint="pass the --out directory of `pedsl train`")
    try:
        cfg = TrainConfig.from_yaml(cfg_file)
    except ConfigError as err:
        raise EvalError(f"the run's config '{cfg_file}' is invalid: {err}", file=str(cfg_file)) from None
    return Run(run, cfg, recorded_hash(run), recorded_manifest(run), ck.list_checkpoints(run / "checkpoints"))
