"""The decoding cache of the general forward: :class:`AttentionCache`, the reads and appends of its
per-token buffers, its update after a call, and PaTH's pending steps applied to the cached keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pedsl.compiler.general.masks import cache_refusal
from pedsl.compiler.general.inputs import InputError, Layout

if TYPE_CHECKING:  # annotations only: a generated module carries none of it
    from pedsl.compiler.general.mask_side import MaskSide

# <embedded>
# ---------------------------------------------------------------------- cache
class AttentionCache:
    """What one attention layer keeps between decoding calls (see the module docstring).

    Create it with ``module.new_cache(batch_size)``; pass it as ``cache=`` to every call of that
    module (a prefill of any length, then one token or one chunk at a time). ``len(cache)`` is the
    number of cached tokens. Buffers grow by doubling, so appending costs O(new tokens).
    """

    def __init__(self, module: MaskSide, batch_size: int, scheme: str):
        refused = cache_refusal(module)
        if refused is not None:
            raise InputError(*refused)
        if int(batch_size) != batch_size or batch_size < 1:
            raise InputError(f"new_cache: batch_size must be a positive integer, got {batch_size!r}")
        self.scheme = scheme
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
        self.centres: dict[int, int] = {}  # transform index -> xPos: the centre c its cached keys are scaled at
        self.one_doc = True  # every cached token of a row is in the row's current document
        self.all_valid = True  # no cached token is padding
        self.dropped = 0  # tokens a window or chunk no longer sees, dropped from the front

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"AttentionCache(scheme={self.scheme!r}, batch_size={self.batch_size}, length={self.length})"

    def row_ends(self) -> tuple[Tensor, Tensor] | None:
        """Each row's last unpadded token so far: its position (-1: none yet) and document, (B,) each; None
        before the first call."""
        if self.last_pos is None:
            return None
        assert self.last_doc is not None  # advance_rows sets the two together
        return self.last_pos, self.last_doc

    # buffers: token axis is dim 2 for (B, H, L, D) / (B, H, L), dim 1 for (B, L)
    def get(self, name: str) -> Tensor | None:
        return cached(self, name, self.length)

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
            nb = torch.zeros(shape, dtype=new.dtype, device=new.device)
            if b is not None and old_len:
                nb.narrow(ax, 0, old_len).copy_(b.narrow(ax, 0, old_len))
            self._buf[name] = b = nb
        b.narrow(ax, old_len, n).copy_(new)


def token_axis(t: Tensor) -> int:
    return 1 if t.dim() == 2 else 2


def cached(cache: AttentionCache, name: str, n: int) -> Tensor | None:
    """The first n tokens of a cache buffer (a view), or None when the cache has no such buffer."""
    b = cache._buf.get(name)
    return None if b is None else b.narrow(token_axis(b), 0, n)


def stored(cache: AttentionCache, name: str, n: int) -> Tensor:
    """The first n tokens of a buffer every call writes (keys, values, positions, documents, validity, and
    what the scheme's features write on every call): :func:`cached` where its absence is a bug."""
    b = cached(cache, name, n)
    if b is None:
        raise KeyError(f"the cache holds no {name!r} buffer")
    return b


def append_layout(cache: AttentionCache, lay: Layout, v: Tensor, coord: Tensor | None) -> None:
    """Append this call's values, token layout and bias coordinates after the cached tokens."""
    Lc = cache.length
    cache.put("v", v.detach(), Lc)
    cache.put("pos", lay.positions, Lc)
    cache.put("doc", lay.docs, Lc)
    cache.put("valid", lay.valid, Lc)
    if lay.axes_pos is not None:  # (B, A, L): the per-axis positions a bias over distance.AXIS reads
        cache.put("axes", lay.axes_pos.permute(0, 2, 1), Lc)
    if coord is not None:
        cache.put("coord", coord.detach(), Lc)
    if lay.spans is not None:
        cache.put("span", lay.spans, Lc)


def check_cache(cache: AttentionCache, B: int, heads_kv: int) -> None:
    if cache.batch_size != B:
        raise InputError(f"cache: it was made for batch size {cache.batch_size}, this call has {B}",
                         "make one cache per sequence batch: module.new_cache(batch_size)")
    if cache.heads_kv is not None and cache.heads_kv != heads_kv:
        raise InputError(f"cache: it holds keys of {cache.heads_kv} heads, this call gives {heads_kv}",
                         "use the same number of key/value heads for every call with one cache")


def update_cache(cache: AttentionCache, lay: Layout, tr, bi, win, conv_history: int) -> None:
    """After a call (its keys and values are stored already): the running angles and gate sums, the
    last tokens' inputs, where each row stands (last position and document) and the length."""
    cache.angles.update({i: a.detach() for i, a in tr.angles.items()})
    cache.gates.update({i: g.detach() for i, g in bi.gates.items()})
    win.keep(cache, conv_history)
    B, L = lay.valid.shape
    if not lay.padded and cache.last_pos is not None and cache.one_doc and cache.all_valid and (
            lay.docs is cache._doc_view):  # decoding: the row's document continues, nothing padded
        cache.last_pos = lay.positions[:, -1]
        cache.length += L
        return
    cache.all_valid = cache.all_valid and not lay.padded
    ends = cache.row_ends()
    first = ends[1] if ends is not None else lay.docs[:, 0]
    cache.one_doc = cache.one_doc and bool((lay.docs == first[:, None]).all())
    advance_rows(cache, lay)


def advance_rows(cache: AttentionCache, lay: Layout) -> None:
    """Each row's last unpadded token (position and document) after the call; the cache's new length."""
    B, L = lay.valid.shape
    device = lay.valid.device
    ends = cache.row_ends()
    if ends is None:
        ends = torch.full((B,), -1, dtype=torch.long, device=device), torch.zeros(B, dtype=torch.long, device=device)
    any_v = lay.valid.any(1)
    idx = torch.where(lay.valid, torch.arange(L, device=device), -1).max(1).values.clamp(min=0)
    cache.last_pos = torch.where(any_v, lay.positions.gather(1, idx[:, None])[:, 0], ends[0])
    cache.last_doc = torch.where(any_v, lay.docs.gather(1, idx[:, None])[:, 0], ends[1])
    cache.length += L


def path_flush(cache: AttentionCache, nf: int, P) -> None:
    """Apply the pending product ``P`` of PaTH steps to the first ``nf`` keys (those cached before the
    last flush): ``K <- K P^T``. Afterwards every cached key is transported to the newest token."""
    if P is not None and nf:
        Kf = stored(cache, "k", nf).flatten(0, 1)
        Kf.copy_(torch.bmm(Kf, P.transpose(1, 2)))
    cache.path_pending, cache.path_flushed = None, None
# </embedded>
