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


#: Every diagnostic code pedsl reports: code -> (stage, one-line meaning). One line per code; to add
#: one, add its line here (in order), use it, and run ``python compiler_tests/lang_helpers.py`` to
#: regenerate the table in docs/language.md. ``compiler_tests/test_diagnostic_codes.py`` checks that
#: every code used in pedsl/ is here, every entry is used and documented.
CODES: dict[str, tuple[str, str]] = {
    "E000": ("pedsl", "an error without a more specific code"),
    "E100": ("parse", "a syntax error without a more specific code"),
    "E101": ("parse", "not UTF-8 text, or a control character in the text"),
    "E102": ("parse", "file too large (over 1 MB) or too long (over ~20,000 tokens)"),
    "E103": ("parse", "brackets or an expression nested too deeply"),
    "E110": ("parse", "unexpected character (also: unterminated string)"),
    "E111": ("parse", "unexpected token; says what was expected (and which keywords start a statement)"),
    "E112": ("parse", "unexpected end of file (a `}` missing?)"),
    "E113": ("parse", "a number too large for a float (`1e999`)"),
    "E200": ("check", "a checking error without a more specific code"),
    "E201": ("check", "unknown name (did you mean ...?)"),
    "E202": ("check", "unknown function, or calling something that is not a function"),
    "E203": ("check", "wrong arguments: too many, unknown keyword (did you mean ...?), missing, given twice"),
    "E204": ("check", "type or axes mismatch (the type found and the type needed)"),
    "E205": ("check", "duplicate: param/let/statement/group/scheme declared twice, a let defined in terms of "
                      "itself, a builtin name reused"),
    "E206": ("check", "`extends` an unknown scheme"),
    "E207": ("check", "`extends` cycle (or a chain longer than 64 schemes)"),
    "E208": ("check", "import cycle"),
    "E209": ("check", "missing file (an import, or the file given; also a folder), a name that is neither "
                      "a file nor a library scheme, or an import refused (outside the allowed folders, not a "
                      "`.pe` file, not a regular file, or not parseable)"),
    "E210": ("check", "a channel group does not fit `head_dim` (fraction, quarters, range, odd size)"),
    "E211": ("check", "overlapping channel groups, or an unknown group in `on`"),
    "E212": ("check", "a parameter default violates its constraint"),
    "E213": ("check", "unknown `train`/`eval` key (the keys are the fields of `pedsl.config.TrainConfig` / "
                      "`EvalConfig`)"),
    "E214": ("check", "two transports on the same channels"),
    "E215": ("check", "no scheme in the file, or no scheme of the given name"),
    "E216": ("check", "unknown warning name in `allow`"),
    "E217": ("check", "a value cannot be computed (division by zero, overflow, a grid that does not fit: "
                      "`per_pair` length, `span` faster than its period, ...)"),
    "E300": ("params", "a parameter override error without a more specific code"),
    "E301": ("params", "unknown `-P` parameter"),
    "E302": ("params", "`-P` value of the wrong type"),
    "E303": ("params", "`-P` value violates a constraint"),
    "E400": ("compile", "a valid scheme cannot be lowered as asked"),
    "E401": ("compile", "unknown backend"),
    "E402": ("compile", "the backend asked for cannot run this scheme"),
    "E403": ("compile", "FlexAttention with gradients on CPU (it has no CPU backward)"),
    "E404": ("compile", "Householder steps the blockwise kernel cannot run (several groups, or value transport)"),
    "E405": ("compile", "the scheme reads the hidden state x but no `d_model` was given"),
    "E410": ("compile", "tensors handed to a compiled module do not fit the scheme"),
    "E500": ("config", "an invalid train/eval/compare configuration (unknown or invalid setting, bad YAML)"),
    "E600": ("data", "training or evaluation data cannot be used"),
    "E700": ("checkpoint", "a checkpoint is missing, truncated, or does not match the run"),
    "E800": ("train", "training stopped (a non-finite loss, ...)"),
    "E900": ("eval", "evaluation or analysis cannot run on the given run directory"),
    "E950": ("output", "an output path cannot be written"),
    "E960": ("pedsl", "a FIFO, device or other non-regular file where a file belongs"),
    "E961": ("hf", "`pedsl import-hf`: the config has something with no exact pedsl form (`mrope_section`, "
                   "per-layer-type rope, another rotary layout, an unknown rope type or key)"),
    "E962": ("hf", "`pedsl export-hf` / `export --hf`: the scheme or model has no Hugging Face equivalent "
                   "(says which part)"),
    "E963": ("hf", "a config.json that cannot be read or lacks what its rope type needs"),
    "E964": ("hf", "`pedsl.hf.use_pedsl_attention`: a scheme or model the adapter does not run"),
    "E970": ("pedsl", "out of memory: sizes within the caps that this machine cannot hold"),
    "E980": ("pedsl", "a command needs an optional extra that is not installed (`pip install 'pedsl[lsp]'`)"),
    "E990": ("usage", "the command line is wrong (exit code 2)"),
    "E991": ("usage", "malformed `-P` (exit code 2)"),
    "E992": ("usage", "`pedsl diff -P NAME` that neither scheme declares (exit code 2)"),
    "E993": ("eval", "`pedsl diff --numeric` failed to compute the curves of a scheme"),
    "E994": ("usage", "a command-line value over its resource cap (`--threads`, `diff --numeric` sizes; exit code 2)"),
    "W101": ("lint", "frayed frequencies: a rotated pair's period exceeds the training length"),
    "W102": ("lint", "a temperature without a training length"),
    "W103": ("lint", "value transport on non-orthogonal Householder steps"),
    "W104": ("lint", "accumulated random steps without a spectral gap"),
    "W105": ("lint", "a `let` that nothing uses"),
    "W106": ("lint", "a bias term that does not depend on the distance"),
}


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


@dataclass
class DiagnosticSink:
    """Collects several diagnostics during one stage so a run can report them all."""

    file: str | None = None
    source: str | None = None
    items: list[Diagnostic] = field(default_factory=list)

    def _line(self, line: int | None) -> str | None:
        if self.source is None or line is None:
            return None
        lines = self.source.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return None

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
        src_line = None
        if source is not None and line is not None:
            lines = source.splitlines()
            src_line = lines[line - 1] if 1 <= line <= len(lines) else None
        else:
            src_line = self._line(line)
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
            ordered = sorted(
                self.items,
                key=lambda d: (d.severity != "error", d.file or "", d.line or 0, d.col or 0),
            )
            raise cls(ordered[0].message, diagnostics=ordered)
