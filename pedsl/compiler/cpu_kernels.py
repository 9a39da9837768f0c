"""pedsl's C++ CPU attention kernels, one extension built once on first use with ``torch.utils.cpp_extension``
into torch's extensions folder (``~/.cache/torch_extensions`` or ``TORCH_EXTENSIONS_DIR``; 20-60 s with g++ on
two cores, once per source, compiler flags and CPU): the sliding-window kernel ``band_kernel.cpp``
(``torch.ops.pedsl_band``, :mod:`pedsl.compiler.band_kernel`) and FIRE's MLP-bias kernel ``mlp_kernel.cpp``
(``torch.ops.pedsl_mlp``, :mod:`pedsl.compiler.mlp_kernel`), with what they share in ``cpu_kernels.h`` (BLAS's
GEMM, at::vec's softmax row). Where the extension cannot be built (no compiler or ninja, or a torch whose
libtorch_cpu exports no ``sgemm_``, the BLAS GEMM the kernels call: the x86 Linux wheels carry MKL's) or
``PEDSL_CPU_KERNELS=0``, :func:`kernel_ops` answers None and the callers take their torch paths.
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

HERE = Path(__file__).parent
SOURCES = (HERE / "band_kernel.cpp", HERE / "mlp_kernel.cpp")
HEADERS = (HERE / "cpu_kernels.h",)
CFLAGS = ("-O3", "-march=native", "-fopenmp")  # OpenMP: at::parallel_for over torch's own libgomp
SWITCH = "PEDSL_CPU_KERNELS"  # "0": never build or use the C++ kernels

log = logging.getLogger(__name__)
_built: list = []  # [True or False] once the first call has tried to build the extension
_lock = threading.Lock()


def kernel_ops(namespace: str):
    """``torch.ops.<namespace>`` of the extension (``pedsl_band``, ``pedsl_mlp``), built and loaded on the first
    call; None where it cannot be (no C++ compiler or ninja, a failed build or load, ``PEDSL_CPU_KERNELS=0``):
    the callers then take their torch paths, with a debug-level log line saying why."""
    with _lock:
        if not _built:
            _built.append(_build())
    return getattr(torch.ops, namespace) if _built[0] else None


def extension_name() -> str:
    """The build's folder name: one per source files (their paths and text), flags, torch and CPU. Two
    checkouts never rebuild each other's (ninja rebuilds when a source path changes), and ``-march=native``
    code is the CPU's own, so a home folder shared by different machines keeps one build per kind of CPU."""
    files = [*SOURCES, *HEADERS]
    key = "\n".join([*(str(p.resolve()) for p in files), *(p.read_text(encoding="utf-8") for p in files),
                     " ".join(CFLAGS), torch.__version__, cpu_identity()])
    return "pedsl_kernels_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux), or what ``platform`` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build() -> bool:
    if os.environ.get(SWITCH, "1") == "0":
        log.debug("%s=0: the C++ CPU kernels are off, their callers take the torch paths", SWITCH)
        return False
    try:
        # imported here, not at the top: it brings setuptools (about 0.1 s) that only a first kernel call needs
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        log.info("loading pedsl's C++ CPU kernels (built once per machine on first use: 20-60 s)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # compiler-version notes: a failure is logged below, never printed
            load(name=extension_name(), sources=[str(p) for p in SOURCES], extra_cflags=list(CFLAGS),
                 extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        return True
    except Exception as err:  # noqa: BLE001 - any failure to build or load means the torch paths, never an error
        log.debug("pedsl's C++ CPU kernels are not available, using the torch paths: %s", err)
        return False


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH: where none is there (a virtual environment's python called
    without activating it), the ninja package's binary joins the end of this process's PATH."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), ninja.BIN_DIR]))
