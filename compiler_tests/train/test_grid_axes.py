"""The transformer on 2-D grids with real multi-axis schemes: a two-axis scheme reads the (h, w)
positions (relative: a shift of every position along an axis changes nothing; swapping the axes
does), a one-axis scheme reads the raster index, the grid study's attention row is the module's,
and a two-axis scheme is refused on data without two axes."""

from __future__ import annotations

import pytest
import torch

from compiler_helpers import float32_bound, float64_bound
from pedsl.config import resolve_train_config
from pedsl.data import grids
from pedsl.errors import ConfigError
from pedsl.lang.library import scheme_file
from pedsl.model import TransformerLM
from pedsl.study.grid.measure import query_row
from pedsl.train import train
from pedsl.train.recipe import from_scheme
from train_helpers import lm_depth


def _model(scheme: str) -> TransformerLM:
    small = {"d_model": 32, "n_heads": 2, "head_dim": 16, "n_layers": 2, "init_std": 0.3}  # far from uniform attention
    cfg = resolve_train_config(scheme=str(scheme_file(scheme)), overrides=small)
    torch.manual_seed(0)
    return TransformerLM(cfg.model, from_scheme(cfg).factory(cfg.model)).eval()


def _grid(H: int = 5, W: int = 6):
    b = grids.image_batch(2, H, W, g=torch.Generator().manual_seed(3))
    pos = grids.grid_positions(H, W)[:, None, :].expand(-1, 2, -1)
    return b["tokens"], pos


@pytest.mark.parametrize("scheme", ["rope_2d", "mrope_hw"])
def test_a_two_axis_scheme_reads_the_grid_positions(scheme):
    from pedsl.study.grid.run import study_schemes

    model = _model(study_schemes([scheme])[0][0]).double()
    tokens, pos = _grid()
    shift = torch.tensor([3, 5])[:, None, None]
    with torch.no_grad():
        out = model(tokens, pos)
        shifted = model(tokens, pos + shift)                                 # relative in each axis
        swapped = model(tokens, pos.flip(0))                                 # (w, h) instead of (h, w)
    # float64: the logits' chain of roundings, plus the phases' (eps64 times the largest position)
    n = lm_depth(model.cfg, tokens.shape[1]) + int((pos + shift).max())
    torch.testing.assert_close(shifted, out, atol=float64_bound(n, out), rtol=0)
    assert (swapped - out).abs().max() > 1e-3


def test_a_one_axis_scheme_reads_the_raster_index():
    model = _model("rope")
    tokens, pos = _grid()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, pos), model(tokens))


def test_query_row_is_the_attention_of_the_two_axis_module():
    """o = sum_j a_j v_j for any v: the row read with one-hot values reproduces the forward."""
    model = _model("rope_2d")
    tokens, pos = _grid()
    cap = model.capture(tokens, pos)[1]
    pe = model.blocks[1].attn.pe
    row = query_row(pe, cap, pos)                                          # (B, H, L)
    L, D = cap["k"].shape[-2:]
    # float32 weights (a score over D channels, a softmax over L keys) sum to 1 within (L + D) eps32
    assert torch.allclose(row.sum(-1), torch.ones(()).double(), rtol=0, atol=float32_bound(L + D, row.sum(-1)))
    v = torch.randn_like(cap["v"])
    with torch.no_grad():
        o = pe(cap["q"][:, :, -1:], cap["k"], v, positions=pos)[:, :, 0]   # (B, H, D)
    # two float32 computations of sum_j a_j v_j, each within float32's rounding of that chain, at |v|'s size
    torch.testing.assert_close(o.double(), torch.einsum("bhl,bhld->bhd", row, v.double()), rtol=0,
                               atol=2 * float32_bound(2 * L + D, v))


def test_a_two_axis_scheme_on_one_axis_data_is_refused(tmp_path):
    cfg = resolve_train_config(scheme=str(scheme_file("rope_2d")), overrides={"d_model": 32, "n_heads": 2, "n_layers": 1, "context": 16,
                                                            "steps": 1, "data": "copy", "threads": 1})
    with pytest.raises(ConfigError, match="reads 2 position axes"):
        train(cfg, tmp_path / "run", quiet=True)
