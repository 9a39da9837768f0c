"""The decoding cache of a compiled scheme: what one attention layer keeps between calls
(the rules are in :mod:`pedsl.compiler.stream`'s docstring and docs/semantics.md §8)."""

from __future__ import annotations

import torch
from torch import Tensor

from pedsl.compiler.inputs import Layout
from pedsl.errors import ShapeError


class AttentionCache:
    """What one attention layer keeps between decoding calls (see the module docstring).

    Create it with ``module.new_cache(batch_size)``; pass it as ``cache=`` to every call of that
    module (a prefill of any length, then one token or one chunk at a time). ``len(cache)`` is the
    number of cached tokens. Buffers grow by doubling, so appending costs O(new tokens).
    """

    def __init__(self, module, batch_size: int):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ShapeError(f"new_cache: batch_size must be a positive integer, got {batch_size!r}")
        self.scheme = module.scheme.name
        self.owner = id(module)
        self.batch_size = int(batch_size)
        self.length = 0
        self.heads_kv: int | None = None  # heads of the stored keys (Hkv, or Hq when transports differ per head)
        self._buf: dict[str, Tensor] = {}  # name -> buffer with the token axis last-but-one or last
        self.angles: dict[int, Tensor] = {}  # transform index -> (B, H|1, P) float64 running cumulative angles
        self.gates: dict[int, Tensor] = {}  # bias index -> (B, H) float64 running log-gate sums
        self.window: dict[str, Tensor | None] | None = None  # the last tokens' inputs (short convolutions)
        self.last_pos: Tensor | None = None  # (B,) position of the last unpadded token (-1: none yet)
        self.last_doc: Tensor | None = None  # (B,) its document
        self.raw: dict[str, Tensor | None] | None = None  # reference backend: every input so far
        self._doc_view = None  # the document ids layout() gave a continuing decoding call
        self.path_pending: Tensor | None = None  # PaTH: product of the steps since the last flush, (B*H, D, D)
        self.path_flushed: int | None = None  # PaTH: keys before this index wait for path_pending (None: none)
        self.one_doc = True  # every cached token of a row is in the row's current document
        self.all_valid = True  # no cached token is padding

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"AttentionCache(scheme={self.scheme!r}, batch_size={self.batch_size}, length={self.length})"

    # buffers: token axis is dim 2 for (B, H, L, D) / (B, H, L), dim 1 for (B, L)
    def get(self, name: str) -> Tensor | None:
        b = self._buf.get(name)
        if b is None:
            return None
        return b.narrow(token_axis(b), 0, self.length)

    def put(self, name: str, new: Tensor, old_len: int) -> None:
        """Write ``new`` (token axis as in the buffer) after the first ``old_len`` tokens."""
        ax = token_axis(new)
        n = new.shape[ax]
        b = self._buf.get(name)
        need = old_len + n
        if b is None or b.shape[ax] < need or b.dtype != new.dtype or b.device != new.device:
            cap = max(16, 1 << (need - 1).bit_length())
            shape = list(new.shape)
            shape[ax] = cap
            nb = new.new_zeros(shape) if new.dtype != torch.bool else torch.zeros(shape, dtype=torch.bool,
                                                                                   device=new.device)
            if b is not None and old_len:
                nb.narrow(ax, 0, old_len).copy_(b.narrow(ax, 0, old_len))
            self._buf[name] = b = nb
        b.narrow(ax, old_len, n).copy_(new)


def token_axis(t: Tensor) -> int:
    return 1 if t.dim() == 2 else 2



def append_tokens(cache, lay: Layout, k, v, coord):
    """Append this call's keys, values and token layout."""
    if cache.heads_kv is None:
        cache.heads_kv = k.shape[1]
    cache.put("k", k.detach(), cache.length)
    append_layout(cache, lay, v, coord)


def append_layout(cache, lay: Layout, v, coord) -> None:
    """Append this call's values, token layout and bias coordinates after the cached tokens."""
    Lc = cache.length
    cache.put("v", v.detach(), Lc)
    cache.put("pos", lay.positions, Lc)
    cache.put("doc", lay.docs, Lc)
    cache.put("valid", lay.valid, Lc)
    if coord is not None:
        cache.put("coord", coord.detach(), Lc)


def cached(cache, name, Lc):
    b = cache._buf.get(name)
    return None if b is None else b.narrow(token_axis(b), 0, Lc)
