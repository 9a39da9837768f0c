"""What a module written by ``pedsl compile`` supplies in place of pedsl where it carries the C++ kernels' loader
(:mod:`pedsl.ops.cpu_kernels`, :mod:`pedsl.ops.kernel_cache`, :mod:`pedsl.ops.kernel_build`): the five names
``cpu_kernels`` defines or imports above its marked section (the C++ files' text, where the build compiles them,
the child process that builds, the on/off switch, the level of the log line that says the torch paths run), and the three file and JSON helpers ``kernel_cache`` imports from
pedsl. A generated module runs without pedsl installed, so these stand on the standard library.

Kept as a real module so it is linted and importable; codegen copies its marked section verbatim, and writes
``KERNEL_SOURCES`` (the C++ files by name) into the module.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

KERNEL_SOURCES: dict[str, str] = {}  # a generated module's own: the C++ files' text by file name

# <embedded>
# ---------------------------------------------------------------------------------------------
# The C++ kernels' loader without pedsl: the files it builds, its build process, its switch.
# ---------------------------------------------------------------------------------------------
FALLBACK_LOG_LEVEL = logging.WARNING  # no `pedsl kernels` beside a generated module: its log says why
_SWITCH_ON, _SWITCH_OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
_BUILDER = ("import importlib.util as u, sys; s = u.spec_from_file_location('pedsl_kernel_builder', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); sys.exit(m.builder_main(sys.argv[2:]))")


def switch(name):
    """Whether the on/off environment variable ``name`` (PEDSL_CPU_KERNELS: on unless set off) is on, read as
    pedsl reads it; any other value is refused."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return True
    if text.isdigit() and int(text) in (0, 1):
        return bool(int(text))
    if text in _SWITCH_ON or text in _SWITCH_OFF:
        return text in _SWITCH_ON
    raise ValueError(f"environment variable {name}={os.environ[name]!r} is neither on nor off: set it to 1, true, "
                     "on or yes, or to 0, false, off or no (any case), or unset it")


def kernel_texts():
    """The C++ sources and headers this module carries, by file name."""
    return KERNEL_SOURCES


def source_paths(folder):
    """The carried C++ files, written into ``folder/src`` (the build folder, under its builder lock)."""
    src = Path(folder) / "src"
    src.mkdir(exist_ok=True)
    for name, text in KERNEL_SOURCES.items():
        if not (src / name).is_file() or read_text(src / name) != text:
            atomic_write_text(src / name, text)
    return [src / name for name in sorted(KERNEL_SOURCES) if name.endswith(".cpp")]


def builder_command():
    """The child process that builds: a Python that imports this module's file and runs its ``builder_main``;
    None where the module was not loaded from a file."""
    path = globals().get("__file__")
    if not path or not os.path.isfile(path):
        return None
    return [sys.executable, "-c", _BUILDER, os.path.abspath(path)], dict(os.environ)


def atomic_write_text(path, text):
    """Write ``text`` to ``path`` whole or not at all (a temporary file in its folder, then a rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_text(path, limit=None):
    """A regular file's text (no symbolic link), at most ``limit`` bytes of it."""
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | getattr(os, "O_NOFOLLOW", 0))) as f:
        return f.read(-1 if limit is None else limit).decode("utf-8")


def load_json(text):
    """JSON with every object's keys unique (a stamp or a build spec)."""
    def unique(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("a JSON object repeats a key")
        return dict(pairs)

    return json.loads(text, object_pairs_hook=unique)
# </embedded>
