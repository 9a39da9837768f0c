"""Byte-level data (vocabulary 256, nothing downloaded).

Sources (``DataConfig.source``):

- ``"stdlib"`` - the Python standard library's own ``.py`` files, found at run time via
  ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and caches excluded). Files are listed
  sorted, split train/validation **by file** from a hash of the relative path, and read in a
  hash-shuffled (deterministic) order until ``max_bytes`` (:mod:`pedsl.data.corpus`).
- a local file or folder path - a folder is split by file like the stdlib; a single file by its
  last ``val_fraction`` of bytes.
- ``"passkey"`` - retrieval: a numeric key hidden in filler text, asked for at the end
  (:func:`pedsl.data.synthetic.passkey_batch`).
- ``"blocks"`` - the block-structured task of the frequency-usage paper: latent blocks of length
  ``B``; the last token of every block copies the token at a fixed offset inside it
  (:func:`pedsl.data.synthetic.block_batch`). The dependency width ``B - 1 - offset`` is set by the data.
- ``"lag"`` - every token repeats the token ``block_len`` positions back with probability 1/2
  (else a fresh random letter) (:func:`pedsl.data.synthetic.lag_batch`): a dependency at one distance that every
  position can use, with no block phase to infer (the frequency study's task).
- ``"topic"`` - latent blocks of ``block_len`` positions, each with its own random set of 4
  letters that all its tokens are drawn from (:func:`pedsl.data.synthetic.topic_batch`): a box-shaped dependency
  kernel of width ``block_len`` (the frequency study's smooth-kernel task).
- ``"copy"`` - every row repeats its first ``s`` random bytes with a random period ``s`` per row
  (:func:`pedsl.data.synthetic.copy_batch`): dense content-based copying (induction heads).
- ``"multikey"``, ``"kv"`` - the RULER-style retrieval tasks of :mod:`pedsl.data.tasks` (needle at a
  random depth).
- ``"grid_image"``, ``"grid_copy"`` - the 2-D tasks of :mod:`pedsl.data.grids`: a window of
  ``context + 1`` tokens is one grid of ``context = H x W`` cells after a start token, in raster
  order, and :meth:`TrainData.positions` gives its (h, w) positions (a grid source is never mixed:
  its rows carry positions the others do not).
- ``"select_last"``, ``"sentence_first"`` - the counting tasks of :mod:`pedsl.data.counting`: the
  value after the k-th last marker, the first letter of the k-th last sentence, with segments of
  variable length (``data.count_back``: the largest k); their answers are marked like the retrieval
  tasks'.
- a **mixture** ``"NAME:WEIGHT,NAME:WEIGHT,..."``, e.g. ``"stdlib:0.7,passkey:0.1,multikey:0.1,kv:0.1"``
  (:func:`parse_mixture`): every row of a batch draws its source with these probabilities
  (weights are normalised). At most one text source (``stdlib`` or a path); in a mixture
  ``passkey``, ``multikey`` and ``kv`` are the generators of :mod:`pedsl.data.tasks` at the training
  length, the needle at a uniformly random depth. In YAML: ``data: {source: "stdlib:0.7,kv:0.3"}``.

**Answer mask**: :meth:`TrainData.train_rows` gives each row a per-byte bool mask, True at the
answer bytes of the retrieval tasks (text, copy and block rows have none); with
``data.answer_weight = w > 0`` the training loss is the mean over every byte plus ``w`` times the
mean over the marked ones (:func:`pedsl.train.loop._loss`), so the few bytes that need retrieval
are not drowned out by the haystack's.

Training windows are a pure function of ``(seed, step)``: the same global batch on every rank
(rank ``r`` keeps rows ``r::world``), nothing to save but the step to resume exactly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from pedsl.data import counting, grids, tasks
from pedsl.config import DataConfig
from pedsl.data.corpus import Corpus, load_corpus, sample_windows
from pedsl.errors import DataError
from pedsl.data.synthetic import block_batch, copy_batch, lag_batch, passkey_batch, topic_batch


def make_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from a tuple of ints (stable across runs and platforms); use it to
    draw evaluation samples, e.g. ``passkey_batch(n, L, g=make_generator(seed, L))``."""
    h = hashlib.sha256(",".join(str(k) for k in key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "big") & (2**63 - 1))


# ---------------------------------------------------------------------------------------------
# Mixtures

GENERATED = (("passkey", "blocks", "lag", "topic", "copy") + tuple(t for t in tasks.TASKS if t != "passkey")
             + grids.GRID_TASKS + counting.TASKS)  # no corpus to read
# may appear in a mixture (blocks too)
TASK_SOURCES = {"passkey", "multikey", "kv", "blocks", "lag", "topic", "copy", *counting.TASKS}
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
    gridded = [n for n in names if n in grids.GRID_TASKS]
    if gridded:
        raise DataError(f"data mixture '{source}' names a grid task ({', '.join(gridded)})",
                        hint="a grid task's rows carry (h, w) positions that text and 1-D task rows do not: train "
                             "on it alone (--data grid_image)")
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


def generated_rows(cfg: DataConfig, source: str, n: int, length: int, g: torch.Generator, *,
                   mixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of ``length`` bytes of a generated source and their **answer mask** (same shape,
    bool): True at the answer bytes of the retrieval tasks (their ``answer_positions``) and of the
    counting and grid tasks, False everywhere else (copy, blocks, lag and topic rows have none). Task rows have
    ``cfg.passkey_digits`` answer digits, or with ``cfg.train_digits = (lo, hi)`` a count drawn
    from ``g`` in lo..hi (the same for the ``n`` rows; hi lowered to what the task fits in
    ``length``). ``passkey`` alone (not
    ``mixed``) is the older :func:`pedsl.data.synthetic.passkey_batch`, in a mixture :func:`pedsl.data.tasks.passkey`."""
    digits = cfg.passkey_digits
    if cfg.train_digits is not None and source in tasks.TASKS:
        lo, hi = cfg.train_digits
        while hi > lo and tasks.min_length(source, hi, cfg.multikey_keys) > length:
            hi -= 1  # the longest answer this task fits in the row
        digits = int(torch.randint(lo, hi + 1, (1,), generator=g))
    if source in grids.GRID_TASKS:
        H, W = grids.grid_shape(length - 1, cfg.grid_width)
        b = grids.generate(source, n, H, W, offset=cfg.grid_offset, g=g)
        return b["tokens"], b["answers"]
    if source in counting.TASKS:
        b = counting.generate(source, n, length, back=cfg.count_back, g=g)
        return b["tokens"], b["answers"]
    if source in tasks.TASKS and (source != "passkey" or mixed):
        b = tasks.generate(source, n, length, digits=digits, keys=cfg.multikey_keys, g=g)
    elif source == "passkey":
        b = passkey_batch(n, length, digits=digits, g=g)
    elif source == "blocks":
        b = {"tokens": block_batch(n, length, block_len=cfg.block_len, offset=cfg.block_offset, g=g)["tokens"]}
    elif source == "lag":
        b = {"tokens": lag_batch(n, length, lag=cfg.block_len, g=g)}
    elif source == "topic":
        b = {"tokens": topic_batch(n, length, block_len=cfg.block_len, g=g)}
    else:
        b = {"tokens": copy_batch(n, length, g=g)}
    mask = torch.zeros(b["tokens"].shape, dtype=torch.bool)
    if "answer_positions" in b:
        mask.scatter_(1, b["answer_positions"], True)
    return b["tokens"], mask


def task_windows(cfg: DataConfig, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """``n`` sequences of ``length`` bytes of a run's generated source (a mixture's first task):
    what perplexity and the instruments read for a run trained without text."""
    mix = parse_mixture(cfg.source)
    src = cfg.source if mix is None else next(n for n, _ in mix if n in TASK_SOURCES)
    if src in grids.GRID_TASKS:  # its windows need their (h, w) positions, which these callers do not pass
        raise DataError(f"a run trained on the grid task '{src}' is evaluated with its 2-D positions by the grid "
                        "study, not by pedsl eval / analyze (which read 1-D windows)",
                        hint="pedsl compare --study grid (pedsl.study.grid)")
    return generated_rows(cfg, src, n, length, g, mixed=mix is not None)[0]


# ---------------------------------------------------------------------------------------------
# The training stream


class TrainData:
    """Windows of ``context + 1`` bytes for training and validation, a pure function of the step."""

    def __init__(self, cfg: DataConfig, context: int, seed: int) -> None:
        self.cfg, self.context, self.seed = cfg, context, seed
        self.mixture = parse_mixture(cfg.source)
        text = text_source(cfg)
        self.corpus = None if text is None else load_corpus(cfg.model_copy(update={"source": text}))
        for name in [n for n, _ in self.mixture or [(cfg.source, 1.0)] if n in tasks.TASKS]:
            need = tasks.min_length(name, max(cfg.passkey_digits, (cfg.train_digits or (1,))[0]), cfg.multikey_keys)
            if context + 1 < need:
                raise DataError(f"context {context} is too short for the '{name}' task (it needs windows of "
                                f"at least {need} bytes)", hint=f"raise --context to at least {need - 1}")
        for name in [n for n, _ in self.mixture or [(cfg.source, 1.0)] if n in counting.TASKS]:
            counting.check(name, context + 1, cfg.count_back, 1)  # too short a window: now, not at the first batch
        if self.corpus is not None:
            for name, part in (("training", self.corpus.train), ("validation", self.corpus.val)):
                if part.numel() < context + 1:
                    raise DataError(
                        f"the {name} split of {self.corpus.description} holds {part.numel()} bytes, "
                        f"fewer than one window of context + 1 = {context + 1}",
                        hint="lower --context, raise data.max_bytes, or use more data")
        self.grid = grids.grid_shape(context, cfg.grid_width) if cfg.source in grids.GRID_TASKS else None
        if any(n in ("blocks", "lag", "topic") for n, _ in self.mixture or [(cfg.source, 1.0)]) \
                and context + 1 < 2 * cfg.block_len:
            raise DataError(f"context {context} holds less than two blocks of {cfg.block_len}",
                            hint="raise --context or lower data.block_len")

    @property
    def axes(self) -> int:
        """How many position axes the windows carry: 2 for a grid task, else 1 (the token index)."""
        return 1 if self.grid is None else 2

    def positions(self, n: int) -> torch.Tensor | None:
        """The (h, w) positions of ``n`` windows of a grid task, ``(2, n, context + 1)`` long (the
        layout of :mod:`pedsl.data.grids`); None for every other source (a window's token index is
        its position)."""
        if self.grid is None:
            return None
        return grids.grid_positions(*self.grid)[:, None, :].expand(-1, n, -1)

    def unigram_baseline(self) -> float | None:
        return None if self.corpus is None else self.corpus.unigram_baseline()

    def _text(self) -> Corpus:
        """The text corpus, for a source that is not a generated task (text_source() named it, so it is loaded)."""
        assert self.corpus is not None
        return self.corpus

    def describe(self) -> str:
        if self.mixture is not None:
            parts = ", ".join(f"{w:.0%} {self._text().description if n not in TASK_SOURCES else n}"
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

    def _batch(self, split: int, index: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (n, context + 1) and their answer mask (n, context + 1) bool."""
        if self.mixture is None:
            return self._source_rows(self.cfg.source, split, n, make_generator(self.seed, self.cfg.seed, split, index))
        src = self.sources(split, index, n)
        out = torch.empty(n, self.context + 1, dtype=torch.long)
        mask = torch.zeros(n, self.context + 1, dtype=torch.bool)
        for k, (name, _) in enumerate(self.mixture):
            rows = [i for i, s in enumerate(src) if s == name]
            if rows:
                g = make_generator(self.seed, self.cfg.seed, split, index, MIX_TAG, k)
                out[rows], mask[rows] = self._source_rows(name, split, len(rows), g)
        return out, mask

    def _source_rows(self, source: str, split: int, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` rows of one source and their answer mask (:func:`generated_rows`; none for text)."""
        length = self.context + 1
        if source in GENERATED:
            return generated_rows(self.cfg, source, n, length, g, mixed=self.mixture is not None)
        text = self._text()
        rows = sample_windows(text.train if split == 0 else text.val, n, length, g)
        return rows, torch.zeros(rows.shape, dtype=torch.bool)

    def train_batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """This rank's rows of the global batch of ``step``: (batch_size / world, context + 1)."""
        return self._batch(0, step, batch_size)[0][rank::world]

    def train_rows(self, step: int, batch_size: int, rank: int = 0,
                   world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`train_batch` and its answer mask (same shape, bool): True at the answer bytes of
        retrieval-task rows, which ``data.answer_weight`` weighs in the loss."""
        rows, mask = self._batch(0, step, batch_size)
        return rows[rank::world], mask[rank::world]

    def val_batch(self, index: int, batch_size: int) -> torch.Tensor:
        """Validation batch ``index`` (fixed for the whole run): (batch_size, context + 1)."""
        return self._batch(1, index, batch_size)[0]
