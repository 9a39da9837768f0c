"""Sliding-window attention on a C++ CPU kernel (``band_kernel.cpp`` next to this file), built once on
first use with ``torch.utils.cpp_extension`` into torch's extensions folder (``~/.cache/torch_extensions``
or ``TORCH_EXTENSIONS_DIR``; 11-15 s with g++ on two cores, once per source, compiler flags and CPU),
with the flash-kernel path of :mod:`pedsl.compiler.window_kernels` wherever it cannot run (no compiler
or ninja, or a torch whose libtorch_cpu exports no ``sgemm_``, the BLAS GEMM the kernel calls: the x86
Linux wheels carry MKL's).

Why a kernel of its own: the flash CPU kernel skips only whole tiles of 512 keys, so the banded calls of
``window_kernels`` compute 767 keys per query for the 512 a window of 512 shows. Here each block of 64
queries is two GEMMs forward and five backward over the one contiguous run of keys the block can see
(``64 + N - 1`` keys: the window plus two masked triangles), with an exact one-pass softmax (the block
holds whole rows) and the flash identity backward (``dS = P (dP - rowsum(dO O))`` with ``P`` recomputed
from the log-sum-exp). Grouped key/value heads are read in place (no repeat). What a call holds beyond its
inputs and gradients: the output and log-sum-exp, and one block's scores per thread (two in the
backward), ``64 x (64 + N - 1)`` each. At L = 8192, N = 512 (float32, one thread) it costs about 0.6x the flash path.

The general forward (:mod:`pedsl.compiler.general`) imports :func:`banded_attention` from here; a module
written by ``pedsl compile`` carries ``window_kernels``' own ``banded_attention`` instead (torch only,
no build step), so it runs the flash path. ``PEDSL_BAND_KERNEL=0`` keeps the flash path in process too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pedsl.compiler import window_kernels

SOURCE = Path(__file__).with_name("band_kernel.cpp")
BLOCK = 64  # queries per block (each block reads at most BLOCK + N - 1 keys); 32-128 measure alike
KERNEL_DTYPES = (torch.float32, torch.float64)
CFLAGS = ("-O3", "-march=native", "-fopenmp")  # OpenMP: at::parallel_for over torch's own libgomp
SWITCH = "PEDSL_BAND_KERNEL"  # "0": never build or use the C++ kernel

log = logging.getLogger(__name__)
_ops: list = []  # [torch.ops.pedsl_band or None] once the first call has tried to build it
_lock = threading.Lock()


def band_ops():
    """``torch.ops.pedsl_band`` (``forward``, ``backward``), built and loaded on the first call; None where
    it cannot be (no C++ compiler or ninja, a failed build or load, ``PEDSL_BAND_KERNEL=0``): the
    callers then take the flash path, with a debug-level log line saying why."""
    with _lock:
        if not _ops:
            _ops.append(_build())
        return _ops[0]


def extension_name() -> str:
    """The build's folder name: one per source file (its path and text), flags, torch and CPU. Two
    checkouts never rebuild each other's (ninja rebuilds when a source path changes), and ``-march=native``
    code is the CPU's own, so a home folder shared by different machines keeps one build per kind of CPU."""
    key = "\n".join([str(SOURCE.resolve()), SOURCE.read_text(encoding="utf-8"), " ".join(CFLAGS), torch.__version__,
                     cpu_identity()])
    return "pedsl_band_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux), or what ``platform`` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build():
    if os.environ.get(SWITCH, "1") == "0":
        log.debug("%s=0: the sliding-window kernel takes the flash path", SWITCH)
        return None
    try:
        # imported here, not at the top: it brings setuptools (about 0.1 s) that only a first windowed call needs
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        log.info("loading the C++ sliding-window kernel (built once per machine on first use: 10-15 s)")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # compiler-version notes: a failure is logged below, never printed
            load(name=extension_name(), sources=[str(SOURCE)], extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                 is_python_module=False, verbose=False)
        return torch.ops.pedsl_band
    except Exception as err:  # noqa: BLE001 - any failure to build or load means the flash path, never an error
        log.debug("the C++ sliding-window kernel is not available, using the flash path: %s", err)
        return None


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH: where none is there (a virtual environment's python called
    without activating it), the ninja package's binary joins the end of this process's PATH."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), ninja.BIN_DIR]))


class BandAttention(torch.autograd.Function):
    """Sliding-window causal attention of ``q (B, Hq, L, D)`` over ``k, v (B, Hk, L, D)`` (Hq a multiple of
    Hk) at positions 0..L-1, default scale, on the C++ kernel (float32 or float64, CPU)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse = band_ops().forward(q, k, v, window, BLOCK)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.window = window
        return out

    @staticmethod
    @once_differentiable  # the kernel's backward has no backward of its own
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = band_ops().backward(dout.contiguous(), q, k, v, out, lse, ctx.window, BLOCK)
        return dq, dk, dv, None


def runs_on_kernel(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the C++ kernel takes these inputs: CPU tensors of one of its dtypes, and it is built."""
    same = q.dtype == k.dtype == v.dtype and q.device.type == k.device.type == v.device.type == "cpu"
    return same and q.dtype in KERNEL_DTYPES and band_ops() is not None


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """:func:`pedsl.compiler.window_kernels.sliding_window_attention` (same arguments, grouped key/value
    heads allowed) on the C++ kernel where it runs, on the flash path elsewhere."""
    if window < q.shape[2] and runs_on_kernel(q, k, v):
        return BandAttention.apply(q, k, v, window)
    return window_kernels.banded_attention(q, k, v, window, None)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, chunk: int | None) -> Tensor:
    """:func:`pedsl.compiler.window_kernels.banded_attention`, with a sliding window on the C++ kernel
    where it runs (chunks keep their one ``is_causal`` call)."""
    if window is not None:
        return sliding_window_attention(q, k, v, window)
    return window_kernels.banded_attention(q, k, v, window, chunk)
