"""The Lark grammar (``grammars/pe.lark``), built once into an LALR parser with positions kept."""

from __future__ import annotations

import functools
import hashlib
import os
from importlib import resources
from pathlib import Path

import lark
from lark import Lark

from pedsl.envswitch import switch


def grammar_path() -> Path:
    """The shipped grammar: inside the installed package, or the source tree's grammars/."""
    try:
        packaged = resources.files("pedsl") / "grammars" / "pe.lark"
        if packaged.is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, FileNotFoundError):  # pragma: no cover - defensive
        pass
    return Path(__file__).resolve().parents[2] / "grammars" / "pe.lark"


def _cache_file(grammar: str) -> str | None:
    """Where to cache the built LALR tables (saves ~0.2 s per run), or None not to cache.

    Lark's cache is a pickle, so it lives only in a folder that this user owns and nobody
    else can write to (never the shared temp folder); PEDSL_NO_CACHE=1 turns it off.
    """
    if switch("PEDSL_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "pedsl")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            return None
    except OSError:
        return None
    digest = hashlib.sha256(grammar.encode()).hexdigest()[:16]
    return os.path.join(folder, f"grammar-{lark.__version__}-{digest}.lark")


@functools.lru_cache(maxsize=1)
def lark_parser() -> Lark:
    grammar = grammar_path().read_text(encoding="utf-8")
    options = dict(parser="lalr", propagate_positions=True, maybe_placeholders=False)
    cache = _cache_file(grammar)
    if cache is not None:
        try:
            return Lark(grammar, cache=cache, **options)
        except Exception:  # noqa: BLE001 - a broken cache must never break parsing
            pass
    return Lark(grammar, **options)
