"""One exception root for every stage of pedsl, and the diagnostics it renders.

Every error a user can cause is a :class:`PedslError` (or a subclass naming its
stage). It carries structured fields - ``code``, ``file``, ``line``, ``col``,
``hint`` - that tests assert on directly, and renders as a compiler-style
diagnostic::

    schemes/bad.pe:4:13: error[E201]: unknown name 'bsae'
        freqs w = geometric(bsae)
                            ^^^^
      hint: did you mean 'base'?

The CLI turns these into exit codes (1 for bad input, 2 for usage errors) and
never shows a Python traceback.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable, Sequence


MAX_MESSAGE = 4000  # characters of one diagnostic's message or hint


@dataclass(frozen=True)
class Diagnostic:
    """One finding about an input: an error or a warning, with a position."""

    code: str
    message: str
    severity: str = "error"  # "error" | "warning"
    file: str | None = None
    line: int | None = None  # 1-based
    col: int | None = None  # 1-based
    end_col: int | None = None  # exclusive, 1-based, same line
    hint: str | None = None
    source_line: str | None = None

    def __post_init__(self) -> None:
        # the last guard on a quoted value that escaped `quoted`: no diagnostic prints megabytes
        for name in ("message", "hint"):
            text = getattr(self, name)
            if isinstance(text, str) and len(text) > MAX_MESSAGE:
                object.__setattr__(self, name, f"{text[:MAX_MESSAGE]}... ({len(text):,} characters)")

    def render(self) -> str:
        where = self.file or ("<input>" if self.line is not None else "pedsl")
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        out = [f"{where}: {self.severity}[{self.code}]: {self.message}"]
        if self.source_line is not None and self.col is not None:
            text = self.source_line.rstrip("\n")
            if len(text) > 200:  # keep huge lines readable: show a window around the column
                start = max(0, self.col - 80)
                text = text[start : start + 160]
                col = self.col - start
            else:
                col = self.col
            width = max(1, (self.end_col or col + 1) - col)
            width = min(width, max(1, len(text) - col + 1))
            out.append("    " + text)
            out.append("    " + " " * (col - 1) + "^" * width)
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)

    def to_json(self) -> dict:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "end_col": self.end_col,
            "hint": self.hint,
        }


class PedslError(Exception):
    """Root of every error pedsl raises on purpose.

    ``diagnostics`` holds one or more findings; the exception message is the
    first one's message so ``str(err)`` stays useful in a REPL.
    """

    stage = "pedsl"
    default_code = "E000"
    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        end_col: int | None = None,
        hint: str | None = None,
        source_line: str | None = None,
        diagnostics: Sequence[Diagnostic] | None = None,
    ) -> None:
        if diagnostics:
            self.diagnostics = list(diagnostics)
        else:
            self.diagnostics = [
                Diagnostic(
                    code=code or self.default_code,
                    message=message,
                    file=file,
                    line=line,
                    col=col,
                    end_col=end_col,
                    hint=hint,
                    source_line=source_line,
                )
            ]
        first = self.diagnostics[0]
        super().__init__(first.message)

    # Structured fields of the first diagnostic, for tests and callers.
    @property
    def code(self) -> str:
        return self.diagnostics[0].code

    @property
    def line(self) -> int | None:
        return self.diagnostics[0].line

    @property
    def col(self) -> int | None:
        return self.diagnostics[0].col

    @property
    def file(self) -> str | None:
        return self.diagnostics[0].file

    @property
    def hint(self) -> str | None:
        return self.diagnostics[0].hint

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)


class ParseError(PedslError):
    """The text is not a well-formed `.pe` file."""

    stage = "parse"
    default_code = "E100"


class CheckError(PedslError):
    """The file parses but does not mean anything valid (names, types, layouts)."""

    stage = "check"
    default_code = "E200"


class ParamError(CheckError):
    """A parameter override is unknown, of the wrong type, or violates a constraint."""

    stage = "params"
    default_code = "E300"


class CompileError(PedslError):
    """A valid scheme cannot be lowered as asked (backend, device, shapes)."""

    stage = "compile"
    default_code = "E400"


class ShapeError(CompileError):
    """Tensors handed to a compiled module do not fit the scheme."""

    default_code = "E410"


class ConfigError(PedslError):
    """A train/eval/compare configuration is invalid."""

    stage = "config"
    default_code = "E500"
    field: str | None = None  # the setting at fault where one is (a positioned diagnostic in `pedsl check`)


class DataError(PedslError):
    """Training or evaluation data cannot be used."""

    stage = "data"
    default_code = "E600"


class CheckpointError(PedslError):
    """A checkpoint is missing, truncated, or does not match the run."""

    stage = "checkpoint"
    default_code = "E700"


class TrainError(PedslError):
    """Training stopped (non-finite loss, ...)."""

    stage = "train"
    default_code = "E800"


class EvalError(PedslError):
    """Evaluation or analysis cannot run on the given run directory."""

    stage = "eval"
    default_code = "E900"


class OutputError(PedslError):
    """An output path cannot be written."""

    stage = "output"
    default_code = "E950"


class InteropError(PedslError):
    """A Hugging Face config or rope scheme has no exact counterpart on the other side (pedsl.hf)."""

    stage = "hf"
    default_code = "E961"


class UsageError(PedslError):
    """The command line itself is wrong (exit code 2, like click)."""

    stage = "usage"
    default_code = "E990"
    exit_code = 2


QUOTE_LIMIT = 200  # characters of a user's value quoted in a diagnostic


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was: a diagnostic quotes what the
    user gave (or what a library said about it), never megabytes of it."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a diagnostic, cut by :func:`clip` (a long string, an expanded config value)."""
    return clip(repr(value), limit)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A 'did you mean' hint for a misspelled name, or None."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not matches:
        return None
    if len(matches) == 1:
        return f"did you mean '{matches[0]}'?"
    return "did you mean " + ", ".join(f"'{m}'" for m in matches[:-1]) + f" or '{matches[-1]}'?"


def source_line(source: str | None, line: int | None) -> str | None:
    """Line ``line`` (1-based) of ``source``, or None when there is no such line."""
    if source is None or line is None:
        return None
    lines = source.splitlines()
    return lines[line - 1] if 1 <= line <= len(lines) else None


def report_order(d: Diagnostic) -> tuple:
    """The order diagnostics are reported in: errors first, then by file and position."""
    return (d.severity != "error", d.file or "", d.line or 0, d.col or 0)


@dataclass
class DiagnosticSink:
    """Collects several diagnostics during one stage so a run can report them all."""

    file: str | None = None
    source: str | None = None
    items: list[Diagnostic] = field(default_factory=list)

    def add(
        self,
        code: str,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        end_col: int | None = None,
        hint: str | None = None,
        severity: str = "error",
        file: str | None = None,
        source: str | None = None,
    ) -> None:
        src_line = source_line(source if source is not None else self.source, line)
        self.items.append(
            Diagnostic(
                code=code,
                message=message,
                severity=severity,
                file=file or self.file,
                line=line,
                col=col,
                end_col=end_col,
                hint=hint,
                source_line=src_line,
            )
        )

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.items)

    def raise_if_errors(self, cls: type[PedslError] = CheckError) -> None:
        if self.has_errors:
            ordered = sorted(self.items, key=report_order)
            raise cls(ordered[0].message, diagnostics=ordered)
