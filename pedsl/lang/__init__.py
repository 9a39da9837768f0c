"""The `.pe` language front end: grammar, syntax IR, checker, resolved IR, formatter."""

from pedsl.lang.api import check, format, load, parse  # noqa: F401
from pedsl.lang.scheme import Scheme  # noqa: F401

__all__ = ["check", "format", "load", "parse", "Scheme"]
