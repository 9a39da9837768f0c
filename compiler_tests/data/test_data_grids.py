"""The 2-D grid tasks (pedsl.data.grids) and their training stream: layout, determinism, and that
the dependency really is on the cell above and the cell to the left (or at the copy offset)."""

from __future__ import annotations

import pytest
import torch

from pedsl.config import DataConfig, TrainConfig
from pedsl.data import grids
from pedsl.data.stream import TrainData, make_generator, parse_mixture, task_windows
from pedsl.errors import DataError


def _cells(tokens: torch.Tensor, H: int, W: int) -> torch.Tensor:
    return tokens[:, 1:].reshape(tokens.shape[0], H, W)


def image_oracle(tokens: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """Predict every cell from the cells above and to the left only, by the texture rule of the
    palette they belong to (written from the TEXTURES table, independent of the generator's loop);
    -1 where the neighbours do not share a texture (no prediction)."""
    cells = _cells(tokens, H, W).tolist()
    out = torch.full((tokens.shape[0], H, W), -1, dtype=torch.long)
    where = {b: (k, i) for k, t in enumerate(grids.TEXTURES) for i, b in enumerate(t.palette)}
    for n, grid in enumerate(cells):
        for h in range(1, H):
            for w in range(1, W):
                (ka, ia), (kl, il) = where[grid[h - 1][w]], where[grid[h][w - 1]]
                if ka == kl:
                    t = grids.TEXTURES[ka]
                    out[n, h, w] = t.palette[t.rule[ia][il]]
    return out


def best_bigram_accuracy(tokens: torch.Tensor, scored: torch.Tensor) -> float:
    """The accuracy of the best possible 1-D bigram predictor (next token from the current one, in
    raster order), fitted on the very data it is scored on (an upper bound for any bigram)."""
    prev, nxt, keep = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1), scored[:, 1:].reshape(-1)
    counts = torch.zeros(256, 256)
    counts.index_put_((prev[keep], nxt[keep]), torch.ones(int(keep.sum())), accumulate=True)
    return float(counts.max(1).values.sum() / counts.sum())


def test_layout_positions_and_raster_order():
    pos = grids.grid_positions(3, 4)
    assert pos.shape == (2, 13)
    assert pos[:, 0].tolist() == [0, 0]                       # the start token
    for h in range(3):
        for w in range(4):
            assert pos[:, 1 + h * 4 + w].tolist() == [1 + h, 1 + w]
    b = grids.image_batch(2, 3, 4, g=make_generator(0))
    assert b["tokens"].shape == b["answers"].shape == (2, 13)
    assert (b["tokens"][:, 0] == grids.GRID_BOS).all() and not b["answers"][:, 0].any()


@pytest.mark.parametrize("task", grids.GRID_TASKS)
def test_deterministic_per_seed(task):
    a = grids.generate(task, 4, 9, 7, g=make_generator(3, 1))
    b = grids.generate(task, 4, 9, 7, g=make_generator(3, 1))
    c = grids.generate(task, 4, 9, 7, g=make_generator(3, 2))
    assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["answers"], b["answers"])
    assert not torch.equal(a["tokens"], c["tokens"])


@pytest.mark.parametrize("H,W", [(16, 16), (24, 13)])
def test_image_cells_depend_on_above_and_left(H, W):
    b = grids.image_batch(16, H, W, g=make_generator(7, H, W))
    tokens, answers = b["tokens"], b["answers"]
    cells_scored = _cells(answers, H, W)
    assert 0.3 < float(cells_scored.float().mean()) < 0.98      # most cells, never all (edges are fresh)
    assert not cells_scored[:, 0, :].any() and not cells_scored[:, :, 0].any()
    pred = image_oracle(tokens, H, W)
    truth = _cells(tokens, H, W)
    assert torch.equal(pred[cells_scored], truth[cells_scored])   # the oracle reading above/left: 100%
    assert best_bigram_accuracy(tokens, answers) < 0.75           # the left neighbour alone falls short
    # and the above neighbour alone does not determine every cell either
    above = torch.cat([torch.zeros(16, 1, W, dtype=torch.long), truth[:, :-1]], 1)
    counts = torch.zeros(256, 256)
    counts.index_put_((above[cells_scored], truth[cells_scored]), torch.ones(int(cells_scored.sum())), accumulate=True)
    assert float(counts.max(1).values.sum() / counts.sum()) < 0.9


def test_image_shapes_scale_with_the_grid():
    """A larger grid is the same kind of picture at a higher resolution: the answer fraction stays."""
    small = grids.image_batch(32, 16, 16, g=make_generator(1))["answers"].float().mean()
    big = grids.image_batch(32, 48, 48, g=make_generator(1))["answers"].float().mean()
    assert float(big) > float(small)  # fewer edge cells in proportion
    assert float(big) - float(small) < 0.2


@pytest.mark.parametrize("offset", [(-2, 1), (-1, -3), (0, -2)])
def test_copy_task_copies_at_the_offset(offset):
    H, W = 10, 12
    b = grids.copy_batch(8, H, W, offset=offset, g=make_generator(5))
    cells, copied = _cells(b["tokens"], H, W), _cells(b["answers"], H, W)
    dh, dw = offset
    assert 0.3 < float(copied.float().mean()) < 0.6
    for n, h, w in copied.nonzero().tolist():
        assert cells[n, h, w] == cells[n, h + dh, w + dw]
    assert best_bigram_accuracy(b["tokens"], b["answers"]) < 0.3


def test_copy_offset_must_point_back():
    with pytest.raises(DataError, match="earlier cell"):
        grids.copy_batch(1, 4, 4, offset=(0, 1), g=make_generator(0))
    with pytest.raises(ValueError, match="earlier cell"):
        DataConfig(grid_offset=(1, 0))


def test_grid_shape():
    assert grids.grid_shape(256) == (16, 16)
    assert grids.grid_shape(96, 12) == (8, 12)
    with pytest.raises(DataError, match="square"):
        grids.grid_shape(255)
    with pytest.raises(DataError, match="whole number of rows"):
        grids.grid_shape(96, 7)


def test_stream_gives_grids_and_positions():
    cfg = TrainConfig(context=64, data={"source": "grid_image"})
    data = TrainData(cfg.data, cfg.context, cfg.seed)
    rows, mask = data.train_rows(3, 4)
    assert rows.shape == mask.shape == (4, 65)
    again, _ = TrainData(cfg.data, cfg.context, cfg.seed).train_rows(3, 4)
    assert torch.equal(rows, again)                              # a pure function of (seed, step)
    pos = data.positions(4)
    assert pos.shape == (2, 4, 65) and torch.equal(pos[:, 2], grids.grid_positions(8, 8))
    assert TrainData(TrainConfig(context=64, data={"source": "copy"}).data, 64, 0).positions(4) is None
    with pytest.raises(DataError, match="square"):
        TrainData(cfg.data, 60, 0)


def test_grid_tasks_are_not_mixed_nor_read_as_1d_windows():
    with pytest.raises(DataError, match="grid task"):
        parse_mixture("grid_image:0.5,copy:0.5")
    with pytest.raises(DataError, match="grid study"):
        task_windows(DataConfig(source="grid_copy"), 2, 65, make_generator(0))
