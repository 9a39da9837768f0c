"""The run folder's integrity: the resolved scheme and its copy, the lock, what may be written.

- **The resolved scheme.** A run records the sha256 of every file its scheme is made of (the main
  file and its whole import closure, library files included) in ``RUN/scheme.sha256`` and keeps a
  copy of each under ``RUN/scheme/`` with the relative names the imports use, so the copy loads by
  itself; ``RUN/scheme.json`` lists each file's sha256, so a mismatch names the file that changed.
  A scheme of a single file hashes to the sha256 of its bytes.
- **The lock.** ``RUN/.pedsl.lock`` holds the pid and host of the process training into the folder,
  under an exclusive ``fcntl.flock``: a second ``pedsl train`` into the same folder is refused. The
  kernel drops the lock when its process dies, so a lock left by a killed run is taken over (and
  said so).
- **What may be written.** A run goes only into a new or empty folder or a pedsl run folder; no
  file or folder of a run is written through a symbolic link.
- **One reader.** :func:`read` opens a run folder for ``load_run`` (eval, analyze, compare) and
  loads its scheme from the copy, verified against the recorded sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pedsl.errors import CheckpointError, EvalError, OutputError, PedslError
from pedsl.fsio import atomic_write_bytes, atomic_write_text, read_text, refuse_symlink

LOCK_NAME = ".pedsl.lock"
SCHEME_DIR = "scheme"
MANIFEST = "scheme.json"
MAX_FILES = 1000  # files in one scheme's import closure
_TEMP = re.compile(r"^step_\d+\.(?:tmp|old)-(\d+)$")


# ---------------------------------------------------------------------------------------------
# The resolved scheme: every file it is made of


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
    from pedsl.lang.parser import decode, parse_module, read_bytes
    from pedsl.lang.resolve import import_roots, import_target

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
    """The files of a :class:`~pedsl.train.attention.SchemeAttention` (one file for a stand-in
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


# ---------------------------------------------------------------------------------------------
# Temporary checkpoint folders


def temporary_folders(ckpt_root: Path) -> list[Path]:
    """``step_N.tmp-PID`` / ``step_N.old-PID`` folders left by interrupted checkpoint writes."""
    try:
        return sorted(p for p in ckpt_root.iterdir() if _TEMP.match(p.name))
    except OSError:
        return []


def clean_temporary(ckpt_root: Path) -> list[Path]:
    """Delete the temporary checkpoint folders of processes that are gone (the caller holds the
    run's lock, so no live pedsl process writes here); returns what was removed."""
    removed = []
    for p in temporary_folders(ckpt_root):
        pid = int(_TEMP.match(p.name).group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        if p.is_symlink():
            p.unlink()
        else:
            shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


# ---------------------------------------------------------------------------------------------
# The lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


@dataclass
class RunLock:
    """An exclusive lock on a run folder (``fcntl.flock`` on ``RUN/.pedsl.lock``, which names its owner)."""

    run: Path
    fd: int | None = None
    stale: dict | None = field(default=None)

    def acquire(self) -> "RunLock":
        import errno
        import fcntl

        path = self.run / LOCK_NAME
        refuse_symlink(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create the lock file '{path}': {exc.strerror or exc}", file=str(path),
                              hint="check the folder's permissions, or choose another --out") from None
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(f"the lock file '{path}' is not a regular file", file=str(path),
                              hint="remove it (pedsl creates it), or choose another --out")
        owner = _read_owner(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(f"cannot lock the run directory '{self.run}': {exc.strerror or exc}",
                                  file=str(path), hint="use a run folder on a local disk") from None
            who = _describe(owner)
            gone = (owner and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int)
                    and not _alive(owner["pid"]))
            raise OutputError(
                f"the run directory '{self.run}' is in use by another pedsl process ({who})", file=str(path),
                hint=("that process is gone but a process it started still holds the lock; stop it"
                      if gone else "wait for it to finish, or choose another --out")) from None
        if owner and owner.get("pid") is not None and owner.get("pid") != os.getpid():
            self.stale = owner  # its process ended without releasing the file: a killed run
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)  # the file stays: unlinking a flock'd file races with a new owner
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_owner(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        owner = json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _describe(owner: dict | None) -> str:
    if not owner:
        return "owner unknown"
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('since')}"


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
                  f"({_describe(lock.stale)})", file=sys.stderr)
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
        from pedsl.lang.resolve import allow_import_roots
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
