"""What a module written by ``pedsl compile`` carries of the package: the modules whose marked sections it copies
verbatim (:data:`EMBEDDED` always; :data:`PATH_EMBEDDED` and :data:`DISTANCE_EMBEDDED` where the scheme has PaTH's
transport or distance tables; :data:`NATIVE_EMBEDDED`, the C++ kernels' loader and autograd functions, where its
plan allows a C++ kernel: :data:`NATIVE_KERNELS`), in the order they use one another, and each module's section:
the lines between its ``# <embedded>`` and ``# </embedded>`` markers. :mod:`pedsl.compiler.codegen` writes the rest
of the module (with the C++ files' text, :func:`kernel_sources`, where it carries the loader).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pedsl.compiler import plan as P
from pedsl.compiler.pysafe import text_block


#: The package modules (dotted, under ``pedsl``) every generated module carries, and those it carries where
#: its scheme has PaTH's transport or distance tables (their kernels, in the order they use one another).
EMBEDDED = ("ops.flash", "compiler.kernel_support", "compiler.scores", *(f"compiler.general.{m}" for m in (
    "masks", "remap", "inputs", "cache", "windows", "values", "dense", "transport", "bias", "relative", "attention")),
    "ops.path_decode", "compiler.general.path", "compiler.general.forward",
    "ops.window_kernels", "compiler.kernels_template")
PATH_EMBEDDED = ("ops.path_blocks", "ops.path_scan", "ops.path_window", "ops.path_kernels")
DISTANCE_EMBEDDED = ("ops.distance_bias",)
#: The C++ kernels' loader (built on first use, as in process: one shared build) and their autograd functions;
#: ``ops.path_kernel`` (PaTH's C++ rows) too where PaTH is carried.
NATIVE_EMBEDDED = ("compiler.native_template", "ops.kernel_cache", "ops.kernel_build", "ops.cpu_kernels",
                   "ops.band_kernel", "ops.mlp_kernel")
#: The plan's kernels (``Plan.kernels``) that run on the C++ extension in process.
NATIVE_KERNELS = frozenset({"band", "bias", "mlp", "path-blockwise", "path-window"})
#: The standard-library imports the loader's sections use (a generated module imports them where it carries it).
NATIVE_IMPORTS = ("errno", "fcntl", "hashlib", "json", "logging", "os", "platform", "shutil", "signal", "subprocess",
                  "sys", "tempfile", "threading", "time", "warnings")


#: The lines that open and close the section of a package module a generated module carries.
EMBED_BEGIN, EMBED_END = "# <embedded>", "# </embedded>"


def embedded_section(module: str) -> str:
    """The text of a package module (``compiler.general.forward``: dotted, under ``pedsl``) that a generated
    module carries verbatim: the lines between its ``# <embedded>`` and ``# </embedded>`` markers (the
    general forward, the banded kernels, the expression kernels, the flash kernel's handles, PaTH's and the
    distance tables' kernels). Above the section stay the module's imports, which the flat namespace of a
    generated module makes unnecessary; below it, whatever runs in process only."""
    path = Path(__file__).parent.parent.joinpath(*module.split(".")).with_suffix(".py")
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines.count(EMBED_BEGIN) != 1 or lines.count(EMBED_END) != 1 or lines.index(EMBED_BEGIN) > lines.index(EMBED_END):
        raise RuntimeError(f"{path} must hold one {EMBED_BEGIN!r} line and, after it, one {EMBED_END!r} line")
    section = lines[lines.index(EMBED_BEGIN) + 1 : lines.index(EMBED_END)]
    return "\n".join(section).rstrip() + "\n"


class Carried(NamedTuple):
    """What a generated module carries beyond :data:`EMBEDDED`."""

    path: bool  # PaTH's blockwise kernels
    distance: bool  # the Toeplitz kernel of distance tables (and the support check the C++ kernels' calls read)
    native: bool  # the C++ kernels, their loader and the C++ files

    @classmethod
    def of(cls, plan: P.Plan) -> "Carried":
        native = bool(NATIVE_KERNELS & set(plan.kernels))
        return cls(any(t.kind == P.HOUSEHOLDER for t in plan.transports),
                   native or any(b.kind == P.TABLE_BIAS for b in plan.biases), native)

    def modules(self) -> tuple[str, ...]:
        return (EMBEDDED + (PATH_EMBEDDED if self.path else ()) + (DISTANCE_EMBEDDED if self.distance else ())
                + (NATIVE_EMBEDDED + (("ops.path_kernel",) if self.path else ()) if self.native else ()))

    def imports(self) -> list[str]:
        """The module's imports beyond torch's and ``math``'s."""
        lines = [f"import {m}" for m in NATIVE_IMPORTS] if self.native else []
        if self.native:
            lines += ["from contextlib import contextmanager", "from pathlib import Path"]
        return lines

    def kernels_class(self) -> list[str]:
        """``Kernels``: TorchKernels with the carried kernels, so that a fresh sequence runs them (not the
        decode rule or blocks of queries); none (``[]``: TorchKernels itself) when nothing is carried."""
        rows = self.path and self.native  # PaTH on the C++ rows where they build
        lines = [f"    {name} = staticmethod({fn})" for name, fn, on in (
            ("path_attention", "path_forward_rows" if rows else "path_forward", self.path),
            ("path_local_attention", "path_local_forward_rows" if rows else "path_local_forward", self.path),
            ("path_transported_keys", "path_transported_keys", self.path),
            ("distance_attention", "distance_forward", self.distance),
            ("distance_supported", "distance_bias_supported", self.distance),
            ("mlp_attention", "mlp_kernel_attention", self.native),
            ("band_attention", "band_attention", self.native),
            ("bias_attention", "causal_bias_attention", self.native),
            ("bias_ready", "bias_kernel_ready", self.native)) if on]
        if not lines:
            return []
        return ["class Kernels(TorchKernels):",
                '    """TorchKernels with the kernels of the sections above, as the package runs them."""', "",
                *lines, "", ""]


def kernel_sources() -> list[str]:
    """``KERNEL_SOURCES``: the C++ files the loader builds, by name, as the package holds them."""
    from pedsl.ops.cpu_kernels import kernel_texts

    items = [f"    {name!r}: {text_block(text, '    ').lstrip()}," for name, text in sorted(kernel_texts().items())]
    return ["# The C++ kernels' files (pedsl/ops), built on first use into torch's extensions folder.",
            "KERNEL_SOURCES = {", *items, "}"]


def embedded_modules(plan: P.Plan) -> tuple[str, ...]:
    """The package modules a generated module of ``plan`` carries (:data:`EMBEDDED` and its kernels')."""
    return Carried.of(plan).modules()
