"""float32 accuracy of ALiBi with growing length, against float64 and against x-transformers.

    python -m benchmarks.alibi_float32 [--lengths 512,2048,4096,8192,16384] [--md FILE]

H = 8 heads of D = 32, one sequence of standard-normal q, k, v in float32. The error is
``max |o - o64|`` over the query rows ``0..127`` and the last 384 (where the key term ``m j`` is
largest), ``o64`` being ALiBi computed in float64 with the bias materialised. Columns:

* ``pedsl auto``: ``compile_scheme("alibi")`` with the auto backend (the key term in one channel /
  a broadcast row, offset per block of queries; pedsl.ops.bias);
* ``pedsl masked``: the masked backend (the bias materialised as SDPA's float mask);
* ``plain float32``: softmax(q k^T / sqrt(D) + b) with b formed in float64 and rounded to float32;
* ``x-transformers``: ``AlibiPositionalBias`` (x-transformers, installed with pedsl's test extra) for
  the bias, the attention written as x-transformers' ``Attend`` does it in float32.

Slow at 16,384 (the float64 reference alone): about a minute on one thread.
"""

from __future__ import annotations

import argparse
import time

import torch
from x_transformers.x_transformers import AlibiPositionalBias  # the peer; pedsl's test extra installs it

from pedsl import fsio
from pedsl.compiler import compile_scheme
from pedsl.lang.library import scheme_file
from pedsl.ops.alibi import alibi_slopes

H, D = 8, 32


def _rows(L: int) -> list[int]:
    return sorted(set(range(min(L, 128))) | set(range(max(0, L - 384), L)))


def _attend(q, k, v, bias, rows):
    """softmax(q k^T / sqrt(D) + bias) v for the query rows, in the dtype of the inputs; causal."""
    i, j = torch.tensor(rows), torch.arange(k.shape[-2])
    s = (q[:, :, rows] @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5) + bias
    return torch.softmax(s.masked_fill(j > i[:, None], float("-inf")), -1) @ v


def errors(L: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, H, L, D, generator=g) for _ in range(3))
    rows = _rows(L)
    i, j = torch.tensor(rows, dtype=torch.float64), torch.arange(L, dtype=torch.float64)
    b64 = -alibi_slopes(H).double()[:, None, None] * (i[:, None] - j[None, :]).abs()  # (H, rows, L)
    exact = _attend(q.double(), k.double(), v.double(), b64, rows)
    out = {}
    with torch.no_grad():
        for backend in ("auto", "masked") if L <= 8192 else ("auto",):  # masked: an (H, L, L) mask
            mod = compile_scheme(scheme_file("alibi"), backend=backend, num_heads=H, head_dim=D, requires_grad=False)
            out[f"pedsl {backend}"] = (mod(q, k, v)[:, :, rows].double() - exact).abs().max().item()
        out["plain float32"] = (_attend(q, k, v, b64.float(), rows).double() - exact).abs().max().item()
        xb = AlibiPositionalBias(heads=H, total_heads=H).forward_custom_pos(torch.tensor(rows), torch.arange(L))
        out["x-transformers"] = (_attend(q, k, v, xb.float(), rows).double() - exact).abs().max().item()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,2048,4096,8192,16384")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--md", default=None, help="also write the table to this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    lines = ["| L | pedsl auto | pedsl masked | plain float32 | x-transformers | auto / plain |", "|---|---|---|---|---|---|"]
    for L in (int(x) for x in args.lengths.split(",")):
        e = errors(L)
        lines.append(f"| {L} | " + " | ".join(f"{e[c]:.2e}" if c in e else "-" for c in ("pedsl auto", "pedsl masked", "plain float32",
                                                                     "x-transformers"))
                     + f" | {e['pedsl auto'] / e['plain float32']:.2f} |")
        print(lines[-1], flush=True)
    lines.append(f"\nmax |o - o64| over {len(_rows(4096))} query rows, H = {H}, D = {D}, float32; "
                 f"{time.perf_counter() - t0:.0f} s, torch {torch.__version__}")
    print("\n".join(lines))
    if args.md:
        fsio.atomic_write_text(args.md, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
