"""What ``pedsl profile`` reads: the bytes of DATA, and their coarser symbol sequences.

DATA is ``stdlib``, a file or a folder (read exactly as training reads it: the training split of
:func:`pedsl.data.corpus.load_corpus`), or a synthetic source:

- ``blocks`` - the block task of the frequency-usage study (:func:`pedsl.data.synthetic.block_batch`, one
  long row): a single dependency at distance ``B - 1 - offset``.
- ``iid`` - independent uniform letters: no dependency at all.
- ``tree`` - a self-similar source: binary trees of depth 12 whose nodes copy their parent's
  letter with probability ``p`` (else draw a fresh one); the leaves are the bytes. The dependency
  between two leaves falls with the height of their common ancestor, ``~ log2`` of their distance:
  a power law in distance, the same at every granularity.
- ``offset`` - a fixed-offset (arithmetic-like) source: every byte repeats the byte 7 positions
  back with probability ``p``: dependencies at 7, 14, 21 ... and nowhere else, a characteristic scale.
"""

from __future__ import annotations

import re

import numpy as np

from pedsl.errors import DataError

SYNTHETIC = ("blocks", "iid", "tree", "offset")
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
TREE_DEPTH = 12
OFFSET = 7
WORD = re.compile(rb"[A-Za-z0-9_]+|[^\sA-Za-z0-9_]")


def synthetic(name: str, n: int, *, seed: int = 0, block_len: int = 16, block_offset: int = 0,
              p: float | None = None) -> np.ndarray:
    """``n`` bytes (uint8) of a synthetic source (module docstring)."""
    rng = np.random.default_rng(seed)
    if name == "iid":
        return LETTERS[rng.integers(0, 26, n)]
    if name == "blocks":
        from pedsl.data.stream import make_generator  # on use: torch only for the generated sources
        from pedsl.data.synthetic import block_batch

        if n < 2 * block_len:
            raise DataError(f"{n} bytes hold less than two blocks of {block_len}", hint="raise --max-bytes")
        if not 0 <= block_offset < block_len - 1:
            raise DataError(f"block offset {block_offset} must lie in [0, {block_len - 1})")
        tokens = block_batch(1, n, block_len=block_len, offset=block_offset, g=make_generator(seed, n))["tokens"]
        return tokens[0].numpy().astype(np.uint8)
    if name == "tree":
        p = 0.9 if p is None else p
        trees = -(-n // 2**TREE_DEPTH)
        a = rng.integers(0, 26, trees)
        for _ in range(TREE_DEPTH):
            a = np.repeat(a, 2)
            fresh = rng.random(len(a)) >= p
            a = np.where(fresh, rng.integers(0, 26, len(a)), a)
        return LETTERS[a[:n]]
    if name == "offset":
        p = 0.8 if p is None else p
        t = np.arange(n)
        fresh = (rng.random(n) >= p) | (t < OFFSET)
        # each position copies the latest fresh position of its residue class mod OFFSET
        src = np.empty(n, dtype=np.int64)
        for c in range(OFFSET):
            idx = t[c::OFFSET]
            src[c::OFFSET] = np.maximum.accumulate(np.where(fresh[c::OFFSET], idx, -1))
        return LETTERS[rng.integers(0, 26, n)][src]
    raise DataError(f"unknown synthetic source '{name}'", hint=f"use one of: {', '.join(SYNTHETIC)}")


def load_bytes(data: str, max_bytes: int, *, seed: int = 0, block_len: int = 16,
               block_offset: int = 0) -> tuple[np.ndarray, str, bool]:
    """``(bytes as uint8, description, is_text)`` of DATA (module docstring)."""
    if data in SYNTHETIC:
        x = synthetic(data, max_bytes, seed=seed, block_len=block_len, block_offset=block_offset)
        desc = f"synthetic '{data}'" + (f" (B = {block_len}, offset {block_offset})" if data == "blocks" else "")
        return x, desc, False
    from pedsl.config import DataConfig
    from pedsl.data.corpus import load_corpus

    # the training split, as `pedsl train --data DATA` reads it (max_bytes counts both splits)
    cfg = DataConfig(source=data, max_bytes=max(1024, int(max_bytes / 0.9) + 1))
    corpus = load_corpus(cfg)
    x = corpus.train.numpy()[:max_bytes]
    if len(x) == 0:
        raise DataError(f"{corpus.description} holds no bytes to profile", hint="point DATA at text")
    return x, corpus.description, True


def coarse(x: np.ndarray, g: int, vocab: int) -> tuple[np.ndarray, int, float]:
    """Non-overlapping ``g``-byte symbols, recoded by frequency rank and lumped to ``vocab`` codes
    (the ``vocab - 1`` most frequent symbols keep their own code, the rest share the last one).
    Returns ``(codes, K, bytes per symbol)``; ``g = 1`` keeps the 256 byte values."""
    if g == 1:
        return x.astype(np.int64), 256, 1.0
    n = len(x) // g
    b = x[: n * g].astype(np.int64).reshape(n, g)
    sym = np.zeros(n, dtype=np.int64)
    for j in range(g):
        sym = sym * 256 + b[:, j]
    return _lump(sym, vocab) + (float(g),)


def words(x: np.ndarray, vocab: int) -> tuple[np.ndarray, int, float]:
    """Words (runs of ``[A-Za-z0-9_]``) and single punctuation bytes, whitespace dropped, lumped
    like :func:`coarse`. Returns ``(codes, K, mean bytes per word including the whitespace)``."""
    toks = WORD.findall(x.tobytes())
    if not toks:
        return np.zeros(0, dtype=np.int64), 1, float("nan")
    _, inv = np.unique(np.array(toks, dtype=object).astype(bytes), return_inverse=True)
    codes, K = _lump(inv.astype(np.int64), vocab)
    return codes, K, len(x) / len(toks)


def _lump(sym: np.ndarray, vocab: int) -> tuple[np.ndarray, int]:
    uniq, inv, counts = np.unique(sym, return_inverse=True, return_counts=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(len(uniq))
    codes = np.minimum(rank[inv], vocab - 1)
    return codes, int(min(vocab, len(uniq)))
