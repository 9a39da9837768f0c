"""Text corpora, byte level: the Python standard library's own files or a local file or folder.

Files are listed sorted, split train/validation **by file** from a hash of the relative path, and
read in a hash-shuffled (deterministic) order until ``max_bytes``; a single file is split by its
last ``val_fraction`` of bytes. See :mod:`pedsl.data.stream` for the sources a run can name.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from pedsl.config import DataConfig
from pedsl.errors import DataError
from pedsl.fsio import open_regular, read_bytes


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) from a string (sha256, not Python's salted hash)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def stdlib_files() -> tuple[Path, list[str]]:
    """The stdlib root and its ``.py`` files (relative POSIX paths, sorted)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
                             and not d.startswith("."))
        for f in filenames:
            if f.endswith(".py"):
                files.append(Path(dirpath, f).relative_to(root).as_posix())
    return root, sorted(files)


def folder_files(root: Path) -> list[str]:
    """The regular files of a data folder (relative POSIX paths, sorted); FIFOs, devices and sockets
    are skipped (reading them could block or never end), and a symlink that leaves the folder is
    refused with a DataError (``/dev/zero`` or a secret file planted in a data folder)."""
    real_root = os.path.realpath(root)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinked folders
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for f in filenames:
            if f.startswith("."):
                continue
            p = os.path.join(dirpath, f)
            target = os.path.realpath(p)
            if os.path.commonpath([real_root, target]) != real_root:
                raise DataError(f"'{p}' is a symlink that leaves the data folder '{root}' (to '{target}')",
                                hint="copy the file into the folder, or remove the link")
            try:
                if not stat.S_ISREG(os.stat(p).st_mode):
                    continue
            except OSError:
                continue
            files.append(Path(dirpath, f).relative_to(root).as_posix())
    return sorted(files)


def split_files(files: list[str], val_fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic split by file: a file is validation when hash(seed, path) < val_fraction.
    Each list is returned in a deterministic hash-shuffled order (so a byte cap samples widely)."""
    keyed = sorted((_unit_hash(f"{seed}:{f}"), f) for f in files)
    val = [f for h, f in keyed if h < val_fraction]
    train = [f for h, f in keyed if h >= val_fraction]
    order = lambda xs: sorted(xs, key=lambda f: _unit_hash(f"order:{seed}:{f}"))  # noqa: E731
    return order(train), order(val)


def _read(root: Path, files: list[str], cap: int) -> bytes:
    chunks, total = [], 0
    for f in files:
        if total >= cap:
            break
        try:
            with open_regular(root / f) as fh:  # streamed: never more than the bytes still wanted
                b = fh.read(cap - total)
        except OSError:
            continue
        if b"\0" in b[:4096]:  # binary file
            continue
        b = b[: cap - total]
        chunks.append(b)
        total += len(b)
    return b"\n".join(chunks)


@dataclass
class Corpus:
    """Train and validation bytes as uint8 tensors, and where they came from."""

    train: torch.Tensor  # (N_train,) uint8
    val: torch.Tensor  # (N_val,) uint8
    description: str
    n_train_files: int = 0
    n_val_files: int = 0

    def unigram_baseline(self) -> float:
        """Cross-entropy (nats/byte) of the validation bytes under the training unigram
        distribution (add-one smoothing): the loss of a model that ignores context."""
        counts = torch.bincount(self.train.long(), minlength=256).double() + 1.0
        logp = (counts / counts.sum()).log()
        val_counts = torch.bincount(self.val.long(), minlength=256).double()
        return float(-(val_counts * logp).sum() / val_counts.sum())


def load_corpus(cfg: DataConfig) -> Corpus:
    """The text corpus of ``cfg.source`` (``stdlib`` or a path); raises DataError when unusable."""
    val_cap = max(1, int(cfg.max_bytes * cfg.val_fraction))
    train_cap = cfg.max_bytes - val_cap
    if cfg.source == "stdlib":
        root, files = stdlib_files()
        desc = f"Python stdlib at {root}"
    else:
        path = Path(cfg.source).expanduser()
        if not path.exists():
            raise DataError(f"data path '{path}' does not exist",
                            hint="use --data stdlib, passkey, blocks, or an existing file or folder")
        if path.is_file():
            try:
                data = read_bytes(path, cfg.max_bytes)  # streamed: a huge file is never read whole
            except OSError as exc:
                raise DataError(f"cannot read data file '{path}': {exc.strerror or exc}",
                                hint="point --data at a readable text file or folder") from None
            if not data:
                raise DataError(f"data file '{path}' is empty", hint="point --data at a file with text in it")
            cut = len(data) - max(1, int(len(data) * cfg.val_fraction))
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return Corpus(t[:cut].clone(), t[cut:].clone(), f"file {path}", 1, 1)
        if not path.is_dir():
            raise DataError(f"data path '{path}' is neither a regular file nor a folder (a FIFO or a device?)",
                            hint="point --data at a text file or a folder of them")
        root, files = path, folder_files(path)
        desc = f"folder {path}"
    if not files:
        raise DataError(f"no files found in {desc}", hint="point --data at a folder that contains text files")
    train_files, val_files = split_files(files, cfg.val_fraction, cfg.seed)
    if not train_files or not val_files:  # too few files to split by file: split the bytes
        data = _read(root, train_files + val_files, cfg.max_bytes)
        if not data:
            raise DataError(f"the files of {desc} are empty or binary", hint="point --data at text files")
        cut = len(data) - max(1, int(len(data) * cfg.val_fraction))
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return Corpus(t[:cut].clone(), t[cut:].clone(), desc + " (split by bytes)", len(files), len(files))
    train = _read(root, train_files, train_cap)
    val = _read(root, val_files, val_cap)
    if not train or not val:
        raise DataError(f"the files of {desc} are empty or binary", hint="point --data at text files")
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return Corpus(as_t(train), as_t(val), desc, len(train_files), len(val_files))


def sample_windows(data: torch.Tensor, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """``n`` random windows of ``length`` bytes: (n, length) long."""
    if data.numel() < length:
        raise DataError(f"the data holds {data.numel()} bytes, fewer than one window of {length} "
                        f"(context + 1)", hint="lower --context or use more data")
    starts = torch.randint(0, data.numel() - length + 1, (n,), generator=g)
    idx = starts[:, None] + torch.arange(length)[None, :]
    return data[idx].long()
