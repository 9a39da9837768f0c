"""The child process that builds pedsl's C++ CPU kernels (started by :func:`pedsl.ops.kernel_cache.run_build`
with one JSON argument: folder, name, key, sources, flags, ops): torch's builder compiles and links the library
in the folder, loads it here, every op the callers need is looked up, and only then the stamp is written. A
library that crashes when loaded ends this process, not pedsl's. Exit 0 on success; 1 with the error on stdout.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


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


def build(spec: dict) -> None:
    from torch.utils.cpp_extension import load

    from pedsl.ops.kernel_cache import write_stamp

    folder = Path(spec["folder"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compiler-version notes; an error is raised, and reported by the caller
        load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cflags"],
             extra_ldflags=spec["ldflags"], build_directory=str(folder), is_python_module=False, verbose=False)
    missing = missing_ops(spec["ops"])
    if missing:
        raise RuntimeError(f"the library loaded but does not register {', '.join(missing)}")
    write_stamp(folder, spec["key"], spec["name"])


def main(argv: list[str]) -> int:
    from pedsl.strictparse import load_json

    try:
        build(load_json(argv[0]))
    except Exception as err:  # noqa: BLE001 - every failure is reported to the parent, which falls back
        print(f"{type(err).__name__}: {err}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
