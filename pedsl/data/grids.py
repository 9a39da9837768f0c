"""Generated 2-D tasks: grids of tokens with an (h, w) position per token.

**Layout.** A grid of ``H`` rows and ``W`` columns is one sequence of ``1 + H * W`` tokens: a
start token (:data:`GRID_BOS`), then the cells in **raster order** (row by row, left to right)::

    index 0            BOS        position (h, w) = (0, 0)
    index 1 + h*W + w  cell (h, w) position (h, w) = (1 + h, 1 + w)

So the token index is the raster position (what a one-axis scheme reads: nothing to pass), and
:func:`grid_positions` gives the two-axis positions, shape ``(2, 1 + H*W)``: axis 0 the row ``h``,
axis 1 the column ``w`` (stacked per batch row they are the ``(A, B, L)`` positions of
``forward(..., positions=P)``, Hugging Face's layout of multi-axis ``position_ids``, here as for an
image after one text token: the text token at 0 on every axis, the image from 1). There are no row
separators: a two-axis scheme reads the row from the position, a one-axis one must find the row
above by its raster distance ``W``, which changes with the grid's width (what the resolution study
measures). A training window of ``context + 1`` tokens is one grid: ``context = H * W``
(:func:`grid_shape`).

Tasks (``GRID_TASKS``), each a pure function of a ``torch.Generator``, returning ``tokens``
``(n, 1 + H*W)`` long and ``answers`` ``(n, 1 + H*W)`` bool (the cells a rule determines, which the
study scores; the loss can weigh them with ``data.answer_weight``):

- ``grid_image`` (:func:`image_batch`): an image-like grid of random shapes (rectangles and
  ellipses, sized as fractions of the grid, so a larger grid is the same kind of picture at a
  higher resolution) over a background, each region filled with one of the :data:`TEXTURES`: a
  palette of its own tokens and a rule giving a cell's palette index from those of the cell above
  and the cell to the left (vertical and diagonal stripes, and two that mix both neighbours).
  A cell whose above and left neighbours lie in its own region is determined by them (an answer);
  the first row, the first column and a region's top and left edges are fresh random tokens of its
  palette. The token after a query at cell (h, w) is cell (h, w + 1): it reads the query itself
  (its left) and the cell at offset (dh, dw) = (-1, +1) from the query (its above), at raster
  distance ``W - 1``.
- ``grid_copy`` (:func:`copy_batch`): random letters; every cell copies the cell at the fixed
  offset ``(dh, dw)`` (``data.grid_offset``, earlier in raster order) with probability 1/2, else a
  fresh letter; the copies are the answers (a copy may copy a copy). The 2-D form of the lag task.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from pedsl.errors import DataError

GRID_TASKS = ("grid_image", "grid_copy")
GRID_BOS = ord("^")
COPY_ALPHABET = torch.tensor(list(b"abcdefghijklmnopqrstuvwxyz"), dtype=torch.long)
MAX_SHAPES = 4


class Texture(NamedTuple):
    """A palette of tokens and the rule of a cell: ``rule[a][l]`` is its palette index from the
    indices ``a`` of the cell above and ``l`` of the cell to the left."""

    name: str
    palette: bytes
    rule: tuple[tuple[int, ...], ...]


def _table(m: int, f) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(f(a, l) % m for l in range(m)) for a in range(m))


# Disjoint palettes: the region of a neighbour shows in its token. Every texture reads the cell
# above (the one a model must find: raster distance W - 1 from the query), two also the left one;
# the above cell alone tells most of a cell, so attending to it pays from the first steps.
TEXTURES = (
    Texture("vertical stripes", b"ab", _table(2, lambda a, l: a)),
    Texture("diagonal stripes", b"cde", _table(3, lambda a, l: a + 1)),
    Texture("above + left parity", b"fghi", _table(4, lambda a, l: a + l % 2)),
    Texture("left + above parity", b"jkl", _table(3, lambda a, l: l + a % 2)),
)


def grid_shape(context: int, width: int | None = None) -> tuple[int, int]:
    """``(H, W)`` of the grid a training window of ``context + 1`` tokens holds (``context = H * W``);
    ``width`` None: a square grid."""
    if width is None:
        side = math.isqrt(context)
        if side * side != context:
            near = [s * s for s in (side, side + 1) if s > 0]
            raise DataError(f"context {context} is not a square grid's size (H * W tokens after the start token)",
                            hint=f"use a square context such as {' or '.join(map(str, near))}, or set "
                                 "data.grid_width (then context = H * grid_width)")
        return side, side
    if width < 1 or context % width:
        raise DataError(f"context {context} is not a whole number of rows of data.grid_width = {width}",
                        hint=f"use a context that is a multiple of {width} (H * W)")
    return context // width, width


def grid_positions(H: int, W: int) -> torch.Tensor:
    """The (h, w) positions of a grid's sequence: ``(2, 1 + H*W)`` long (see the module docstring)."""
    h = torch.arange(H).repeat_interleave(W) + 1
    w = torch.arange(W).repeat(H) + 1
    zero = torch.zeros(1, dtype=torch.long)
    return torch.stack([torch.cat([zero, h]), torch.cat([zero, w])])


def video_positions(frames: int, rows: int, cols: int, *, spacing: int = 2, text_before: int = 0,
                    text_after: int = 0) -> torch.Tensor:
    """VideoRoPE's (t, h, w) positions (Wei et al. 2025, the official ``get_t_scale_rope_index``) of
    ``text_before`` text tokens, a video of ``frames x rows x cols`` tokens in raster order per frame, then
    ``text_after`` text tokens: ``(3, L)`` long, the ``(A, B, L)`` positions of ``video_rope`` for one row.

    Text sits at one position on every axis. Frame ``f`` sits at ``t = text_before + spacing * f``
    (adjustable temporal spacing, delta = ``spacing``), and its cell ``(r, c)`` at ``h = t + r -
    (rows - 1) // 2``, ``w = t + c - (cols - 1) // 2`` (the diagonal layout: a frame's centre on the
    text's diagonal). The text after the video continues at the last frame's ``t + 1``, as the official
    code does (so its h and w positions may lie below the video's largest)."""
    if not (isinstance(spacing, int) and spacing >= 1) or min(frames, rows, cols) < 1 or min(text_before,
                                                                                          text_after) < 0:
        raise DataError(f"video_positions: frames, rows and cols must be at least 1, the text lengths at least 0 "
                        f"and the spacing a whole number >= 1 (pedsl's positions are integers); got frames={frames}, "
                        f"rows={rows}, cols={cols}, spacing={spacing!r}, text {text_before}/{text_after}",
                        hint="the official VideoRoPE uses spacing = 2")
    f, r, c = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij")
    t = text_before + spacing * f.flatten()
    video = torch.stack([t, t + r.flatten() - (rows - 1) // 2, t + c.flatten() - (cols - 1) // 2])
    start = int(t.max()) + 1
    return torch.cat([torch.arange(text_before).expand(3, text_before), video,
                      (start + torch.arange(text_after)).expand(3, text_after)], 1)


def _flat(cells: torch.Tensor, fill: int | bool) -> torch.Tensor:
    """(n, H, W) -> (n, 1 + H*W) with ``fill`` in front (the start token's slot)."""
    n = cells.shape[0]
    head = torch.full((n, 1), fill, dtype=cells.dtype)
    return torch.cat([head, cells.reshape(n, -1)], 1)


def _regions(n: int, H: int, W: int, g: torch.Generator) -> torch.Tensor:
    """(n, H, W) region ids: 0 the background, 1..MAX_SHAPES the shapes painted in order (a later one
    over an earlier one); each grid draws 1..MAX_SHAPES rectangles or ellipses."""
    hh = (torch.arange(H, dtype=torch.float64)[:, None] + 0.5) / H      # cell centres in [0, 1]
    ww = (torch.arange(W, dtype=torch.float64)[None, :] + 0.5) / W
    count = torch.randint(1, MAX_SHAPES + 1, (n,), generator=g)
    ids = torch.zeros(n, H, W, dtype=torch.long)
    for s in range(MAX_SHAPES):
        cy, cx = torch.rand(n, generator=g, dtype=torch.float64), torch.rand(n, generator=g, dtype=torch.float64)
        ry = 0.1 + 0.25 * torch.rand(n, generator=g, dtype=torch.float64)   # half-sizes: 10%..35% of the grid
        rx = 0.1 + 0.25 * torch.rand(n, generator=g, dtype=torch.float64)
        ellipse = torch.rand(n, generator=g) < 0.5
        dy = (hh[None] - cy[:, None, None]) / ry[:, None, None]
        dx = (ww[None] - cx[:, None, None]) / rx[:, None, None]
        inside = torch.where(ellipse[:, None, None], dy ** 2 + dx ** 2 <= 1, (dy.abs() <= 1) & (dx.abs() <= 1))
        inside &= (s < count)[:, None, None]
        ids = torch.where(inside, s + 1, ids)
    return ids


def _texture_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per texture: palette size m (K,), the palettes (K, M) and the rules (K, M, M), padded to M."""
    m = torch.tensor([len(t.palette) for t in TEXTURES])
    M = int(m.max())
    pal = torch.zeros(len(TEXTURES), M, dtype=torch.long)
    rule = torch.zeros(len(TEXTURES), M, M, dtype=torch.long)
    for i, t in enumerate(TEXTURES):
        pal[i, : len(t.palette)] = torch.tensor(list(t.palette))
        rule[i, : len(t.palette), : len(t.palette)] = torch.tensor(t.rule)
    return m, pal, rule


def image_batch(n: int, H: int, W: int, *, g: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` image-like grids (``grid_image``, module docstring): ``tokens`` and ``answers`` ``(n, 1 + H*W)``."""
    if H < 1 or W < 1:
        raise DataError(f"a grid needs at least one row and one column, got {H} x {W}")
    ids = _regions(n, H, W, g)
    region_tex = torch.randint(0, len(TEXTURES), (n, MAX_SHAPES + 1), generator=g)
    tex = region_tex.gather(1, ids.reshape(n, -1)).reshape(n, H, W)
    m, pal, table = _texture_tables()
    fresh = (torch.rand(n, H, W, generator=g) * m[tex]).long()           # a random index of the cell's palette
    same = torch.zeros(n, H, W, dtype=torch.bool)
    same[:, 1:, 1:] = (ids[:, 1:, 1:] == ids[:, :-1, 1:]) & (ids[:, 1:, 1:] == ids[:, 1:, :-1])
    idx = fresh.clone()
    for d in range(1, H + W - 1):  # an anti-diagonal reads only the one before it
        hs = torch.arange(max(1, d - W + 1), min(d, H))
        if not len(hs):
            continue
        ws = d - hs
        keep = ws >= 1
        hs, ws = hs[keep], ws[keep]
        t = tex[:, hs, ws]
        rule = table[t, idx[:, hs - 1, ws], idx[:, hs, ws - 1]]
        idx[:, hs, ws] = torch.where(same[:, hs, ws], rule, fresh[:, hs, ws])
    cells = pal[tex, idx]
    return {"tokens": _flat(cells, GRID_BOS), "answers": _flat(same, False)}


def check_offset(offset: tuple[int, int]) -> None:
    """A copy offset must point at an earlier cell in raster order: dh < 0, or dh = 0 and dw < 0."""
    dh, dw = offset
    if not (dh < 0 or (dh == 0 and dw < 0)):
        raise DataError(f"grid offset ({dh}, {dw}) does not point at an earlier cell in raster order",
                        hint="use dh < 0 (a row above), or dh = 0 and dw < 0 (to the left), e.g. [-2, 1]")


def copy_batch(n: int, H: int, W: int, *, offset: tuple[int, int] = (-2, 1), p: float = 0.5,
               g: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` grids of the 2-D copy task (``grid_copy``, module docstring): ``tokens`` and ``answers``."""
    check_offset(offset)
    dh, dw = offset
    cells = COPY_ALPHABET[torch.randint(0, len(COPY_ALPHABET), (n, H, W), generator=g)]
    copy = torch.rand(n, H, W, generator=g) < p
    rows, cols = torch.arange(H)[:, None], torch.arange(W)[None, :]
    copy &= (rows + dh >= 0) & (cols + dw >= 0) & (cols + dw < W)          # the source is inside the grid
    if dh < 0:
        for h in range(-dh, H):  # a row reads rows above it only: done row by row
            src = cells[:, h + dh].roll(-dw, dims=1)                      # src[:, w] = cells[:, h + dh, w + dw]
            cells[:, h] = torch.where(copy[:, h], src, cells[:, h])
    else:
        for w in range(-dw, W):  # within a row: column by column
            cells[:, :, w] = torch.where(copy[:, :, w], cells[:, :, w + dw], cells[:, :, w])
    return {"tokens": _flat(cells, GRID_BOS), "answers": _flat(copy, False)}


def generate(task: str, n: int, H: int, W: int, *, offset: tuple[int, int] = (-2, 1),
             g: torch.Generator) -> dict[str, torch.Tensor]:
    """Either task by name (``offset``: of ``grid_copy``)."""
    if task == "grid_image":
        return image_batch(n, H, W, g=g)
    if task == "grid_copy":
        return copy_batch(n, H, W, offset=offset, g=g)
    raise DataError(f"unknown grid task '{task}'", hint=f"grid tasks: {', '.join(GRID_TASKS)}")
