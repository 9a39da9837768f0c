"""Retrieval tasks in the spirit of RULER, generated on the fly, byte level, at a controlled depth.

Three tasks (``TASKS``), each a pure function of a ``torch.Generator``:

- ``passkey`` - single needle: ``"The pass key is 12345. "`` hidden in filler text, asked for at
  the end: ``" What is the pass key? The pass key is 12345"``.
- ``multikey`` - multi-key needle with distractors: ``keys`` needles ``"The key of abc is 12345. "``
  with distinct random 3-letter names; the end asks for one of them: ``"The key of abc is 12345"``.
  The other needles are distractors (same format, other names and values).
- ``kv`` - key-value lookup: the haystack is nothing but pairs ``"abcd=12345; "`` (distinct random
  4-letter keys); the end asks for one: ``"| abcd=12345"``.

Every row holds exactly ``length`` bytes and ends with the answer (``digits`` decimal digits).
**Depth** (a fraction in [0, 1], or None for a uniformly random one per row) places the needle
the question asks about: for ``passkey`` and ``multikey`` its first byte is at
``round(depth * room)``, with ``room = length - len(question) - len(needle)`` (0: the start of
the haystack, 1: right before the question); for ``kv`` the asked pair is pair number
``round(depth * (pairs - 1))`` of the haystack (pairs are of fixed width, so its position is
``pad + index * width``).

Each generator returns a dict of tensors:

- ``tokens`` (n, length) long,
- ``answer_positions`` (n, digits): where the answer digits are at the end (predicted from the
  logits one position earlier),
- ``source_positions`` (n, digits): where the same digits stand inside the needle (the span a
  model must copy), so ``tokens[source] == tokens[answer]``,
- ``needle_positions`` (n,): first byte of the asked needle; ``depth`` (n,) float: the depth used.

Chance (a model that ignores the context): 0.1 per digit, ``10 ** -digits`` for a whole answer.
"""

from __future__ import annotations

from typing import Callable

import torch

from pedsl.errors import DataError, did_you_mean
from pedsl.data.synthetic import FILLER  # the haystack text every retrieval task shares

TASKS = ("passkey", "multikey", "kv")
DIGIT_CHANCE = 0.1
PASSKEY_QUESTION = b" What is the pass key? The pass key is "
KV_QUESTION = b"| "


def _randint(g: torch.Generator, lo: int, hi: int) -> int:
    """A uniform integer in [lo, hi] (inclusive)."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _digits(g: torch.Generator, n: int) -> bytes:
    return bytes(b"0123456789"[int(i)] for i in torch.randint(0, 10, (n,), generator=g))


def _word(g: torch.Generator, n: int) -> bytes:
    return bytes(b"abcdefghijklmnopqrstuvwxyz"[int(i)] for i in torch.randint(0, 26, (n,), generator=g))


def _distinct_words(g: torch.Generator, count: int, n: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        w = _word(g, n)
        if w not in out:
            out.append(w)
    return out


def _filler(g: torch.Generator, n: int) -> bytes:
    """``n`` bytes of filler text starting at a random phase of ``FILLER``."""
    phase = _randint(g, 0, len(FILLER) - 1)
    return (FILLER * ((phase + n) // len(FILLER) + 1))[phase: phase + n]


def _depth(depth: float | None, g: torch.Generator) -> float:
    if depth is None:
        return float(torch.rand((), generator=g))
    if not 0.0 <= depth <= 1.0:
        raise DataError(f"needle depth {depth} is outside [0, 1]", hint="0 puts the needle first, 1 last")
    return float(depth)


def _too_short(task: str, length: int, need: int) -> DataError:
    return DataError(f"{task}: a sequence of {length} bytes is too short for the task (it needs at least {need})",
                     hint="raise the length (or --context), or lower digits / keys")


def _pack(rows: list[tuple[bytes, int, int, float]], digits: int, length: int) -> dict[str, torch.Tensor]:
    """rows of (bytes, needle position, answer source position, depth) -> the task's tensors."""
    tokens = torch.tensor([list(r[0]) for r in rows], dtype=torch.long)
    ar = torch.arange(digits)
    answers = (length - digits + ar).expand(len(rows), -1).clone()
    sources = torch.tensor([r[2] for r in rows], dtype=torch.long)[:, None] + ar[None, :]
    return {"tokens": tokens, "answer_positions": answers, "source_positions": sources,
            "needle_positions": torch.tensor([r[1] for r in rows], dtype=torch.long),
            "depth": torch.tensor([r[3] for r in rows], dtype=torch.float64)}


def passkey(n: int, length: int, *, depth: float | None = None, digits: int = 5,
            g: torch.Generator) -> dict[str, torch.Tensor]:
    """Single needle ``"The pass key is KEY. "`` at ``depth``; the row ends with the question and KEY."""
    rows = []
    prefix = b"The pass key is "
    for _ in range(n):
        key = _digits(g, digits)
        needle = prefix + key + b". "
        tail = PASSKEY_QUESTION + key
        room = length - len(tail) - len(needle)
        if room < 0:
            raise _too_short("passkey", length, len(tail) + len(needle))
        d = _depth(depth, g)
        at = round(d * room)
        filler = _filler(g, room)
        row = filler[:at] + needle + filler[at:] + tail
        rows.append((row, at, at + len(prefix), d))
    return _pack(rows, digits, length)


def multikey(n: int, length: int, *, depth: float | None = None, digits: int = 5, keys: int = 3,
             g: torch.Generator) -> dict[str, torch.Tensor]:
    """``keys`` needles ``"The key of NAME is VALUE. "`` (one asked, ``keys - 1`` distractors).

    The asked needle starts at ``round(depth * room)``; the distractors are spread at random
    over the rest of the haystack, never overlapping it or each other."""
    if keys < 1:
        raise DataError("multikey needs at least one key", hint="use keys >= 1")
    rows = []
    for _ in range(n):
        names = _distinct_words(g, keys, 3)
        values = [_digits(g, digits) for _ in names]
        needles = [b"The key of " + nm + b" is " + v + b". " for nm, v in zip(names, values)]
        width = len(needles[0])
        tail = b" The key of " + names[0] + b" is " + values[0]
        hay = length - len(tail)                       # haystack bytes (filler and needles)
        room = hay - width                             # start positions of the asked needle
        need = (keys + (keys > 1)) * width             # a spare width: distractors fit around any depth
        if hay < need:
            raise _too_short("multikey", length, len(tail) + need)
        d = _depth(depth, g)
        at = round(d * room)
        # split the distractors between the gap before the asked needle and the gap after it
        fits_before, fits_after = at // width, (hay - at - width) // width
        lo, hi = max(0, keys - 1 - fits_after), min(keys - 1, fits_before)
        before = _randint(g, lo, hi)
        order = torch.randperm(keys - 1, generator=g).tolist()
        others = [needles[1 + i] for i in order]

        def spread(segment_len: int, parts: list[bytes]) -> bytes:
            free = segment_len - sum(len(p) for p in parts)
            cuts = sorted(_randint(g, 0, free) for _ in parts)
            text = _filler(g, free)
            out, prev = b"", 0
            for c, p in zip(cuts, parts):
                out += text[prev:c] + p
                prev = c
            return out + text[prev:]

        row = spread(at, others[:before]) + needles[0] + spread(hay - at - width, others[before:]) + tail
        rows.append((row, at, at + len(b"The key of ") + 3 + len(b" is "), d))
    return _pack(rows, digits, length)


def kv(n: int, length: int, *, depth: float | None = None, digits: int = 5, queries: int = 1,
       g: torch.Generator) -> dict[str, torch.Tensor]:
    """A haystack of pairs ``"KEY=VALUE; "`` (distinct 4-letter keys); the row ends ``"| KEY=VALUE"``.

    Pair number ``round(depth * (pairs - 1))`` is asked; leading spaces pad the haystack.
    ``queries > 1`` asks ``queries - 1`` other pairs first (distinct, random order, each
    ``"| KEY=VALUE"``): every one of their value digits and all but the first key letter is a copy
    target, which gives training a dense copy signal; the scored answer is still the last one."""
    if queries < 1:
        raise DataError("kv needs at least one query", hint="use queries >= 1")
    rows = []
    width = 4 + 1 + digits + 2
    qwidth = len(KV_QUESTION) + 4 + 1 + digits
    for _ in range(n):
        tail_len = queries * qwidth
        hay = length - tail_len
        pairs = hay // width
        if pairs < queries:
            raise _too_short("kv", length, tail_len + queries * width)
        pad = hay - pairs * width
        d = _depth(depth, g)
        idx = round(d * (pairs - 1))
        keys = _distinct_words(g, pairs, 4)
        values = [_digits(g, digits) for _ in keys]
        body = b"".join(k + b"=" + v + b"; " for k, v in zip(keys, values))
        others = [i for i in torch.randperm(pairs, generator=g).tolist() if i != idx][: queries - 1]
        tail = b"".join(KV_QUESTION + keys[i] + b"=" + values[i] for i in others + [idx])
        row = b" " * pad + body + tail
        at = pad + idx * width
        rows.append((row, at, at + 5, d))
    return _pack(rows, digits, length)


GENERATORS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {"passkey": passkey, "multikey": multikey, "kv": kv}


def generate(task: str, n: int, length: int, *, depth: float | None = None, digits: int = 5, keys: int = 3,
             g: torch.Generator) -> dict[str, torch.Tensor]:
    """Any task by name (``keys`` is used by ``multikey`` only)."""
    if task not in GENERATORS:
        raise DataError(f"unknown retrieval task '{task}'", hint=did_you_mean(task, TASKS) or f"tasks: {', '.join(TASKS)}")
    extra = {"keys": keys} if task == "multikey" else {}
    return GENERATORS[task](n, length, depth=depth, digits=digits, g=g, **extra)


def min_length(task: str, digits: int = 5, keys: int = 3, queries: int = 1) -> int:
    """The shortest sequence the task fits in (``queries``: of ``kv``)."""
    if task == "passkey":
        return len(PASSKEY_QUESTION) + digits + len(b"The pass key is ") + digits + 2
    if task == "multikey":
        width = len(b"The key of ") + 3 + len(b" is ") + digits + 2
        return len(b" The key of ") + 3 + len(b" is ") + digits + (keys + (keys > 1)) * width
    return queries * (len(KV_QUESTION) + 5 + digits + (4 + 1 + digits + 2))
