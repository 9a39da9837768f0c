"""Multi-axis positions through the model and the training loop: (A, B, L) positions reach a scheme
of A axes, a one-axis scheme reads the raster token index, and a mismatch is a ShapeError."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pedsl.config import ModelConfig
from pedsl.data import grids
from pedsl.errors import ShapeError
from pedsl.model import TransformerLM, layer_positions
from pedsl.train import train
from pedsl.train.recipe import SchemeRecipe
from train_helpers import small_cfg


class Recorder(nn.Module):
    """Causal SDPA that records the positions it was given; ``axes``: its scheme's axes."""

    needs_x = needs_tokens = False

    def __init__(self, axes: tuple[str, ...], seen: list):
        super().__init__()
        self.scheme = SimpleNamespace(name=f"axes{len(axes)}", axes=axes)
        self.seen = seen

    def forward(self, q, k, v, *, positions=None):
        self.seen.append(None if positions is None else positions.clone())
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _model(axes, seen):
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2)
    return TransformerLM(cfg, lambda i: Recorder(axes, seen))


def test_two_axis_positions_reach_a_two_axis_scheme():
    seen: list = []
    pos = grids.grid_positions(3, 3)[:, None, :].expand(-1, 2, -1)           # (2, B, L)
    out = _model(("h", "w"), seen)(torch.zeros(2, 10, dtype=torch.long), pos)
    assert out.shape == (2, 10, 256) and len(seen) == 2
    assert all(torch.equal(s, pos) for s in seen)


def test_one_axis_scheme_reads_the_raster_index():
    seen: list = []
    pos = grids.grid_positions(3, 3)[:, None, :].expand(-1, 2, -1)
    _model((), seen)(torch.zeros(2, 10, dtype=torch.long), pos)
    assert seen == [None, None]                                              # 0..L-1: raster order
    flat = torch.arange(10)[None].expand(2, -1)
    _model((), seen := [])(torch.zeros(2, 10, dtype=torch.long), flat)
    assert all(torch.equal(s, flat) for s in seen)                           # (B, L) passes as given


def test_axis_mismatch_is_a_shape_error():
    pe = Recorder(("t", "h", "w"), [])
    with pytest.raises(ShapeError, match="reads 3 position axes"):
        layer_positions(pe, torch.zeros(2, 1, 5, dtype=torch.long))


def test_training_on_a_grid_passes_its_positions(tmp_path):
    seen: list = []
    src = "# test stand-in: a two-axis recorder\n"
    recipe = SchemeRecipe(name="axes2", source=src, source_hash=hashlib.sha256(src.encode()).hexdigest(),
                          build=lambda m: (lambda i: Recorder(("h", "w"), seen)))
    cfg = small_cfg(context=16, steps=2, eval_every=2, checkpoint_every=2, log_every=1, data="grid_image")
    done = train(cfg, tmp_path / "run", attention=recipe, quiet=True)
    assert done["steps"] == 2
    want = grids.grid_positions(4, 4)[:, :-1]                                 # the window's first L = 16
    assert seen and all(s.shape[0] == 2 and s.shape[2] == 16 and torch.equal(s[:, 0], want) for s in seen)


@pytest.mark.parametrize("axes,data,needle", [(("h", "w"), "copy", "reads 2 position axes"),
                                              (("t", "h", "w"), "grid_image", "reads 3 position axes")])
def test_a_multi_axis_scheme_on_data_without_its_axes_is_refused_before_the_run(tmp_path, axes, data, needle):
    from pedsl.errors import ConfigError

    src = "# test stand-in\n"
    recipe = SchemeRecipe(name="multi", source=src, source_hash=hashlib.sha256(src.encode()).hexdigest(),
                          build=lambda m: (lambda i: Recorder(axes, [])), scheme=SimpleNamespace(name="multi", axes=axes))
    with pytest.raises(ConfigError, match=needle):
        train(small_cfg(context=16, steps=1, data=data), tmp_path / "run", attention=recipe, quiet=True)
    assert not (tmp_path / "run").exists()
