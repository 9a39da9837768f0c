"""The bridge between a scheme and the model: one compiled attention module per layer.

:class:`SchemeRecipe` bundles what a run needs to know about its positional encoding: a
name, the source text, the sha256 of the resolved scheme (every file it is made of, see
:mod:`pedsl.train.rundir`; recorded in the run directory and every checkpoint), and
``factory(model_cfg) -> (layer_index -> nn.Module)``. :func:`from_scheme` builds it with
:func:`pedsl.lang.api.load` and :func:`pedsl.compiler.compile_scheme`; :func:`nope` is the
no-positional-encoding floor (plain causal SDPA), used by benchmarks and tests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from pedsl.config import ModelConfig, TrainConfig
from pedsl.errors import CompileError
from pedsl.train.schemefiles import scheme_files

Factory = Callable[[int], nn.Module]


@dataclass
class SchemeRecipe:
    name: str
    source: str
    source_hash: str
    build: Callable[[ModelConfig], Factory]
    scheme: Any = field(default=None, repr=False)
    files: Any = field(default=None, repr=False)  # pedsl.train.schemefiles.SchemeFiles: the files copied into the run

    def factory(self, model_cfg: ModelConfig) -> Factory:
        return self.build(model_cfg)

    def layer_parts(self, model_cfg: ModelConfig) -> tuple[str, ...] | None:
        """The scheme part of each layer (None when every layer has the one scheme)."""
        if getattr(self.scheme, "layers", None) is None:
            return None
        from pedsl.lang.api import load

        return layer_parts(load(self.scheme, layers=model_cfg.n_layers), model_cfg.n_layers)


def load_scheme(path_or_text: str | Path, params: dict[str, Any] | None = None, name: str | None = None):
    try:
        from pedsl.lang.api import load
    except ImportError as exc:
        raise CompileError(f"the pedsl language front end is not available ({exc})") from None
    return load(str(path_or_text), params=dict(params) if params else None, scheme=name)


def from_scheme(cfg: TrainConfig, scheme: Any = None) -> SchemeRecipe:
    """Load ``cfg.scheme`` with ``cfg.params`` (unless a loaded ``scheme`` is given) and compile
    one attention module per layer."""
    if scheme is None:
        scheme = load_scheme(cfg.scheme, cfg.params)

    def build(m: ModelConfig) -> Factory:
        return per_layer(scheme, m, backend=cfg.backend, compile=cfg.compile)

    files = scheme_files(scheme)  # the main file and every import: the run's hash covers them all
    return SchemeRecipe(name=scheme.name, source=scheme.source, source_hash=files.digest,
                           build=build, scheme=scheme, files=files)


def per_layer(scheme: Any, m: ModelConfig, **options: Any) -> Factory:
    """``layer -> module``: the scheme (a ``layers`` scheme: the layer's part) compiled for the model's
    shapes with ``options`` of :func:`pedsl.compiler.compile_scheme`."""
    from pedsl.lang.api import load

    try:
        from pedsl.compiler import compile_scheme
    except ImportError as exc:
        raise CompileError(f"the pedsl compiler is not available ({exc})") from None

    # the structural names the model fixes; a layers scheme checks its rules against the layer count
    fixed = load(scheme, heads=m.n_heads, head_dim=m.head_dim, layers=m.n_layers)
    parts = layer_parts(fixed, m.n_layers)
    layers = fixed.layers  # not None whenever parts is not None

    def make(layer: int) -> nn.Module:
        part = fixed if parts is None or layers is None else layers.parts[parts[layer]]
        return compile_scheme(part, head_dim=m.head_dim, num_heads=m.n_heads, d_model=m.d_model,
                              vocab_size=m.vocab_size, **options)
    return make


def layer_parts(scheme: Any, n_layers: int) -> tuple[str, ...] | None:
    """The part of each layer of a ``layers`` scheme checked for ``n_layers`` layers (None for an ordinary
    scheme: every layer is the scheme itself); what checkpoints record as ``scheme_layers``."""
    if scheme is None or getattr(scheme, "layers", None) is None:
        return None
    return scheme.layers.assign(n_layers)


class CausalSDPA(nn.Module):
    """No positional encoding: ``softmax(q k^T / sqrt(D) + causal mask) v``, (B, H, L, D)."""

    needs_x = False
    needs_tokens = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, x=None, tokens=None) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def nope() -> SchemeRecipe:
    src = "# built-in: no positional encoding (causal SDPA)\n"
    return SchemeRecipe(name="nope", source=src, source_hash=hashlib.sha256(src.encode()).hexdigest(),
                           build=lambda m: (lambda i: CausalSDPA()))
