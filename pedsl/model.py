"""A small decoder-only transformer whose only positional signal is the compiled scheme.

Pre-norm GPT (nanoGPT layout): byte embedding -> n_layers x [norm -> attention -> residual,
norm -> MLP(GELU) -> residual] -> final norm -> logits through the (tied) embedding.
``arch: llama`` makes it architecturally a Llama (RMSNorm, SwiGLU MLP, no biases), which
``pedsl export RUN --hf DIR`` writes as a ``LlamaForCausalLM``.
There are no absolute position embeddings: every layer's attention is a module built by
``attention_factory(layer_index)`` (normally :func:`pedsl.compiler.compile_scheme`) with

    forward(q, k, v, *, x=None, tokens=None) -> (B, H, L, D)

where q, k, v are (B, H, L, D), ``x`` is the normalised layer input (B, L, d_model) that
data-dependent steps and gates read, and ``tokens`` are the byte ids (B, L).

**Positions.** ``forward(tokens, positions=P)`` takes the tokens' positions: ``(B, L)`` for one
axis, ``(A, B, L)`` for ``A`` axes (Hugging Face's layout of multi-axis ``position_ids``; the grid
tasks of :mod:`pedsl.data.grids` give ``(2, B, L)``, the (h, w) of every token). Each layer's
scheme module gets them as ``positions=`` (:func:`layer_positions`): multi-axis positions go as
they are to a scheme of as many axes, and to a one-axis scheme not at all, since multi-axis data
comes in raster order, whose token index is the raster position that scheme reads (the "raster
1-D" reading of a grid); without positions a module reads the token index, 0..L-1, and is called
as before (its fast path).

``qk_conv: W > 0`` adds a causal depthwise convolution of width W over the queries and keys (per
head and channel, identity at init) before the scheme module sees them: a short convolution as in
linear-attention and PaTH layers, which lets a 2-layer model match on the bytes just before a
query (induction) from the first steps; it carries only the last W - 1 bytes, so a scheme's
long-range behaviour is still its own (docs/semantics.md §10). Off by default.

Shapes: B batch, L length, C = d_model, H heads, D head_dim, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Callable, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn

from pedsl.config import ModelConfig
from pedsl.errors import ShapeError

AttentionFactory = Callable[[int], nn.Module]


def causal_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution along the sequence: ``out[..., t, :] = sum_i w[i] * x[..., t - i, :]``
    (terms with ``t - i < 0`` are zero). x: (B, H, L, D), w: (W, H, D) -> (B, H, L, D)."""
    taps, L = w.shape[0], x.shape[-2]
    xp = F.pad(x, (0, 0, taps - 1, 0))                                      # (B, H, L + W - 1, D)
    out = xp[..., taps - 1:, :] * w[0][:, None, :]
    for i in range(1, taps):
        out = out + xp[..., taps - 1 - i: taps - 1 - i + L, :] * w[i][:, None, :]
    return out


def scheme_axes(scheme) -> int:
    """How many position axes a resolved scheme reads (1 for none: a stand-in module)."""
    axes = getattr(scheme, "axes", None)
    return len(axes) if axes else 1


def axis_count(pe: nn.Module) -> int:
    """How many position axes a layer's scheme module reads (1 for a module without a scheme)."""
    return scheme_axes(getattr(pe, "scheme", None))


def layer_positions(pe: nn.Module, positions: torch.Tensor | None) -> torch.Tensor | None:
    """The ``positions=`` a layer's scheme module gets from the model's ``positions`` (module
    docstring): None, ``(B, L)`` as given, ``(A, B, L)`` as given to a scheme of ``A`` axes and
    None (the raster token index) to a one-axis scheme; a scheme of another axis count is a
    :class:`ShapeError`."""
    if positions is None or positions.dim() == 2:
        return positions
    want = axis_count(pe)
    if want == 1:
        return None
    if positions.dim() != 3 or positions.shape[0] != want:
        name = getattr(getattr(pe, "scheme", None), "name", "?")
        raise ShapeError(f"scheme '{name}' reads {want} position axes, but the data gives positions of shape "
                         f"{tuple(positions.shape)} ({positions.shape[0] if positions.dim() == 3 else '?'} axes)",
                         hint="train it on data with as many axes (a 2-axis scheme on the grid tasks), "
                              "or use a scheme with that many axes")
    return positions


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019) with a learned gain."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return RMSNorm(cfg.d_model, cfg.norm_eps)


class Captured(TypedDict):
    """One layer's scheme-module inputs, as :meth:`TransformerLM.capture` records them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    x: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor | None


class Attention(nn.Module):
    """qkv projection -> (B, H, L, D) -> the scheme module -> output projection."""

    def __init__(self, cfg: ModelConfig, pe: nn.Module) -> None:
        super().__init__()
        head_dim = cfg.head_dim
        assert head_dim is not None  # ModelConfig derives it (d_model // n_heads) when not given
        self.n_heads, self.head_dim = cfg.n_heads, head_dim
        inner = cfg.n_heads * head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.proj = nn.Linear(inner, cfg.d_model, bias=False)
        self.pe = pe
        self.qk_conv: nn.Parameter | None = None
        if cfg.qk_conv:  # (2, W, H, D): taps for q and k, identity at init
            w = torch.zeros(2, cfg.qk_conv, cfg.n_heads, head_dim)
            w[:, 0] = 1.0
            self.qk_conv = nn.Parameter(w)
        self.captured: list[Captured] | None = None

    def forward(self, x: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        B, L, _ = x.shape                                                   # x: (B, L, C), normalised
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim)        # (B, L, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                      # 3 x (B, H, L, D)
        if self.qk_conv is not None:
            q, k = causal_conv(q, self.qk_conv[0]), causal_conv(k, self.qk_conv[1])
        kwargs = {}
        if getattr(self.pe, "needs_x", True):
            kwargs["x"] = x
        if getattr(self.pe, "needs_tokens", True):
            kwargs["tokens"] = tokens
        pos = layer_positions(self.pe, positions)
        if pos is not None:
            kwargs["positions"] = pos
        if self.captured is not None:
            self.captured.append({"q": q.detach(), "k": k.detach(), "v": v.detach(),
                                  "x": x.detach(), "tokens": tokens, "positions": pos})
        o = self.pe(q, k, v, **kwargs)                                      # (B, H, L, D)
        o = o.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim)   # (B, L, H*D)
        return self.proj(o)                                                 # (B, L, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))                                # (B, L, C)


class SwiGLU(nn.Module):
    """Llama's MLP: proj(silu(gate(x)) * fc(x)) (HF: down_proj(act(gate_proj(x)) * up_proj(x)))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.fc = nn.Linear(cfg.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.fc(x))                 # (B, L, C)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, pe: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn = make_norm(cfg), Attention(cfg, pe)
        self.norm2, self.mlp = make_norm(cfg), (SwiGLU(cfg) if cfg.arch == "llama" else MLP(cfg))

    def forward(self, x: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), tokens, positions)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Byte-level language model: ``forward(tokens (B, L), positions=None) -> logits (B, L, V)``
    (positions: module docstring)."""

    def __init__(self, cfg: ModelConfig, attention_factory: AttentionFactory) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attention_factory(i)) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()

    def layers(self) -> list[Block]:
        """The blocks, typed: ``nn.ModuleList`` yields plain Modules."""
        return cast("list[Block]", list(self.blocks))  # __init__ fills self.blocks with Blocks only

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layers).

        Only the model's own layers are touched: the scheme modules keep their own init.
        """
        std = self.cfg.init_std
        own: list[nn.Embedding | nn.Linear] = [self.embed, *([self.head] if self.head is not None else [])]
        for blk in self.layers():
            own += [blk.attn.qkv, blk.attn.proj, blk.mlp.fc, blk.mlp.proj, *([blk.mlp.gate] if isinstance(blk.mlp, SwiGLU) else [])]
        for m in own:
            nn.init.normal_(m.weight, mean=0.0, std=std)
        for blk in self.layers():
            for m in (blk.attn.proj, blk.mlp.proj):
                nn.init.normal_(m.weight, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_layers))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)                                              # (B, L, C)
        for blk in self.blocks:
            x = blk(x, tokens, positions)                                   # (B, L, C)
        x = self.norm(x)
        weight = self.embed.weight if self.head is None else self.head.weight
        return F.linear(x, weight)                                          # (B, L, V)

    def loss(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) of a (B, L + 1) window (``positions``: the window's,
        ``(..., B, L + 1)``)."""
        logits = self(tokens[:, :-1], None if positions is None else positions[..., :-1])  # (B, L, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                               tokens[:, 1:].reshape(-1))

    @torch.no_grad()
    def capture(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> list[Captured]:
        """Per layer, the inputs of its scheme module: ``q, k, v`` (B, H, L, D), ``x`` (B, L, C),
        ``tokens`` (B, L), and ``positions`` (what the layer's module was given, or None). For the
        analysis instruments and the grid study's attention maps (runs the model once, no grad)."""
        out: list[Captured] = []
        for blk in self.layers():
            blk.attn.captured = out
        try:
            self(tokens, positions)
        finally:
            for blk in self.layers():
                blk.attn.captured = None
        return out

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
