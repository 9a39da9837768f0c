"""Where PaTH attention's time goes: its two parts forward and backward, next to causal SDPA (the floor).

    python -m benchmarks.path_breakdown [--length 2048] [--repeats 5] [--torch-rows]

B=4, H=8, D=64, float32, one thread, process CPU time, median over repeats; every repeat runs the floor, the
parts one by one and the whole path_attention, in one process. The parts (:mod:`pedsl.ops.path`'s docstring):

* ``blocks``: the per-block UT/WY quantities (:func:`pedsl.ops.path_blocks.path_blocks`: the UT transform's
  inverse, queries moved to the start of their block, keys to its end, the intra-block scores, each block's
  product), forward and its hand-written backward;
* ``scan``: the blockwise scan (:func:`pedsl.ops.path_scan.path_scan`: the superblocks' keys and products, the
  online softmax over every pair of blocks with the moved queries, the final attention), forward and backward.

``whole`` adds what neither part does (the block-major copies in and out, the scaling of q). ``--torch-rows``:
the parts on :class:`pedsl.ops.path_blocks.PathTorchRows` (the torch loops generated modules run; ``whole`` is
the package's call either way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from pedsl.ops.path import path_attention
from pedsl.ops.path_blocks import PathTorchRows, path_blocks
from pedsl.ops.path_kernel import path_rows
from pedsl.ops.path_kernels import _blocks, scaled_q
from pedsl.ops.path_scan import path_scan


def _timed(fn):
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def one_round(args, rows, C=64):
    q, k, v, w, beta = args
    res = {}
    for a in args:
        a.grad = None
    res["floor fwd"], o = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    res["floor bwd"], _ = _timed(lambda: o.backward(torch.ones_like(o)))
    Q, K, V, W = (_blocks(t, C) for t in (scaled_q(q, None, None), k, v, w))
    res["blocks fwd"], outs = _timed(lambda: path_blocks(Q, K, W, _blocks(beta, C), rows))
    leaves = [t.detach().requires_grad_() for t in outs]
    res["scan fwd"], O = _timed(lambda: path_scan(leaves[0], leaves[1], V, leaves[3], leaves[2], rows=rows))
    res["scan bwd"], _ = _timed(lambda: O.backward(torch.ones_like(O)))
    grads = [leaves[0].grad, leaves[1].grad, leaves[2].grad, leaves[3].grad]
    res["blocks bwd"], _ = _timed(lambda: torch.autograd.backward(outs, grads))
    for a in args:
        a.grad = None
    res["whole fwd"], o = _timed(lambda: path_attention(*args))
    res["whole bwd"], _ = _timed(lambda: o.backward(torch.ones_like(o)))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-rows", action="store_true", help="the parts on the torch loops")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    B, H, L, D = 4, 8, a.length, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, H, L, generator=g))
    args = [t.requires_grad_() for t in (q, k, v, w, beta)]
    rows = PathTorchRows if a.torch_rows else path_rows(q)
    one_round(args, rows)
    rounds = [one_round(args, rows) for _ in range(a.repeats)]
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    floor = med["floor fwd"] + med["floor bwd"]
    print(f"L={L} B={B} H={H} D={D} float32, 1 thread, {a.repeats} repeats, row steps {getattr(rows, '__name__', type(rows).__name__)}, "
          f"load {os.getloadavg()[0]:.1f}")
    for key, t in med.items():
        print(f"  {key:11s} {t * 1e3:7.0f} ms   x{t / floor:.2f} of the floor's fwd+bwd")
    print(f"  whole fwd+bwd / floor fwd+bwd: x{(med['whole fwd'] + med['whole bwd']) / floor:.2f}")


if __name__ == "__main__":
    main()
