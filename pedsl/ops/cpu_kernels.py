"""pedsl's C++ CPU attention kernels, one extension built once per machine on first use with
``torch.utils.cpp_extension`` (20-60 s with g++ on two cores): the sliding-window kernel ``band_kernel.cpp``
(``torch.ops.pedsl_band``, :mod:`pedsl.ops.band_kernel`) and FIRE's MLP-bias kernel ``mlp_kernel.cpp``
(``torch.ops.pedsl_mlp``, :mod:`pedsl.ops.mlp_kernel`), PaTH's scan ``path_kernel.cpp`` (``torch.ops.pedsl_path``,
:mod:`pedsl.ops.path_kernel`), with what they share in ``cpu_kernels.h`` (BLAS's
GEMM, at::vec's softmax row). The build lives in torch's extensions folder (``TORCH_EXTENSIONS_DIR``, else
``~/.cache/torch_extensions/py<version>_cpu``), one sub-folder per :func:`extension_name`.

A build says so at the default log level (a warning-level line before it starts and one when it ends: it
pauses the first window or FIRE call of a machine, which would otherwise look like a hang); ``pedsl kernels``
does it ahead of time. How the folder is trusted, locked and built (a verified stamp, ``flock``, a child
process under :data:`BUILD_TIMEOUT_S`) is :mod:`pedsl.ops.kernel_cache`. Where the extension cannot be
built or loaded (no compiler or ninja, a failed or timed-out build, a torch whose libtorch_cpu exports no
``sgemm_``, the BLAS GEMM the kernels call: the x86 Linux wheels carry MKL's) or ``PEDSL_CPU_KERNELS`` is off
(:mod:`pedsl.envswitch`), :func:`kernel_ops` answers None and the callers take their torch paths.

The flags are portable on purpose: no ``-march=native``, so a build's results do not depend on the CPU it
was built on, and ``-ffp-contract=off``, so no compiler fuses a multiply and an add into one rounding where
another would not. The BLAS GEMM still picks its own code path at run time.

A module written by ``pedsl compile`` carries the marked section (with those of :mod:`pedsl.ops.kernel_cache` and
:mod:`pedsl.ops.kernel_build`) and the C++ files' text, and supplies the five names above it its own way
(:mod:`pedsl.compiler.native_template`): the same key, so it loads the build pedsl made, or builds it once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

import pedsl
from pedsl.envswitch import switch
from pedsl.ops.kernel_build import missing_ops
from pedsl.ops.kernel_cache import builder_lock, clear_stale, ensure_folder, failed_before, library_path, run_build, \
    verify, write_stamp

HERE = Path(__file__).parent
SOURCES = (HERE / "band_kernel.cpp", HERE / "mlp_kernel.cpp", HERE / "path_kernel.cpp")
HEADERS = (HERE / "cpu_kernels.h",)


def kernel_texts() -> dict[str, str]:
    """The C++ sources and headers by file name (what a build compiles, and what its key hashes)."""
    return {p.name: p.read_text(encoding="utf-8") for p in (*SOURCES, *HEADERS)}


def source_paths(folder: Path) -> list[Path]:
    """The C++ files torch's builder compiles: the package's own (a generated module writes its copies into the
    build folder instead)."""
    return list(SOURCES)


def builder_command() -> tuple[list[str], dict] | None:
    """The child process that builds (:mod:`pedsl.ops.kernel_build`, importing this very pedsl) and its
    environment."""
    env = dict(os.environ)
    root = str(Path(pedsl.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return [sys.executable, "-m", "pedsl.ops.kernel_build"], env


FALLBACK_LOG_LEVEL = logging.DEBUG  # the torch paths in process: quiet (`pedsl kernels` says why)


# <embedded>
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")  # OpenMP: at::parallel_for over torch's own libgomp
LDFLAGS = ("-fopenmp",)
OPS = ("pedsl_band.forward", "pedsl_band.backward", "pedsl_mlp.forward", "pedsl_mlp.backward", "pedsl_path.scan_forward",
       "pedsl_path.scan_backward", "pedsl_path.unit_lower_inverse")
SWITCH = "PEDSL_CPU_KERNELS"  # off: never build or use the C++ kernels
BUILD_TIMEOUT_S = 300.0  # a build (20-60 s on two cores), or the wait for another process's, is stopped here
LOADER_FORMAT = "3"  # part of the key: how the folder is laid out and stamped

log = logging.getLogger(__name__)
_state: list = []  # [KernelState] once this process has tried to load the extension
_lock = threading.Lock()


class KernelState:
    """What this process found and did about the C++ kernels (``pedsl kernels`` prints it). A plain class, not a
    dataclass: a generated module carrying it may be loaded without a ``sys.modules`` entry, which dataclasses read."""

    def __init__(self, on: bool):
        self.on = on  # PEDSL_CPU_KERNELS
        self.compiler: str | None = None
        self.ninja: str | None = None
        self.folder: Path | None = None
        self.built = False  # a stamped library of this key, byte for byte, is in the folder
        self.loaded = False  # loaded into this process, every op of OPS registered
        self.build_seconds: float | None = None  # this process built it, in that many seconds
        self.reason = ""  # why it is not loaded

    def __repr__(self) -> str:
        return f"KernelState({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def kernel_ops(namespace: str):
    """``torch.ops.<namespace>`` of the extension (``pedsl_band``, ``pedsl_mlp``), built and loaded on the first
    call; None where it cannot be (see the module's docstring): the callers then take their torch paths."""
    with _lock:
        if not _state:
            _state.append(prepare())
    return getattr(torch.ops, namespace) if _state[0].loaded else None


def state() -> KernelState | None:
    """What the first :func:`kernel_ops` (or :func:`prepare`) of this process found, or None before it."""
    return _state[0] if _state else None


def prepare(*, build: bool = True, rebuild: bool = False, timeout: float | None = None) -> KernelState:
    """Find, verify and load the extension, building it first where ``build`` allows (``rebuild``: even
    where a verified or failed build is there). Never raises for a build or load that fails: the state
    says why. Also sets what :func:`kernel_ops` answers from now on."""
    st = KernelState(on=switch(SWITCH))
    if not st.on:
        st.reason = f"{SWITCH} is off"
    else:
        _ninja_on_path()
        st.compiler, st.ninja = shutil.which(os.environ.get("CXX", "c++")), shutil.which("ninja")
        st.folder = build_folder()
        _load_or_build(st, build, rebuild, BUILD_TIMEOUT_S if timeout is None else timeout)
    if st.loaded:
        log.debug("pedsl's C++ CPU kernels: loaded from %s", st.folder)
    else:  # off by the switch: at most INFO, the user asked for it
        log.log(FALLBACK_LOG_LEVEL if st.on else min(FALLBACK_LOG_LEVEL, logging.INFO),
                "pedsl's C++ CPU kernels are not used (%s): the torch paths run, same results", st.reason)
    _state[:] = [st]
    return st


def _load_or_build(st: KernelState, build: bool, rebuild: bool, timeout: float) -> None:
    assert st.folder is not None  # prepare() finds the folder first
    name, key = extension_name(), build_key()
    why = None if rebuild else verify(st.folder, name, key)
    if why is None and not rebuild:
        st.built = True
        return _load(st, name)
    if not (st.compiler and st.ninja):
        st.reason = "no C++ compiler" if not st.compiler else "no ninja (pip install ninja)"
        return
    failed = None if rebuild else failed_before(st.folder, key)
    if failed or not build:
        st.reason = f"an earlier build failed ({failed}); `pedsl kernels --rebuild` tries again" if failed \
            else f"not built ({why})"
        return
    try:
        ensure_folder(st.folder)
        with builder_lock(st.folder, timeout, _waiting) as fd:
            if fd is None:
                st.reason = f"another process was still building them after {timeout:.0f} s"
                log.warning("pedsl's CPU kernels: %s; using the torch paths this time", st.reason)
                return
            why = "--rebuild" if rebuild else verify(st.folder, name, key)
            if why is not None:  # not built by another process meanwhile
                _build(st, name, key, fd, timeout, why)
    except OSError as err:
        st.reason = f"the build folder {st.folder} cannot be used: {err.strerror or err}"
        log.warning("pedsl's CPU kernels: %s; using the torch paths", st.reason)
        return
    if verify(st.folder, name, key) is None:
        st.built = True
        _load(st, name)


def _build(st: KernelState, name: str, key: str, lock_fd: int, timeout: float, why: str) -> None:
    assert st.folder is not None  # prepare() finds the folder first
    if library_path(st.folder, name).exists() and why != "--rebuild":
        log.warning("pedsl's CPU kernels in %s are not used (%s): building them again", st.folder, why)
    clear_stale(st.folder, name, everything=why == "--rebuild")
    log.warning("building pedsl's CPU kernels, once per machine, ~30 s (in %s)", st.folder)
    start = time.monotonic()
    builder = builder_command()
    if builder is None:
        st.reason = "this module has no file a build process could import"
        log.warning("pedsl's CPU kernels: %s; using the torch paths", st.reason)
        return
    spec = {"folder": str(st.folder), "name": name, "key": key, "sources": [str(p) for p in source_paths(st.folder)],
            "cflags": list(CFLAGS), "ldflags": list(LDFLAGS), "ops": list(OPS)}
    failure = run_build(spec, lock_fd, timeout, *builder)
    seconds = time.monotonic() - start
    if failure is None:
        st.build_seconds = seconds
        log.warning("built pedsl's CPU kernels in %.0f s", seconds)
        return
    error, permanent = failure
    st.reason = f"the build failed: {error}"
    if permanent:  # a compiler or loader error comes back on every try: not retried until `pedsl kernels --rebuild`
        write_stamp(st.folder, key, name, error=error)
    log.warning("pedsl's CPU kernels did not build after %.0f s, using the torch paths: %s", seconds, error)


def _load(st: KernelState, name: str) -> None:
    """Load the verified library into this process and check that every op is there."""
    assert st.folder is not None  # prepare() finds the folder first
    try:
        torch.ops.load_library(str(library_path(st.folder, name)))
    except (OSError, RuntimeError) as err:
        st.reason = f"the library does not load: {err}"
    else:
        missing = missing_ops(list(OPS))
        st.loaded = not missing
        st.reason = f"the library does not register {', '.join(missing)}" if missing else ""
    if not st.loaded:
        log.warning("pedsl's CPU kernels: %s; using the torch paths", st.reason)


def _waiting(pid: str) -> None:
    log.warning("waiting for another process (pid %s) building pedsl's CPU kernels", pid)


def build_folder() -> Path:
    """The extension's folder: ``TORCH_EXTENSIONS_DIR`` or torch's default root (per Python version)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        from torch.utils.cpp_extension import get_default_build_root

        root = os.path.join(get_default_build_root(), f"py{sys.version_info[0]}{sys.version_info[1]}_cpu")
    return Path(root) / extension_name()


def build_key() -> str:
    """Everything a build depends on: the text of the C++ files (by name), flags, torch, the compiler and this
    loader's layout; the CPU too where the flags make code for the build machine only. Not where the files lie:
    pedsl in process and the modules ``pedsl compile`` writes (which carry the same text) share one build, and
    load one library (two would register the same ops twice)."""
    native = any("native" in flag for flag in CFLAGS)
    texts = [f"{name}\n{text}" for name, text in sorted(kernel_texts().items())]
    parts = [*texts, " ".join(CFLAGS), " ".join(LDFLAGS), torch.__version__, os.environ.get("CXX", "c++"),
             LOADER_FORMAT, cpu_identity() if native else ""]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def extension_name() -> str:
    """The build's folder (and library) name, one per :func:`build_key`."""
    return "pedsl_kernels_" + build_key()[:16]


def cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux), or what ``platform`` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH: where none is there (a virtual environment's python called
    without activating it), the ninja package's binary joins the end of this process's PATH."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), ninja.BIN_DIR]))
# </embedded>
