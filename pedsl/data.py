"""Byte-level data (vocabulary 256, nothing downloaded).

Sources (``DataConfig.source``):

- ``"stdlib"`` - the Python standard library's own ``.py`` files, found at run time via
  ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and caches excluded). Files are listed
  sorted, split train/validation **by file** from a hash of the relative path, and read in a
  hash-shuffled (deterministic) order until ``max_bytes``.
- a local file or folder path - a folder is split by file like the stdlib; a single file by its
  last ``val_fraction`` of bytes.
- ``"passkey"`` - retrieval: a numeric key hidden in filler text, asked for at the end
  (:func:`passkey_batch`).
- ``"blocks"`` - the block-structured task of the frequency-usage paper: latent blocks of length
  ``B``; the last token of every block copies the token at a fixed offset inside it
  (:func:`block_batch`). The dependency width ``B - 1 - offset`` is set by the data.
- ``"lag"`` - every token repeats the token ``block_len`` positions back with probability 1/2
  (else a fresh random letter) (:func:`lag_batch`): a dependency at one distance that every
  position can use, with no block phase to infer (the frequency study's task).
- ``"topic"`` - latent blocks of ``block_len`` positions, each with its own random set of 4
  letters that all its tokens are drawn from (:func:`topic_batch`): a box-shaped dependency
  kernel of width ``block_len`` (the frequency study's smooth-kernel task).
- ``"copy"`` - every row repeats its first ``s`` random bytes with a random period ``s`` per row
  (:func:`copy_batch`): dense content-based copying (induction), the bait that lets a small model
  learn retrieval quickly in a mixture.
- ``"multikey"``, ``"kv"`` - the RULER-style retrieval tasks of :mod:`pedsl.tasks` (needle at a
  random depth).
- a **mixture** ``"NAME:WEIGHT,NAME:WEIGHT,..."``, e.g. ``"stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1"``
  (:func:`parse_mixture`): every row of a batch draws its source with these probabilities
  (weights are normalised). At most one text source (``stdlib`` or a path); in a mixture
  ``passkey``, ``multikey`` and ``kv`` are the generators of :mod:`pedsl.tasks` at the training
  length, the needle at a uniformly random depth. In YAML: ``data: {source: "stdlib:0.7,kv:0.3"}``.

Training windows are a pure function of ``(seed, step)``: the same global batch on every rank
(rank ``r`` keeps rows ``r::world``), nothing to save but the step to resume exactly.
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
from pedsl import tasks as _tasks

FILLER = (b"The grass is green. The sky is blue. The sun is yellow. "
          b"Here we go. There and back again. ")
BLOCK_ALPHABET = torch.tensor(list(b"abcdefghijklmnopqrstuvwxyz"), dtype=torch.long)


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


def make_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from a tuple of ints (stable across runs and platforms); use it to
    draw evaluation samples, e.g. ``passkey_batch(n, L, g=make_generator(seed, L))``."""
    h = hashlib.sha256(",".join(str(k) for k in key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "big") & (2**63 - 1))


def sample_windows(data: torch.Tensor, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """``n`` random windows of ``length`` bytes: (n, length) long."""
    if data.numel() < length:
        raise DataError(f"the data holds {data.numel()} bytes, fewer than one window of {length} "
                        f"(context + 1)", hint="lower --context or use more data")
    starts = torch.randint(0, data.numel() - length + 1, (n,), generator=g)
    idx = starts[:, None] + torch.arange(length)[None, :]
    return data[idx].long()


# ---------------------------------------------------------------------------------------------
# Generated tasks


def passkey_batch(n: int, length: int, *, digits: int = 5, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Passkey retrieval (Mohtashami & Jaggi 2023 style), byte level.

    Each row: filler text with ``"The pass key is 12345. Remember it. "`` inserted at a random
    place, ending with ``"What is the pass key? The pass key is 12345"``.

    Returns ``tokens`` (n, length) long and ``answer_positions`` (n, digits): positions ``p``
    with ``tokens[p]`` an answer digit (the model predicts it from the logits at ``p - 1``).
    """
    question = b" What is the pass key? The pass key is "
    rows, answers = [], []
    for _ in range(n):
        key = bytes(b"0123456789"[int(i)] for i in torch.randint(0, 10, (digits,), generator=g))
        needle = b"The pass key is " + key + b". Remember it. " + key + b" is the pass key. "
        tail = question + key
        room = length - len(tail) - len(needle)
        if room < 0:
            raise DataError(f"passkey length {length} is too short for a {digits}-digit key",
                            hint=f"use a length of at least {len(tail) + len(needle)}")
        filler = (FILLER * (room // len(FILLER) + 2))[:room]
        at = int(torch.randint(0, room + 1, (1,), generator=g))
        row = filler[:at] + needle + filler[at:] + tail
        rows.append(torch.tensor(list(row), dtype=torch.long))
        answers.append(torch.arange(length - digits, length))
    return {"tokens": torch.stack(rows), "answer_positions": torch.stack(answers)}


def block_batch(n: int, length: int, *, block_len: int = 16, offset: int = 0,
                g: torch.Generator) -> dict[str, torch.Tensor]:
    """Block-structured copying (paper "How data shapes RoPE frequency usage", our reading).

    The sequence is cut into latent blocks of ``block_len`` positions starting at 0 (no marker:
    the block boundaries are positional). Every token is a random letter except the last of
    each block, which repeats the token at ``offset`` inside the same block.

    Returns ``tokens`` (n, length) long and ``answer_positions`` (n, n_blocks): the last
    position of every complete block after the first (``tokens[p] == tokens[p - block_len + 1 + offset]``).
    """
    tokens = BLOCK_ALPHABET[torch.randint(0, len(BLOCK_ALPHABET), (n, length), generator=g)]
    last = torch.arange(block_len - 1, length, block_len)                  # last index of each block
    tokens[:, last] = tokens[:, last - (block_len - 1) + offset]
    answers = last[last >= block_len]                                      # skip the first block
    return {"tokens": tokens, "answer_positions": answers.expand(n, -1).clone()}


def lag_batch(n: int, length: int, *, lag: int = 16, p: float = 0.5, g: torch.Generator) -> torch.Tensor:
    """Copying at a fixed distance: ``tokens[t] = tokens[t - lag]`` with probability ``p`` (independently
    per position, so copies chain), else a random letter. Returns tokens (n, length) long."""
    tokens = BLOCK_ALPHABET[torch.randint(0, len(BLOCK_ALPHABET), (n, length), generator=g)]
    copy = torch.rand(n, length, generator=g) < p
    for t in range(lag, length):  # sequential: a copy may copy a copy
        tokens[:, t] = torch.where(copy[:, t], tokens[:, t - lag], tokens[:, t])
    return tokens


def topic_batch(n: int, length: int, *, block_len: int = 16, letters: int = 4, g: torch.Generator) -> torch.Tensor:
    """Latent blocks: positions ``[b * block_len, (b + 1) * block_len)`` share a random set of
    ``letters`` distinct letters, and each token is one of them, uniformly. Returns (n, length) long."""
    nb = -(-length // block_len)
    sets = torch.rand(n, nb, len(BLOCK_ALPHABET), generator=g).argsort(-1)[..., :letters]  # (n, nb, letters)
    pick = torch.randint(0, letters, (n, length), generator=g)
    block = (torch.arange(length) // block_len).expand(n, -1)
    return BLOCK_ALPHABET[sets.gather(1, block[..., None].expand(-1, -1, letters)).gather(2, pick[..., None])[..., 0]]


COPY_ALPHABET = torch.arange(33, 127)  # printable ASCII without the space


def copy_batch(n: int, length: int, *, min_period: int = 3, max_period: int = 16,
               g: torch.Generator) -> torch.Tensor:
    """Induction bait: each row repeats its first ``s`` random printable bytes over and over, with
    a period ``s`` drawn per row uniformly from ``[min_period, max_period]`` (capped at ``length``).
    Every byte after the first period is a copy of an earlier one, and since the period varies,
    only a content lookup ("what followed this byte last time?") predicts them all, not a fixed
    offset: a dense signal that teaches a small model the copying that retrieval needs. Short
    periods matter: with periods 3..16 the tiny preset copies 46% of the bytes of period-10..64 rows
    after 200 steps; trained on periods 10..64 it copied 5% after 950 steps (probes, issue 16).
    Returns tokens (n, length) long."""
    hi = max(1, min(max_period, length))
    lo = max(1, min(min_period, hi))
    tokens = COPY_ALPHABET[torch.randint(0, len(COPY_ALPHABET), (n, length), generator=g)]
    period = torch.randint(lo, hi + 1, (n, 1), generator=g)
    return tokens.gather(1, torch.arange(length)[None, :] % period)


# ---------------------------------------------------------------------------------------------
# Mixtures

GENERATED = ("passkey", "blocks", "lag", "topic", "copy") + tuple(t for t in _tasks.TASKS if t != "passkey")  # no corpus to read
TASK_SOURCES = {"passkey", "multikey", "kv", "blocks", "lag", "topic", "copy"}  # may appear in a mixture (blocks too)
MIX_TAG = 0x6D6978  # "mix": the generator that assigns rows to sources


def parse_mixture(source: str) -> list[tuple[str, float]] | None:
    """``"stdlib:0.7,passkey:0.1,kv:0.2"`` -> ``[("stdlib", 0.7), ("passkey", 0.1), ("kv", 0.2)]``
    with weights normalised to sum 1; None for a single source (no ``:WEIGHT``, an existing path)."""
    text = source.strip()
    if Path(text).expanduser().exists():
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) == 1 and ":" not in parts[0]:
        return None
    out: list[tuple[str, float]] = []
    for part in parts:
        name, sep, w = part.rpartition(":")
        try:
            weight = float(w) if sep else float("nan")
        except ValueError:
            weight = float("nan")
        if not sep or not name or not weight == weight:
            raise DataError(f"data mixture '{source}': '{part}' is not NAME:WEIGHT",
                            hint="e.g. --data stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1")
        if not 0 < weight < float("inf"):
            raise DataError(f"data mixture '{source}': the weight of '{name}' must be a positive number",
                            hint="drop a source instead of giving it weight 0")
        out.append((name.strip(), weight))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise DataError(f"data mixture '{source}' names a source twice", hint="give each source once")
    texts = [n for n in names if n not in TASK_SOURCES]
    if len(texts) > 1:
        raise DataError(f"data mixture '{source}' has {len(texts)} text sources ({', '.join(texts)})",
                        hint="a mixture takes one text corpus (stdlib or a path) plus generated tasks "
                             "(passkey, multikey, kv, blocks, copy)")
    total = sum(w for _, w in out)
    return [(n, w / total) for n, w in out]


def text_source(cfg: DataConfig) -> str | None:
    """The text corpus a data config reads (a mixture's text part), or None when all generated."""
    mix = parse_mixture(cfg.source)
    if mix is None:
        return None if cfg.source in GENERATED else cfg.source
    return next((n for n, _ in mix if n not in TASK_SOURCES), None)


def task_windows(cfg: DataConfig, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """``n`` sequences of ``length`` bytes of a run's generated source (a mixture's first task):
    what perplexity and the instruments read for a run trained without text."""
    mix = parse_mixture(cfg.source)
    src = cfg.source if mix is None else next(n for n, _ in mix if n in TASK_SOURCES)
    if src in _tasks.TASKS and (src != "passkey" or mix is not None):
        return _tasks.generate(src, n, length, digits=cfg.passkey_digits, keys=cfg.multikey_keys, g=g)["tokens"]
    if src == "passkey":
        return passkey_batch(n, length, digits=cfg.passkey_digits, g=g)["tokens"]
    if src == "lag":
        return lag_batch(n, length, lag=cfg.block_len, g=g)
    if src == "topic":
        return topic_batch(n, length, block_len=cfg.block_len, g=g)
    if src == "copy":
        return copy_batch(n, length, g=g)
    return block_batch(n, length, block_len=cfg.block_len, offset=cfg.block_offset, g=g)["tokens"]


# ---------------------------------------------------------------------------------------------
# The training stream

_generator = make_generator  # old name


class TrainData:
    """Windows of ``context + 1`` bytes for training and validation, a pure function of the step."""

    def __init__(self, cfg: DataConfig, context: int, seed: int) -> None:
        self.cfg, self.context, self.seed = cfg, context, seed
        self.mixture = parse_mixture(cfg.source)
        text = text_source(cfg)
        self.corpus = None if text is None else load_corpus(cfg.model_copy(update={"source": text}))
        for name in [n for n, _ in self.mixture or [(cfg.source, 1.0)] if n in _tasks.TASKS]:
            need = _tasks.min_length(name, cfg.passkey_digits, cfg.multikey_keys)
            if context + 1 < need:
                raise DataError(f"context {context} is too short for the '{name}' task (it needs windows of "
                                f"at least {need} bytes)", hint=f"raise --context to at least {need - 1}")
        if self.corpus is not None:
            for name, part in (("training", self.corpus.train), ("validation", self.corpus.val)):
                if part.numel() < context + 1:
                    raise DataError(
                        f"the {name} split of {self.corpus.description} holds {part.numel()} bytes, "
                        f"fewer than one window of context + 1 = {context + 1}",
                        hint="lower --context, raise data.max_bytes, or use more data")
        if any(n in ("blocks", "lag", "topic") for n, _ in self.mixture or [(cfg.source, 1.0)]) \
                and context + 1 < 2 * cfg.block_len:
            raise DataError(f"context {context} holds less than two blocks of {cfg.block_len}",
                            hint="raise --context or lower data.block_len")

    def unigram_baseline(self) -> float | None:
        return None if self.corpus is None else self.corpus.unigram_baseline()

    def describe(self) -> str:
        if self.mixture is not None:
            parts = ", ".join(f"{w:.0%} {self.corpus.description if n not in TASK_SOURCES else n}"
                              for n, w in self.mixture)
            return f"mixture of {parts}"
        return self.corpus.description if self.corpus is not None else f"generated task '{self.cfg.source}'"

    def sources(self, split: int, index: int, n: int) -> list[str]:
        """The source of each of the ``n`` rows of batch ``index`` (a pure function of the seeds)."""
        if self.mixture is None:
            return [self.cfg.source] * n
        g = make_generator(self.seed, self.cfg.seed, split, index, MIX_TAG)
        w = torch.tensor([w for _, w in self.mixture], dtype=torch.float64)
        pick = torch.multinomial(w, n, replacement=True, generator=g)
        return [self.mixture[int(i)][0] for i in pick]

    def _batch(self, split: int, index: int, n: int) -> torch.Tensor:
        if self.mixture is None:
            return self._source_rows(self.cfg.source, split, n, make_generator(self.seed, self.cfg.seed, split, index))
        src = self.sources(split, index, n)
        out = torch.empty(n, self.context + 1, dtype=torch.long)
        for k, (name, _) in enumerate(self.mixture):
            rows = [i for i, s in enumerate(src) if s == name]
            if rows:
                g = make_generator(self.seed, self.cfg.seed, split, index, MIX_TAG, k)
                out[rows] = self._source_rows(name, split, len(rows), g)
        return out

    def _source_rows(self, source: str, split: int, n: int, g: torch.Generator) -> torch.Tensor:
        length = self.context + 1
        if source in _tasks.TASKS and (source != "passkey" or self.mixture is not None):
            return _tasks.generate(source, n, length, digits=self.cfg.passkey_digits, keys=self.cfg.multikey_keys,
                                   g=g)["tokens"]
        if source == "passkey":
            return passkey_batch(n, length, digits=self.cfg.passkey_digits, g=g)["tokens"]
        if source == "blocks":
            return block_batch(n, length, block_len=self.cfg.block_len, offset=self.cfg.block_offset,
                               g=g)["tokens"]
        if source == "lag":
            return lag_batch(n, length, lag=self.cfg.block_len, g=g)
        if source == "topic":
            return topic_batch(n, length, block_len=self.cfg.block_len, g=g)
        if source == "copy":
            return copy_batch(n, length, g=g)
        data = self.corpus.train if split == 0 else self.corpus.val
        return sample_windows(data, n, length, g)

    def train_batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This rank's rows of the global batch of ``step``: (batch_size / world, context + 1)."""
        return self._batch(0, step, batch_size)[rank::world]

    def val_batch(self, index: int, batch_size: int) -> torch.Tensor:
        """Validation batch ``index`` (fixed for the whole run): (batch_size, context + 1)."""
        return self._batch(1, index, batch_size)
