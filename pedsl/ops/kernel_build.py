"""The child process that builds pedsl's C++ CPU kernels (started by :func:`pedsl.ops.kernel_cache.run_build`
with one JSON argument: folder, name, key, sources, flags, ops): torch's builder compiles and links the library
in the folder, loads it here, every op the callers need is looked up, and only then the stamp is written. A
library that crashes when loaded ends this process, not pedsl's. Exit 0 on success; 1 with the error on stdout.

A module written by ``pedsl compile`` carries the marked section (with :mod:`pedsl.ops.kernel_cache`'s and
:mod:`pedsl.ops.cpu_kernels`'), and its child process runs that module's ``builder_main``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from pedsl.ops.kernel_cache import write_stamp
from pedsl.strictparse import load_json

# <embedded>
def missing_ops(ops: list[str]) -> list[str]:
    """The ``namespace.op`` names of ``ops`` that ``torch.ops`` does not have."""
    import torch

    missing = []
    for qualified in ops:
        namespace, op = qualified.split(".")
        try:
            getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):
            missing.append(qualified)
    return missing


def build_library(spec: dict) -> None:
    """Compile, link and load the library ``spec`` describes, check its ops, then stamp its folder."""
    from torch.utils.cpp_extension import load

    folder = Path(spec["folder"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compiler-version notes; an error is raised, and reported by the caller
        load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cflags"],
             extra_ldflags=spec["ldflags"], build_directory=str(folder), is_python_module=False, verbose=False)
    missing = missing_ops(spec["ops"])
    if missing:
        raise RuntimeError(f"the library loaded but does not register {', '.join(missing)}")
    write_stamp(folder, spec["key"], spec["name"])


def builder_main(argv: list[str]) -> int:
    """The child's entry point: ``argv[0]`` the spec as JSON; 0 when built, 1 with the error on stdout."""
    try:
        build_library(load_json(argv[0]))
    except Exception as err:  # noqa: BLE001 - every failure is reported to the parent, which falls back
        print(f"{type(err).__name__}: {err}", flush=True)
        return 1
    return 0
# </embedded>


if __name__ == "__main__":
    sys.exit(builder_main(sys.argv[1:]))
