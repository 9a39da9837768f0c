"""What the attention layers and the rotary embedding of one Hugging Face model share once
:func:`pedsl.hf.attention.use_pedsl_attention` installs a scheme (:class:`_State`: the compiled scheme, which path
it takes, and on HF's rotary path the rope type and original length of the table), and the module that replaces
the model's ``rotary_emb`` (:class:`_PedslRotary`: the scheme's cos and sin on HF's rotary path, the identity
rotation on the general path).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pedsl.compiler.plan import RUNTIME_LENGTH
from pedsl.compiler.shapes import as_bhlp
from pedsl.errors import InteropError
from pedsl.runtime.torch_backend import Context

F64 = torch.float64


class _State:
    """What the attention layers and the rotary embedding of one model share: the compiled scheme,
    which path it takes, and for HF's rotary path the rope type and original length of the table."""

    def __init__(self, module, hf: dict | None) -> None:
        self.module = module
        self.hf = hf  # export_rope() of the scheme on HF's rotary path; None on the general path
        self.transform: Any = module.transforms[0] if hf else None  # the rotation's TransportStep
        rp = (hf or {}).get("rope_parameters", {})
        self.rope_type = rp.get("rope_type")
        self.original: Any = (hf or {}).get("max_position_embeddings") if self.rope_type == "dynamic" else \
            rp.get("original_max_position_embeddings")
        self.longest: Any = self.original  # HF's max_seq_len_cached of dynamic NTK
        self.axes = tuple(getattr(module.scheme, "axes", ()))  # () one axis; M-RoPE: ("t", "h", "w")
        self.hf_tuning: tuple[float, float] | None = None  # Llama 4 NoPE layer: its query scale, undone
        self.hf_band = False  # HF's mask for the layer carries the part's window or chunk (checked when installed)
        self._freqs: dict[int, torch.Tensor] = {}  # table length (0: static) -> (A, P) float64 frequencies

    def table_length(self, seq_len: int) -> int:
        """The run-time length HF's rotary embedding uses for this call (``dynamic_rope_update``)."""
        if self.rope_type != "dynamic":
            return seq_len  # longrope: long factors above the original, short ones at or below
        if seq_len > self.longest:
            self.longest = seq_len
        if seq_len < self.original < self.longest:
            self.longest = self.original
        return self.longest

    def phases(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, L, P) float64 phases of the scheme's rotation at HF's positions: each axis's position x the
        per-pair frequencies of that axis in the call's table (HF's family is ``GRID * position [/ factor]``,
        M-RoPE's ``GRID * sections(position, ...)``: linear in the positions). ``position_ids`` is (B, L) or,
        for a multi-axis model (Qwen-VL), (A, B, L)."""
        pos = self._axis_positions(position_ids)
        t = self.transform
        n = self.table_length(int(pos.max()) + 1) if t.table == RUNTIME_LENGTH else 0
        w = self._freqs.get(n)
        if w is None or w.device != pos.device:
            if len(self._freqs) > 64:  # a dynamic table per length: keep the recent ones
                self._freqs.clear()
            w = self._freqs[n] = self._axis_frequencies(n or None, pos.device)
        return torch.einsum("abl,ap->blp", pos.to(F64), w)

    def _axis_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(A, B, L) positions for the scheme's A axes: HF's (B, L) is every axis's position (as Qwen-VL's
        rotary expands it); a one-axis scheme reads a model's 3-axis positions only where they agree."""
        A = max(len(self.axes), 1)
        if position_ids.dim() == 2:
            return position_ids[None].expand(A, *position_ids.shape)
        if position_ids.shape[0] == A:
            return position_ids
        if A == 1 and bool((position_ids == position_ids[:1]).all()):
            return position_ids[:1]
        raise InteropError(f"the model passed {position_ids.shape[0]}-axis positions that differ between axes (an "
                           f"image or video) to a scheme with {A} axis(es); a one-axis scheme reads one position "
                           "per token", code="E964", hint="use a multi-axis scheme (axes t, h, w), e.g. the model's "
                           "own: use_pedsl_attention(model) imports it")

    def _axis_frequencies(self, n: int | None, device) -> torch.Tensor:
        """(A, P): the phase of each pair per unit position along each axis (the phase at the unit position
        of that axis, every other axis at 0)."""
        t, mod = self.transform, self.module
        P, A = len(t.channels) // 2, max(len(self.axes), 1)
        extra: dict[str, Any] = {"axes": self.axes, "axes_pos": torch.eye(A, device=device)[:, None, :]} if self.axes else {}
        ctx = Context(values=mod.values, heads=mod.heads, pairs=P, chans=2 * P, L=1, n=n,
                      positions=torch.ones(A, 1, dtype=torch.long, device=device), device=device, dtype=F64, **extra)
        w = as_bhlp(mod.evaluator.run(t.expr, ctx, t.site), 1, P)[:, 0, 0]
        return w.expand(A, P)


def hf_cos_sin(phase: torch.Tensor, scale: float, width: int | None, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's (cos, sin) of pair phases (B, L, P): ``cat(f, f)`` when the model's tables are 2P wide
    (Llama's rotate_half), ``f`` when P wide (GPT-OSS's chunked halves), times the attention factor."""
    cos, sin = torch.cos(phase), torch.sin(phase)
    if scale != 1:
        cos, sin = cos * scale, sin * scale
    if width == 2 * phase.shape[-1]:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return cos.to(dtype), sin.to(dtype)


class _PedslRotary(nn.Module):
    """Replaces a model's ``rotary_emb``: the scheme's cos/sin on HF's rotary path, the identity
    rotation (cos = 1, sin = 0, in the model's shape and order: ``sin_first``, GPT-J's (sin, cos)) on the general
    path."""

    def __init__(self, inner: nn.Module, state: _State, width: int | None, sin_first: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.state = state
        self.width = width
        self.sin_first = sin_first

    def __getattr__(self, name: str) -> Any:
        """The replaced embedding's other attributes, which a model may read (Ergo iterates its ``rope_type``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None:
                raise
            return getattr(inner, name)

    def forward(self, x, position_ids, *args, **kwargs):
        st = self.state
        if st.hf is None:
            out = self.inner(x, position_ids, *args, **kwargs)
            if isinstance(out, torch.Tensor) and out.is_complex():  # Llama 4's freqs_cis: rotation by 1 + 0i
                return torch.ones_like(out)
            first, second = out
            if self.sin_first:
                return torch.zeros_like(first), torch.ones_like(second)
            return torch.ones_like(first), torch.zeros_like(second)
        if self.sin_first:
            raise InteropError(f"{type(self.inner).__name__} returns (sin, cos): HF's rotary path does not drive it",
                               code="E964")
        return hf_cos_sin(st.phases(position_ids.to(x.device)), st.transform.scale, self.width, x.dtype)
