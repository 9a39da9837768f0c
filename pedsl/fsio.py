"""File output: every file pedsl writes goes through here, in one of three ways.

- :func:`atomic_write_bytes` / :func:`atomic_write_text` (almost everything): a temporary file in the
  target's folder, written, flushed and fsynced, then ``os.replace``d over the target and the folder
  fsynced: a crash leaves either the old file or the new one, never a torn mix;
- :func:`write_new_bytes`: a file inside a fresh temporary folder that is renamed into place whole
  (a checkpoint), created exclusively;
- :func:`open_append`: a log appended to (``metrics.jsonl``);

and figures through :func:`write_figure` (rendered in memory, then written atomically). A symbolic
link at the target is refused
(outputs are never written through links), unless the caller edits a file the user named. Failures become
:class:`~pedsl.errors.OutputError` with the path and what to change.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from pathlib import Path

from pedsl.errors import OutputError, quoted


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_dir(path: str | Path) -> Path:
    """Create the output folder ``path`` (and its parents); OutputError when it cannot be, is not
    writable, or is itself a symbolic link (its files would land in the folder the link points to;
    links among its parents are the user's layout and are followed)."""
    p = Path(path)
    refuse_symlink(p)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot create folder {p}: a file of that name exists",
                          hint="choose another output path") from None
    except OSError as exc:
        raise OutputError(f"cannot create folder {p}: {exc.strerror or exc}",
                          hint="check the permissions of its parent, or choose another output path") from None
    if not os.access(p, os.W_OK):
        raise OutputError(f"folder {p} is not writable", hint="check its permissions, or choose another output path")
    return p


# The system's limits on a path (Linux, macOS): a name of at most NAME_MAX bytes, a whole path of at most
# PATH_MAX - 1; past them every call on the path fails with ENAMETOOLONG.
NAME_MAX = 255
PATH_MAX = 4096


def check_path(path: str | Path) -> None:
    """OutputError when an output path cannot exist on this system: a name (a folder or file name in it)
    longer than NAME_MAX bytes, or the whole path longer than PATH_MAX - 1 bytes. Every output goes through
    :func:`refuse_symlink` (and :func:`ensure_dir`), so every output option is checked here, once."""
    p = Path(path)
    whole = os.fsencode(str(p.absolute()))
    long = next((part for part in p.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:
        raise OutputError(f"cannot write {quoted(str(p))}: the name {quoted(long)} is {len(os.fsencode(long)):,} "
                          f"bytes, and a file or folder name has at most {NAME_MAX}",
                          hint="choose a shorter output name")
    if len(whole) >= PATH_MAX:
        raise OutputError(f"cannot write {quoted(str(p))}: the path is {len(whole):,} bytes, and a path has at most "
                          f"{PATH_MAX - 1}", hint="choose a shorter output path")


def refuse_symlink(path: str | Path) -> None:
    """Raise OutputError when ``path`` is a symbolic link: outputs are never written through one
    (a link planted in a run folder or an output folder would redirect the write elsewhere)."""
    p = Path(path)
    check_path(p)
    if p.is_symlink():
        try:
            dest = os.readlink(p)
        except OSError:
            dest = "?"
        raise OutputError(f"refusing to write {p}: it is a symbolic link (to {dest})", file=str(p),
                          hint="pedsl never writes through symbolic links; remove the link, "
                               "or choose another output path")


def atomic_write_bytes(path: str | Path, data: bytes, *, follow_symlinks: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically, keeping its permissions.

    A symbolic link at ``path`` is refused with OutputError (outputs never write through links);
    ``follow_symlinks=True`` (``pedsl fmt --write``, which edits the source file the user named)
    rewrites the file the link points to instead (the link stays)."""
    if not follow_symlinks:
        refuse_symlink(path)
    target = Path(os.path.realpath(path)) if follow_symlinks else Path(os.path.abspath(path))
    try:
        st = target.stat()
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # replacing /dev/null or a FIFO (as root: the node)
        raise OutputError(f"cannot write {target}: it is not a regular file (a folder, device or FIFO)",
                          hint="choose a file path for the output")
    mode = st.st_mode & 0o7777 if st is not None else 0o666 & ~_umask()  # new: not mkstemp's 0600
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent))
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}",
                          hint="check that the folder exists and is writable") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}",
                          hint="check the folder's permissions and free space") from None


def atomic_write_text(path: str | Path, text: str, *, follow_symlinks: bool = False) -> None:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a surrogate from a file name that is not UTF-8
        raise OutputError(f"cannot write {path}: its text holds {text[exc.start:exc.end]!r}, which is not UTF-8 "
                          "(from a file or folder name that is not UTF-8?)",
                          hint="rename the input file with UTF-8 characters") from None
    atomic_write_bytes(path, data, follow_symlinks=follow_symlinks)


def open_append(path: Path):
    """A log file (``metrics.jsonl``) opened for appending text, never through a symbolic link
    (O_NOFOLLOW); OutputError when it cannot be opened."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise OutputError(f"cannot write '{path}': {exc.strerror or exc}"
                          + (" (it is a symbolic link)" if Path(path).is_symlink() else ""), file=str(path),
                          hint="pedsl never writes through symbolic links; remove the link or choose another --out") from None
    return os.fdopen(fd, "a")


def write_new_bytes(path: str | Path, data: bytes) -> None:
    """Write a file that must not exist yet, inside a fresh temporary folder that the caller then
    renames into place (a checkpoint): created exclusively (O_EXCL, so never through a link),
    written and fsynced. Raises OSError unchanged (the caller names the whole write, e.g. a full disk)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


FIGURE_FORMATS = ("png", "svg", "pdf")


def figure_format(path: str | Path) -> str:
    """The format of a figure file the user named, from its extension. OutputError for another
    extension, a symbolic link or something other than a regular file at the path: checked before
    the figure is computed, and again when it is written."""
    p = Path(path)
    ext = p.suffix.lower().lstrip(".")
    if ext not in FIGURE_FORMATS:
        raise OutputError(f"cannot write the figure '{p}': {('the extension ' + repr(p.suffix)) if p.suffix else 'a name without an extension'}"
                          f" is not a figure format", file=str(p), hint="name the file .png, .svg or .pdf")
    refuse_symlink(p)
    if p.exists() and not p.is_file():
        raise OutputError(f"cannot write the figure '{p}': it is not a regular file (a folder, device or FIFO)",
                          file=str(p), hint="choose a file path for the figure")
    if not p.absolute().parent.is_dir():
        raise OutputError(f"cannot write the figure '{p}': its folder does not exist", file=str(p),
                          hint="create the folder first, or choose another path")
    return ext


def write_figure(fig, path: str | Path, **savefig) -> None:
    """A matplotlib figure rendered in memory in the format of ``path``'s extension, then written
    atomically (:func:`atomic_write_bytes`)."""
    ext = figure_format(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=ext, **savefig)
    atomic_write_bytes(path, buf.getvalue())


# ------------------------------------------------------------------ reading user paths


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a socket): reading it could block
    forever or never end, so pedsl refuses it. An OSError, so callers that report OSErrors
    (with ``exc.strerror``) report this one too."""


def open_regular(path: str | Path):
    """Open ``path`` for binary reading, refusing anything but a regular file.

    Opened non-blocking (a FIFO with no writer would block ``open`` itself), checked with
    ``fstat`` on the open descriptor (no race with a swapped path), then switched back to
    blocking reads. Raises FileNotFoundError, IsADirectoryError, :class:`NotRegularFile` or
    another OSError; every place pedsl reads a user's path goes through here.
    """
    import errno

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file, at most ``limit`` of them (streamed: a larger file is never
    read whole). Raises what :func:`open_regular` raises."""
    with open_regular(path) as fh:
        return fh.read() if limit is None else fh.read(limit)


def read_text(path: str | Path, limit: int | None = None) -> str:
    """The UTF-8 text of a regular file (see :func:`read_bytes`); UnicodeDecodeError is a ValueError."""
    return read_bytes(path, limit).decode("utf-8")
