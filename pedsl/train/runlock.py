"""The lock of a run folder (``RUN/.pedsl.lock``) and the temporary checkpoint folders that
interrupted processes leave behind.

The lock works across hosts that share the run folder over NFS or another network filesystem (where
``flock`` may not): it is a file created atomically (written under a unique name, then hard-linked to
``.pedsl.lock``, which fails when the lock exists), holding the owner's host, pid and a nonce. While
held, a thread touches it every ``HEARTBEAT`` seconds. A lock is stale, and taken over (and said so),
when its owner is on this host and its process is gone (or its pid now names a process started after
the lock was taken), or when the owner is on another host and its heartbeat is older than ``STALE``
seconds (it died, was pre-empted, or lost the filesystem). A live owner on this host keeps its lock
whatever its heartbeat's age (a hung or stopped process would go on writing: see :func:`_abandoned`). To take one
over, a process first creates a claim on that very lock (``.pedsl.lock.claim-<its nonce>``, created
like the lock, with its host and pid): of several processes taking it over only the one whose claim
was created removes it, and only after reading that the lock is still the abandoned one (a lock is
never moved away and put back, which would let a third process in meanwhile). A claim left by a
process that died taking over (gone on this host, or older than ``CLAIM_STALE`` seconds from another
host) is removed by the next taker; a claim whose process lives is never removed. Release removes the file when it is still this
owner's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pedsl.errors import OutputError
from pedsl.fsio import atomic_write_text, read_text, refuse_symlink
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
        found = _TEMP.match(p.name)
        if found is None:  # temporary_folders lists only names that match
            continue
        pid = int(found.group(1))
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


HEARTBEAT = 10.0  # seconds between touches of a held lock
CLAIM_STALE = 30.0  # a takeover claim older than this was left by a process that died taking over
STALE = 120.0  # a lock whose heartbeat is older is abandoned (allows for clock skew between hosts)


@dataclass
class RunLock:
    """An exclusive lock on a run folder (``RUN/.pedsl.lock``: see the module's docstring)."""

    run: Path
    stale: dict | None = field(default=None)
    token: dict | None = None
    _stop: threading.Event | None = None

    def acquire(self) -> "RunLock":
        path = self.run / LOCK_NAME
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
              "nonce": uuid.uuid4().hex}
        for _ in range(3):  # a takeover raced by another process: look again
            if _create(path, me):
                self.token = me
                self._beat(path)
                return self
            owner, age = _read_owner(path)
            if not _abandoned(owner, age):
                raise _in_use(self.run, path, owner, age)
            if _take_away(path, owner) and owner:
                self.stale = owner
        owner, age = _read_owner(path)
        taker = _claim_owner(path, owner) if owner and _abandoned(owner, age) else None
        if taker:
            raise OutputError(f"the run directory '{self.run}' is being taken over by another pedsl process "
                              f"({describe_owner(taker)}) from its dead owner ({describe_owner(owner)})",
                              file=str(path), hint="wait for it to finish, or choose another --out")
        raise _in_use(self.run, path, owner)

    def _beat(self, path: Path) -> None:
        self._stop = threading.Event()

        def beat(stop: threading.Event = self._stop) -> None:
            while not stop.wait(HEARTBEAT):
                try:
                    os.utime(path, follow_symlinks=False)
                except OSError:
                    pass

        threading.Thread(target=beat, name="pedsl-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        if self.token is None:
            return
        if self._stop is not None:
            self._stop.set()
        path = self.run / LOCK_NAME
        if _read_owner(path)[0] == self.token:  # never remove a lock another process took over
            try:
                path.unlink()
            except OSError:
                pass
        self.token = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.token is None else self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _create(path: Path, owner: dict) -> bool:
    """Create the lock holding ``owner`` atomically (a hard link of a fully written file); False when
    a lock exists."""
    refuse_symlink(path)
    tmp = path.with_name(f"{LOCK_NAME}.{owner['host']}.{owner['pid']}.{owner['nonce'][:8]}")
    try:
        atomic_write_text(tmp, json.dumps(owner) + "\n")
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the lock file '{path}': {exc.strerror or exc}", file=str(path),
                          hint="check the folder's permissions, or choose another --out") from None


def _read_owner(path: Path) -> tuple[dict | None, float | None]:
    """(owner, seconds since its last heartbeat) of the lock at ``path``; (None, None) when there is none.
    Anything but a regular file is refused (never opened: a FIFO would block)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    except OSError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"the lock file '{path}' is not a regular file", file=str(path),
                          hint="remove it (pedsl creates it), or choose another --out")
    try:
        text = read_text(path, limit=4096)
        owner = load_json(text) if text.strip() else None
    except (OSError, ValueError):
        owner = None
    return (owner if isinstance(owner, dict) else None), time.time() - st.st_mtime


def _abandoned(owner: dict | None, age: float | None) -> bool:
    """Whether a lock may be taken over: gone already, an empty file (released by an older pedsl), its
    process dead on this host (its pid gone, or now a process started after the lock was taken), or,
    from another host, no heartbeat for ``STALE`` seconds.

    On this host the process table is the authority, not the heartbeat: a live owner whose heartbeat
    stopped is hung or stopped (SIGSTOP, swapping, a debugger), and when it goes on it writes into the
    run folder again, so taking its lock would give the run two writers. It keeps the lock; the error
    says how old its heartbeat is and what to do (:func:`_in_use`)."""
    if age is None or not owner:
        return True
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        return not _alive(owner["pid"]) or _started_after(owner["pid"], owner.get("since"))
    return age > STALE


def _started_after(pid: int, since: Any) -> bool:
    """Whether process ``pid`` started after ``since`` (the owner's "%Y-%m-%d %H:%M:%S", local time): then it
    is another process that reuses the dead owner's pid. False when either time is unknown (no /proc)."""
    try:
        taken = time.mktime(time.strptime(str(since), "%Y-%m-%d %H:%M:%S"))
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration, OverflowError):
        return False
    return boot + ticks / os.sysconf("SC_CLK_TCK") > taken + 2  # "since" has whole seconds; btime too


def _claim_path(path: Path, owner: dict | None) -> Path | None:
    """The takeover claim on the lock of ``owner`` (None when the lock is gone)."""
    try:
        key = (owner or {}).get("nonce") or f"inode{os.lstat(path).st_ino}"
    except FileNotFoundError:
        return None
    return path.with_name(f"{LOCK_NAME}.claim-{re.sub(r'[^0-9A-Za-z]', '', str(key))[:40]}")


def _claim_owner(path: Path, owner: dict | None) -> dict | None:
    """Who holds the takeover claim on the lock of ``owner``, if anyone."""
    claim = _claim_path(path, owner)
    try:
        return _read_owner(claim)[0] if claim is not None else None
    except OutputError:
        return None


def _take_away(path: Path, owner: dict | None) -> bool:
    """Remove the abandoned lock of ``owner`` when this process's claim on it is the one created and
    the lock is still that one; True when removed (False: another process is taking it over)."""
    claim = _claim_path(path, owner)
    if claim is None:
        return False
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
          "nonce": uuid.uuid4().hex}
    if not _create(claim, me):
        _drop_dead_claim(claim)
        return False
    try:
        if _read_owner(path)[0] != owner:  # taken over by another process meanwhile
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise OutputError(f"cannot take over the abandoned lock '{path}': {exc.strerror or exc}",
                              file=str(path), hint="check the folder's permissions") from None
        return True
    finally:
        claim.unlink(missing_ok=True)


def _drop_dead_claim(claim: Path) -> None:
    """Remove a claim left by a process that died while taking a lock over, so the lock can be taken
    over: a claim of this host whose process is gone, or one older than ``CLAIM_STALE`` seconds (a
    claim lives for milliseconds) of another host. A claim whose process is alive on this host stays."""
    try:
        owner, age = _read_owner(claim)
    except OutputError:  # not a regular file: not pedsl's, left alone
        return
    if age is None:
        return
    if owner and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        dead = not _alive(owner["pid"])
    else:
        dead = age > CLAIM_STALE
    if dead:
        try:
            claim.unlink()
        except OSError:
            pass


def _in_use(run: Path, path: Path, owner: dict | None, age: float | None = None) -> OutputError:
    if age is not None and age > STALE and owner and owner.get("host") == socket.gethostname():
        return OutputError(f"the run directory '{run}' is locked by pid {owner.get('pid')} on this host, which is "
                           f"alive but has not touched the lock for {age / 60:.0f} minutes (hung or stopped): "
                           "taking it over would give the run two writers", file=str(path),
                           hint=f"end pid {owner.get('pid')} (or let it finish), then rerun; if that pid is not pedsl, "
                           f"remove {path}")
    return OutputError(f"the run directory '{run}' is in use by another pedsl process ({describe_owner(owner)})",
                       file=str(path), hint="wait for it to finish, or choose another --out")


def describe_owner(owner: dict | None) -> str:
    """Who holds (or held) a lock, in words."""
    if not owner:
        return "owner unknown"
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('since')}"
