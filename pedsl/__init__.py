"""pedsl: a declarative language and compiler for positional encodings of attention.

The public API is re-exported here lazily so that ``import pedsl`` stays cheap
(the front end never imports torch):

- :func:`load`, :func:`parse`, :func:`format` - the language front end;
- :func:`compile_scheme` - a checked scheme lowered to a torch attention module;
- :func:`diff` - typed edits between two schemes;
- :class:`PedslError` - the root of every error pedsl raises on purpose.
"""

from __future__ import annotations

from pedsl.errors import PedslError

__version__ = "0.1.0"

_LAZY = {
    "load": ("pedsl.lang.api", "load"),
    "parse": ("pedsl.lang.api", "parse"),
    "format": ("pedsl.lang.api", "format"),
    "compile_scheme": ("pedsl.compiler", "compile_scheme"),
    "diff": ("pedsl.diffing.edits", "diff"),
}

__all__ = ["PedslError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'pedsl' has no attribute {name!r}")
