"""The build folder of pedsl's C++ CPU kernels (:mod:`pedsl.ops.cpu_kernels`): what makes a cached
library trusted, who may build, and the build itself, in a child process bounded in time.

- **The stamp.** A build that compiled, loaded in its child process and registered every op writes
  ``pedsl-build.json`` beside the library: the key of what was built (sources, flags, torch, compiler)
  and the library's size and SHA-256. A library is loaded into pedsl's own process only when its stamp
  names the current key and the file's bytes still match: a truncated library (a full disk, a half copy)
  or a foreign one at that path is never loaded, it is rebuilt.
- **The builder's lock.** ``pedsl-build.lock``, held with ``flock`` by the process that builds (and its
  child), so the kernel releases it whenever they end, Ctrl-C and SIGKILL included: there is no stale
  pedsl lock. Whoever holds it knows that no pedsl build of this folder is running, so a ``lock`` file
  left by torch's builder (older torch keeps a plain file whose existence blocks every later build, for
  ever, when a build is interrupted) is stale and removed, and so is an unstamped library.
- **The build** runs in a child process (its own session: a timeout kills the compiler too) under a time
  limit; the child loads the library itself and checks its ops before stamping it, so a library that
  crashes on load (SIGBUS) ends the child, never the caller.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from pedsl.fsio import atomic_write_text, read_text
from pedsl.strictparse import load_json

# <embedded>
STAMP = "pedsl-build.json"
BUILDER_LOCK = "pedsl-build.lock"
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's own lock, in the build folder
STAMP_FORMAT = 1
OUTPUT_TAIL = 1500  # characters of a failed build's output quoted in its message


def library_path(folder: Path, name: str) -> Path:
    """Where torch's builder links the library (``<name>.so`` in the build folder)."""
    return folder / f"{name}.so"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_stamp(folder: Path) -> dict | None:
    """The stamp's record, or None where there is none or it cannot be read as one."""
    try:
        record = load_json(read_text(folder / STAMP, limit=1 << 16))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def verify(folder: Path, name: str, key: str) -> str | None:
    """None when the library in ``folder`` is the stamped build of ``key``, byte for byte; else why not."""
    stamp = read_stamp(folder)
    if stamp is None:
        return "no stamp of a finished build"
    if stamp.get("format") != STAMP_FORMAT or stamp.get("key") != key:
        return "the stamp is of another build"
    if stamp.get("status") != "built":
        return f"the last build failed: {stamp.get('error', '?')}"
    lib = library_path(folder, name)
    try:
        if not lib.is_file() or lib.is_symlink():
            return f"{lib.name} is missing or not a regular file"
        if lib.stat().st_size != stamp.get("size") or file_sha256(lib) != stamp.get("sha256"):
            return f"{lib.name} is not the library that was built (truncated or replaced)"
    except OSError as err:
        return f"{lib.name} cannot be read: {err.strerror or err}"
    return None


def failed_before(folder: Path, key: str) -> str | None:
    """The error of the last build of ``key`` where it failed to compile or load (not a timeout), else None."""
    stamp = read_stamp(folder)
    if stamp and stamp.get("key") == key and stamp.get("status") == "failed":
        return str(stamp.get("error", "?"))
    return None


def write_stamp(folder: Path, key: str, name: str, error: str | None = None) -> None:
    """Stamp ``folder`` as the finished build of ``key`` (or a failed one, with its error)."""
    record: dict = {"format": STAMP_FORMAT, "key": key, "status": "failed" if error else "built"}
    if error:
        record["error"] = error[-OUTPUT_TAIL:]
    else:
        lib = library_path(folder, name)
        record.update(library=lib.name, size=lib.stat().st_size, sha256=file_sha256(lib))
    atomic_write_text(folder / STAMP, json.dumps(record, indent=1) + "\n")


@contextmanager
def builder_lock(folder: Path, timeout: float, on_wait):
    """Hold the folder's builder lock; yields its descriptor, or None when another live process held it
    for ``timeout`` seconds (``on_wait(pid)`` is called once when waiting starts)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(folder / BUILDER_LOCK, flags, 0o644)
    try:
        deadline, waited = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if not waited:
                on_wait(os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?")
                waited = True
            if time.monotonic() >= deadline:
                yield None
                return
            time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)  # releases the lock (a child still running the build holds it until it ends)


def ensure_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)


def clear_stale(folder: Path, name: str, everything: bool = False) -> None:
    """Under the builder lock: torch's lock file and an unstamped library are leftovers of an interrupted
    build (no pedsl build can be running), removed so that torch's builder neither waits for ever nor keeps
    a broken library (ninja would call a truncated one up to date). ``everything``: the objects and ninja's
    files too (a rebuild from scratch). A library is unlinked, never overwritten: a process that has it
    loaded keeps its copy."""
    doomed = [folder / TORCH_LOCK, library_path(folder, name), folder / STAMP]
    if everything:
        doomed += [p for p in folder.iterdir() if p.name != BUILDER_LOCK and (p.is_file() or p.is_symlink())]
    for path in doomed:
        path.unlink(missing_ok=True)


def run_build(spec: dict, lock_fd: int, timeout: float, command: list[str], env: dict) -> tuple[str, bool] | None:
    """Build, load and stamp the library described by ``spec`` in a child process (``command`` followed by the
    spec as JSON: :mod:`pedsl.ops.kernel_build`'s ``builder_main``, in ``env``); None on success, else what went
    wrong and whether another try would fail again (the compiler's or the loader's error, not a timeout).
    Ctrl-C (or any exception) while waiting ends the child and its compilers."""
    proc = subprocess.Popen([*command, json.dumps(spec)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=(lock_fd,), start_new_session=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(proc, Path(spec["folder"]))
        return f"it did not finish within {timeout:.0f} s (stopped)", False
    except BaseException:
        _end(proc, Path(spec["folder"]))
        raise
    if proc.returncode == 0:
        return None
    text = output.decode("utf-8", "replace").strip()
    if proc.returncode < 0:
        why = f"the build process ended on signal {signal.Signals(-proc.returncode).name}"
        return why + (f": {text[-OUTPUT_TAIL:]}" if text else ""), proc.returncode != -signal.SIGKILL
    return text[-OUTPUT_TAIL:] or f"the build process exited with {proc.returncode}", True


def _end(proc: subprocess.Popen, folder: Path) -> None:
    """Stop the build: SIGTERM to its process group (the child and ninja, which passes it on to the compilers
    it runs, each in a process group of its own), then SIGKILL to that group and to any process still working
    in the build folder (only this build's can be: it holds the builder lock)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 2
    while (left := _working_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()


def _working_in(folder: Path) -> list[int]:
    """The processes whose working folder is ``folder`` (Linux's /proc; none found elsewhere)."""
    pids: list[int] = []
    real = os.path.realpath(folder)
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return pids
    for entry in entries:
        try:
            if os.readlink(f"/proc/{entry}/cwd") == real:
                pids.append(int(entry))
        except OSError:
            continue
    return pids
# </embedded>
