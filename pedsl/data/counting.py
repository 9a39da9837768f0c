"""Counting tasks: attend to the k-th last marker or sentence, where token distances vary.

The motivation of contextual positions (CoPE, Golovneva et al. 2024): a query that must reach "the
k-th sentence back" or "the value after the k-th last marker" needs a count of *segments*, and when
segments have variable lengths no fixed token distance finds it. Two tasks (:data:`TASKS`), each a
pure function of a ``torch.Generator``, byte level, every row a stream of many questions:

- ``select_last`` (selective copy, flip-flop style): filler words of lowercase letters separated by
  spaces, with **writes** ``"#V "`` (``V`` an uppercase letter) and **queries** ``"?kV "``
  interleaved: ``k`` a digit ``1..back`` and ``V`` the value of the k-th last write before the query
  (``k = 1``: the last occurrence of the marker ``#``). Between two events, ``1..3`` filler words
  (times ``stretch``) of ``1..4`` letters; an event is a query with probability 1/2 once a write
  was made.
- ``sentence_first`` (count sentences): sentences of ``1..3`` words (times ``stretch``) of ``1..4``
  letters, the first letter uppercase, each closed by ``". "``; after a sentence, with probability
  1/2, a query ``"?kV "``: ``V`` the first letter of the k-th last complete sentence (``k = 1``:
  the sentence just closed).

In both, ``k`` is drawn uniformly from ``1..min(back, writes or sentences so far)``. The **answer**
of a query is the byte ``V`` (one byte; predicted from the logits at the ``k`` digit before it);
``tokens[answer] == tokens[source]`` where ``source`` is the position of the value it copies.
``stretch`` (a whole number >= 1) lengthens the segments without adding any: at ``stretch = s`` the
k-th last marker is ``s`` times as far in tokens and still ``k`` segments back, which is the
evaluation that separates counting segments from counting tokens. Rows are cut at ``length``; a
query whose answer falls past the cut is not an answer.

:func:`generate` returns ``tokens`` ``(n, length)`` long, ``answers`` ``(n, length)`` bool, ``back``
``(n, length)`` long (the ``k`` of each answer, 0 elsewhere) and ``sources`` ``(n, length)`` long (the
position each answer copies, -1 elsewhere). Chance: 1/26 per answer.
"""

from __future__ import annotations

from typing import Callable

import torch

from pedsl.errors import DataError, did_you_mean

TASKS = ("select_last", "sentence_first")
LETTERS = b"abcdefghijklmnopqrstuvwxyz"
VALUES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
WRITE, QUERY, STOP = ord("#"), ord("?"), ord(".")
MAX_BACK = 9           # k is one digit
MAX_STRETCH = 64
MIN_LENGTH = 16        # shorter rows hold hardly a question
CHANCE = 1 / len(VALUES)
WORD_LEN = (1, 4)
GAP_WORDS = (1, 3)     # filler words between events, sentence words (times stretch)


class _Draws:
    """Uniform integers from a generator, drawn in chunks (one torch call per chunk, not per number)."""

    CHUNK = 1024

    def __init__(self, g: torch.Generator) -> None:
        self.g, self.at = g, 0
        self.buf: list[float] = []

    def int(self, lo: int, hi: int) -> int:
        """A uniform integer in [lo, hi] (inclusive)."""
        if self.at == len(self.buf):
            self.buf, self.at = torch.rand(self.CHUNK, generator=self.g, dtype=torch.float64).tolist(), 0
        u = self.buf[self.at]
        self.at += 1
        return lo + min(int(u * (hi - lo + 1)), hi - lo)

    def word(self, first: bytes = b"") -> bytes:
        n = self.int(*WORD_LEN) - len(first)
        return first + bytes(LETTERS[self.int(0, 25)] for _ in range(n))


class _Row:
    """A row being written: its bytes, and per answer its position, k and source position."""

    def __init__(self) -> None:
        self.text = bytearray()
        self.answers: list[tuple[int, int, int]] = []

    def query(self, k: int, source: int) -> None:
        self.text += bytes([QUERY, ord("0") + k])
        self.answers.append((len(self.text), k, source))
        self.text += bytes([self.text[source], ord(" ")])


def _select_row(d: _Draws, length: int, back: int, stretch: int) -> _Row:
    row = _Row()
    writes: list[int] = []  # the position of each value written
    while len(row.text) < length:
        for _ in range(stretch * d.int(*GAP_WORDS)):
            row.text += d.word() + b" "
        if writes and d.int(0, 1):
            k = d.int(1, min(back, len(writes)))
            row.query(k, writes[-k])
        else:
            row.text.append(WRITE)
            writes.append(len(row.text))
            row.text += bytes([VALUES[d.int(0, 25)], ord(" ")])
    return row


def _sentence_row(d: _Draws, length: int, back: int, stretch: int) -> _Row:
    row, starts = _Row(), []                        # starts: position of each sentence's first letter
    while len(row.text) < length:
        starts.append(len(row.text))
        words = [d.word(bytes([VALUES[d.int(0, 25)]]))]
        words += [d.word() for _ in range(stretch * d.int(*GAP_WORDS) - 1)]
        row.text += b" ".join(words) + b". "
        if d.int(0, 1):
            k = d.int(1, min(back, len(starts)))
            row.query(k, starts[-k])
    return row


ROWS: dict[str, Callable[[_Draws, int, int, int], _Row]] = {"select_last": _select_row,
                                                            "sentence_first": _sentence_row}


def check(task: str, length: int, back: int, stretch: int) -> None:
    """A one-paragraph DataError for an unknown task or sizes the generator cannot honour."""
    if task not in ROWS:
        raise DataError(f"unknown counting task '{task}'",
                        hint=did_you_mean(task, TASKS) or f"counting tasks: {', '.join(TASKS)}")
    if not 1 <= back <= MAX_BACK:
        raise DataError(f"{task}: back = {back} is outside 1..{MAX_BACK} (queries name k in one digit)",
                        hint="data.count_back takes 1 (the last occurrence) to 9")
    if not 1 <= stretch <= MAX_STRETCH:
        raise DataError(f"{task}: stretch {stretch} is outside 1..{MAX_STRETCH}",
                        hint="1 is the training segments' length; 2 doubles every segment")
    if length < MIN_LENGTH * stretch:
        raise DataError(f"{task}: a row of {length} bytes is too short for segments stretched {stretch}x "
                        f"(it needs at least {MIN_LENGTH * stretch})",
                        hint="raise the length (or --context), or lower the stretch")


def generate(task: str, n: int, length: int, *, back: int = 3, stretch: int = 1,
             g: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` rows of ``task`` (module docstring): ``tokens``, ``answers``, ``back``, ``sources``."""
    check(task, length, back, stretch)
    d = _Draws(g)
    tokens = torch.empty(n, length, dtype=torch.long)
    answers = torch.zeros(n, length, dtype=torch.bool)
    ks = torch.zeros(n, length, dtype=torch.long)
    sources = torch.full((n, length), -1, dtype=torch.long)
    for i in range(n):
        row = ROWS[task](d, length, back, stretch)
        tokens[i] = torch.tensor(list(row.text[:length]), dtype=torch.long)
        for at, k, src in row.answers:
            if at < length:
                answers[i, at], ks[i, at], sources[i, at] = True, k, src
    return {"tokens": tokens, "answers": answers, "back": ks, "sources": sources}
