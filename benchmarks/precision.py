"""bfloat16 / float16 accuracy of every library scheme and backend at L = 2048, against float64.

    python -m benchmarks.precision [SCHEME...] [--length 2048] [--flex] [--md FILE]

For each scheme of the library (``pedsl.lang.library.library_names()``), each backend that accepts
it and each half dtype, the error is ``max |o - o64|`` over the output, where ``o64`` is the module
in float64 on the float64 inputs. The module's learned weights are rounded to the half dtype on
both sides, so only the computation differs. Two numbers per row:

* ``pedsl``: the compiled module in the half dtype on the inputs rounded to it;
* ``baseline``: a careful hand-written layer at the same precision. For every scheme with an
  orthogonal pre-transform (RoPE family, accumulated rotations, ALiBi, forget gates): the
  transforms of the rounded inputs computed exactly (float64: rotated q, k, v, the temperature, the
  bias b(i, j)), each rounded once to the half dtype, then SDPA in that dtype with the bias as an
  additive float mask, and the value transport undone in float64. This is at least as accurate as
  the usual code (Hugging Face rotates with cos/sin already rounded to the half dtype). PaTH has
  no pre-transform: its baseline is the float64 computation on the rounded inputs, with only the
  output rounded - the error every half-precision input/output implementation carries.

``compiler_tests/compiler/test_compiler_low_precision.py`` asserts ``pedsl <= 2 x baseline`` for every row
(with the same shapes); this script prints the table quoted in benchmarks/README.md. The reference
backend is the float64 interpreter (half inputs are upcast): at L = 2048 its explicit (i, j)
transports do not fit in memory, and it is exact by construction. Flex compiles on CPU (slow):
``--flex`` adds it.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from pedsl.compiler import compile_scheme
from pedsl.compiler.plan import HOUSEHOLDER
from pedsl.errors import CompileError
from pedsl.lang.library import library_names, scheme_file

HALF = (torch.bfloat16, torch.float16)
BACKENDS = ("sdpa", "masked", "blockwise")  # + "flex" (compiled) on request
SHAPE = dict(batch=1, heads=2, head_dim=32, d_model=64)


def _rnd(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _modules(name: str, backends, dtypes, shape) -> dict:
    """The float64 module and, per (backend, dtype), the module that backend runs in that dtype."""
    kw = dict(num_heads=shape["heads"], head_dim=shape["head_dim"], d_model=shape["d_model"])
    torch.manual_seed(0)  # the learned weights' initialisation: the same whatever ran before
    m64 = compile_scheme(scheme_file(name), **kw).double()
    mods = {}
    for backend in backends:
        for dt in dtypes:
            try:
                m = compile_scheme(scheme_file(name), backend=backend, requires_grad=backend != "flex", **kw)
            except CompileError:  # the backend cannot run this scheme (PaTH on sdpa/masked, ...)
                break
            mods[backend, dt] = m.to(dt)
    return m64, mods


def _baseline(m64, q, k, v, x, tok, dt) -> torch.Tensor:
    """The hand-written layer at precision ``dt`` (see the module docstring), in float64 for comparison."""
    up = lambda t: None if t is None else t.to(dt).double()  # noqa: E731
    # PaTH and remapped positions have no fused form: the float64 module on the rounded inputs, rounded once
    if any(t.kind == HOUSEHOLDER for t in m64.transforms) or m64.plan.remap is not None:
        return m64(up(q), up(k), up(v), x=up(x), tokens=tok).to(dt).double()
    L = q.shape[2]
    qt, kt, vt, restore = m64.transform_qkv(up(q), up(k), up(v), up(x), tok)
    tau = m64.query_scale(L, None)
    if tau is not None:
        qt = qt * tau.unsqueeze(-1)
    bias = m64.bias_table(L, up(x), tok, None)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    mask = (bias if bias is not None else torch.zeros(1, 1, L, L, dtype=torch.float64)).to(dt)
    o = F.scaled_dot_product_attention(qt.to(dt), kt.to(dt), vt.to(dt),
                                       attn_mask=mask.masked_fill(~causal, float("-inf")))
    return restore(o.double()).to(dt).double()  # undone exactly, the output rounded once


def measure(name: str, *, length: int = 2048, backends=BACKENDS, dtypes=HALF, shape=None) -> list[dict]:
    """Rows {scheme, backend, dtype, pedsl, baseline, seconds} for one scheme (every backend that accepts it)."""
    shape = {**SHAPE, **(shape or {})}
    B, H, D, L = shape["batch"], shape["heads"], shape["head_dim"], length
    m64, mods = _modules(name, backends, dtypes, shape)
    q, k, v = (_rnd(B, H, L, D, seed=s) for s in range(3))
    x = _rnd(B, L, shape["d_model"], seed=3) if m64.needs_x else None
    tok = torch.randint(0, 256, (B, L), generator=torch.Generator().manual_seed(4)) if m64.needs_tokens else None
    rows = []
    with torch.no_grad():
        for dt in dtypes:
            half = {key: val.to(dt) for key, val in m64.state_dict().items()}
            m64.load_state_dict({key: val.double() for key, val in half.items()})
            exact = m64(q, k, v, x=x, tokens=tok)
            b = _baseline(m64, q, k, v, x, tok, dt) - exact
            base, base_rms = b.abs().max().item(), b.pow(2).mean().sqrt().item()
            r = lambda t: None if t is None else t.to(dt)  # noqa: E731
            for (backend, mdt), m in mods.items():
                if mdt != dt:
                    continue
                m.load_state_dict(half)
                t0 = time.perf_counter()
                out = m(r(q), r(k), r(v), x=r(x), tokens=tok)
                sec = time.perf_counter() - t0
                assert out.dtype == dt, (name, backend, out.dtype)
                e = out.double() - exact
                rows.append(dict(scheme=name, backend=backend, dtype=str(dt).split(".")[-1],
                                 pedsl=e.abs().max().item(), baseline=base, pedsl_rms=e.pow(2).mean().sqrt().item(),
                                 baseline_rms=base_rms, seconds=sec))
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per (scheme, backend), bfloat16 and float16 side by side."""
    by = {}
    for r in rows:
        by.setdefault((r["scheme"], r["backend"]), {})[r["dtype"]] = r
    out = ["| scheme | backend | bf16 pedsl | bf16 baseline | ratio | fp16 pedsl | fp16 baseline | ratio |",
           "|---|---|---|---|---|---|---|---|"]
    for (scheme, backend), d in by.items():
        cells = []
        for dt in ("bfloat16", "float16"):
            r = d.get(dt)
            cells += (["-"] * 3 if r is None else
                      [f"{r['pedsl']:.2e}", f"{r['baseline']:.2e}", f"{r['pedsl'] / r['baseline']:.2f}"])
        out.append(f"| {scheme} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """Markdown: one line per scheme, the worst backend's error and ratio per dtype."""
    by = {}
    for r in rows:
        by.setdefault(r["scheme"], []).append(r)
    out = ["| scheme | backends | bf16 pedsl | bf16 baseline | worst ratio | fp16 pedsl | fp16 baseline | worst ratio |",
           "|---|---|---|---|---|---|---|---|"]
    for scheme, rs in by.items():
        cells = []
        for dt in ("bfloat16", "float16"):
            d = [r for r in rs if r["dtype"] == dt]
            worst = max(d, key=lambda r: r["pedsl"] / r["baseline"])
            lo, hi = min(r["pedsl"] for r in d), max(r["pedsl"] for r in d)
            errs = f"{hi:.2e}" if f"{lo:.2e}" == f"{hi:.2e}" else f"{lo:.2e} - {hi:.2e}"
            cells += [errs, f"{worst['baseline']:.2e}", f"{worst['pedsl'] / worst['baseline']:.2f}"]
        names = ", ".join(dict.fromkeys(r["backend"] for r in rs))
        out.append(f"| {scheme} | {names} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__.split("\n")[0])
    ap.add_argument("schemes", nargs="*", help="library scheme names (default: the whole library)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--flex", action="store_true", help="also the flex backend (compiles: slow on CPU)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--md", help="also write the table to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    backends = BACKENDS + (("flex",) if a.flex else ())
    rows = []
    t0 = time.perf_counter()
    for name in a.schemes or library_names():
        rows += measure(name, length=a.length, backends=backends)
    text = summary(rows) + "\n\nPer backend:\n\n" + table(rows)
    print(text)
    worst = max(rows, key=lambda r: r["pedsl"] / r["baseline"])
    print(f"\nworst ratio {worst['pedsl'] / worst['baseline']:.2f} ({worst['scheme']}, {worst['backend']}, "
          f"{worst['dtype']}); {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    if a.md:
        from pedsl import fsio

        fsio.atomic_write_text(a.md, text + "\n")


if __name__ == "__main__":
    main()
