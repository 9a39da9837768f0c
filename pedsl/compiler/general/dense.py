"""Dense and block rotations in the general forward (docs/semantics.md §2e): the learned generators of one
``dense_rotation`` and the rotation of a group's channels by them.

``R(p) = P^T expm(sum_a p_a A_a) P``. The general forward rotates q_i by ``expm(sum_a p_ia A_a) P`` and k_j
likewise and leaves out the common ``P^T``: ``(P^T E_i P q) . (P^T E_j P k) = (E_i P q) . (E_j P k)`` since P
is orthogonal, so scores, outputs and the cached keys (each rotated once, when it enters the cache: exact for
any R, which rotates by the token's own position) are those of the definition. The reference interpreter
(:mod:`pedsl.compiler.reference`) applies the whole ``P^T E P`` per token, one dense matrix exponential each.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pedsl.compiler.general.inputs import F64

# <embedded>
# ---------------------------------------------------------------------- dense rotations
class DenseGenerators(nn.Module):
    """The learned parameters of one dense rotation of ``width`` channels: ``generator`` (G, K, blocks, b, b)
    whose antisymmetric part is each block's generator (G: 1, or one per head; K: one per axis for
    ``independent``, one shared for ``shared`` and ``split``), ``scales`` (A,) the per-axis lambda_a of
    ``shared`` (ComRoPE-LD), ``basis`` (G, width, width) whose antisymmetric part S gives P = (I - S)(I + S)^-1
    (STRING). Started at N(0, init^2) (scales at 1, S at 0: P = I)."""

    def __init__(self, width: int, block: int, axes: int, mode: str, basis: bool, heads: int, init: float):
        super().__init__()
        self.block, self.axes, self.mode = block, axes, mode
        per_axis = axes if mode == "independent" else 1
        self.generator = nn.Parameter(torch.randn(heads, per_axis, width // block, block, block) * init)
        self.scales = nn.Parameter(torch.ones(axes)) if mode == "shared" else None
        self.basis = nn.Parameter(torch.zeros(heads, width, width)) if basis else None

    def generators(self) -> Tensor:
        """A_a per axis, (G, A, blocks, b, b) float64: skew-symmetric, block by block."""
        g = self.generator.to(F64)
        g = g - g.transpose(-1, -2)
        if self.scales is not None:  # shared: A_a = lambda_a A
            return g * self.scales.to(F64).view(1, -1, 1, 1, 1)
        if self.mode == "split":  # block k belongs to axis k // (blocks / A): the axes act on separate blocks
            nb = g.shape[2]
            owner = torch.arange(nb, device=g.device) // (nb // self.axes)
            mask = (owner[None, :] == torch.arange(self.axes, device=g.device)[:, None]).to(F64)  # (A, blocks)
            return g * mask.view(1, self.axes, nb, 1, 1)
        return g

    def rotations(self, positions: Tensor) -> Tensor:
        """expm(sum_a p_a A_a) per token and block: ``positions`` (B, L, A) -> (B, G, L, blocks, b, b) float64."""
        gen = self.generators()
        G, A, nb, b, _ = gen.shape
        arg = positions.to(F64).reshape(-1, A) @ gen.permute(1, 0, 2, 3, 4).reshape(A, -1)  # (B L, G nb b b)
        B, L = positions.shape[0], positions.shape[1]
        arg = arg.view(B, L, G, nb, b, b).transpose(1, 2).contiguous()  # matrix_exp of 2 x 2 blocks views its input
        return torch.linalg.matrix_exp(arg)

    def basis_matrix(self) -> Tensor | None:
        """P = (I - S)(I + S)^-1 (Cayley: orthogonal for any skew-symmetric S), (G, width, width) float64."""
        if self.basis is None:
            return None
        s = self.basis.to(F64)
        s = s - s.transpose(-1, -2)
        eye = torch.eye(s.shape[-1], dtype=F64, device=s.device)
        # X (I + S) = I - S (I + S is invertible: S has imaginary eigenvalues)
        return torch.linalg.solve(eye + s, eye - s, left=False)


def dense_positions(lay, axes: int) -> Tensor:
    """The positions a dense rotation reads, (B, L, A): each axis's (a one-axis call: the positions on every axis)."""
    if lay.axes_pos is not None:
        return lay.axes_pos
    return lay.positions.unsqueeze(-1).expand(*lay.positions.shape, axes)


def dense_rotate(x: Tensor, rot: Tensor, basis: Tensor | None, channels) -> Tensor:
    """x (B, H, L, D) with its ``channels`` (None: all) rotated by ``basis`` (G, n, n) and then the blocks
    ``rot`` (B, G, L, blocks, b, b) of each token (G = 1 or H); computed in float64, rounded once."""
    dt = x.dtype
    xg = (x if channels is None else x[..., list(channels)]).to(F64)
    if basis is not None:
        xg = xg @ basis.transpose(-1, -2).unsqueeze(0)  # P x of every token: (B, H, L, n) @ (1, G, n, n)
    B, H, L, n = xg.shape
    nb, b = rot.shape[-3], rot.shape[-1]
    y = (rot @ xg.reshape(B, H, L, nb, b, 1)).reshape(B, H, L, n).to(dt)
    if channels is None:
        return y
    return x.index_copy(-1, torch.tensor(list(channels), device=x.device), y)
# </embedded>

