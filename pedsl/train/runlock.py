"""The lock of a run folder (``RUN/.pedsl.lock`` under ``fcntl.flock``) and the temporary checkpoint
folders that interrupted processes leave behind.

The lock file holds the pid and host of the process training into the folder: a second ``pedsl train``
into the same folder is refused. The kernel drops the lock when its process dies, so a lock left by a
killed run is taken over (and said so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pedsl.errors import OutputError
from pedsl.fsio import refuse_symlink
from pedsl.strictparse import load_json

LOCK_NAME = ".pedsl.lock"
_TEMP = re.compile(r"^step_\d+\.(?:tmp|old)-(\d+)$")


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
            who = describe_owner(owner)
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
        owner = load_json(data) if data.strip() else None
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def describe_owner(owner: dict | None) -> str:
    """Who holds (or held) a lock, in words."""
    if not owner:
        return "owner unknown"
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('since')}"
