"""pedsl's diagnostics as protocol diagnostics, and the quick fixes their hints offer.

A diagnostic keeps its code, message, hint and start column (``pedsl check``'s); a span that ends
on another line or names no end covers the token at its start. A diagnostic found in an imported
file is shown on the import (or ``extends``) that brings that file in, with the file's position in
words and as related information. Quick fixes: each did-you-mean candidate replaces the misspelled
name, and a lint warning can be silenced with ``allow NAME`` in its scheme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types as lsp

from pedsl.errors import Diagnostic
from pedsl.lang.builtins import WARNINGS
from pedsl.lsp.project import Analysis, resolved
from pedsl.lsp.text import Text

SOURCE = "pedsl"
_MEAN = re.compile(r"did you mean (.*)\?")
_ALLOW_NAME = {code: name for name, code in WARNINGS.items()}


@dataclass
class Finding:
    """One diagnostic of the document, placed: offsets here, and the protocol diagnostic."""

    diag: Diagnostic
    start: int
    end: int
    lsp: lsp.Diagnostic


def _token_end(text: str, start: int) -> int:
    m = re.compile(r'[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|"[^"\n]*"?|\S').match(text, start)
    return m.end() if m else min(len(text), start + 1)


def _span(analysis: Analysis, text: Text, d: Diagnostic) -> tuple[int, int]:
    if not analysis.own(d):
        return analysis.anchor_of(d)
    if d.line is None:
        return 0, _token_end(text.text, 0)
    start = text.offset_of_column(d.line, d.col or 1)
    if d.end_col is not None and d.end_col > (d.col or 1):
        return start, text.offset_of_column(d.line, d.end_col)
    return start, min(_token_end(text.text, start), text.line_end(start)) or start


def findings(analysis: Analysis, text: Text) -> list[Finding]:
    out: list[Finding] = []
    for d in analysis.diagnostics:
        start, end = _span(analysis, text, d)
        message = d.message if analysis.own(d) else f"in {d.file}:{d.line}:{d.col}: {d.message}"
        if d.hint:
            message += f"\nhint: {d.hint}"
        related = None
        where = resolved(Path(d.file)) if not analysis.own(d) and d.file and d.line else None
        if where is not None and d.line is not None:
            pos = lsp.Position(max(0, d.line - 1), max(0, (d.col or 1) - 1))
            related = [lsp.DiagnosticRelatedInformation(
                location=lsp.Location(uri=where.as_uri(), range=lsp.Range(start=pos, end=pos)), message=d.message)]
        rng = lsp.Range(start=lsp.Position(*text.position(start)), end=lsp.Position(*text.position(end)))
        severity = lsp.DiagnosticSeverity.Warning if d.severity == "warning" else lsp.DiagnosticSeverity.Error
        tags = [lsp.DiagnosticTag.Unnecessary] if d.code == "W105" else None
        out.append(Finding(d, start, end, lsp.Diagnostic(range=rng, message=message, severity=severity, code=d.code,
                                                         source=SOURCE, related_information=related, tags=tags)))
    return out


def _replacements(f: Finding, text: Text) -> list[tuple[str, int, int, str]]:
    """(title, start, end, new text) for each did-you-mean candidate of a finding's hint."""
    m = _MEAN.search(f.diag.hint or "")
    wrong = re.findall(r"'([^']+)'", f.diag.message)
    if not m or not wrong:
        return []
    name = wrong[-1]
    line_end = text.line_end(f.start)
    hit = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])").search(text.text, f.start, max(line_end, f.end))
    if hit is None:
        return []
    return [(f"Replace '{name}' with '{new}'", hit.start(), hit.end(), new) for new in re.findall(r"'([^']+)'", m[1])]


def _allow(f: Finding, analysis: Analysis) -> tuple[str, int, int, str] | None:
    name = _ALLOW_NAME.get(f.diag.code)
    scheme = analysis.doc.outline.scheme_at(f.start) if analysis.own(f.diag) else None
    if name is None or scheme is None or scheme.close is None:
        return None
    src = analysis.doc.text
    line_start = src.rfind("\n", 0, scheme.close) + 1
    if not src[line_start:scheme.close].strip():  # the closing brace on a line of its own
        return f"Silence with 'allow {name}'", line_start, line_start, f"  allow {name}\n"
    return f"Silence with 'allow {name}'", scheme.close, scheme.close, f"; allow {name} "


def code_actions(analysis: Analysis, text: Text, uri: str, start: int, end: int) -> list[lsp.CodeAction]:
    """Quick fixes for the diagnostics that touch the offsets [start, end]."""
    out = []
    for f in findings(analysis, text):
        if f.end < start or f.start > end:
            continue
        fixes = _replacements(f, text) + [x for x in [_allow(f, analysis)] if x is not None]
        for i, (title, a, b, new) in enumerate(fixes):
            rng = lsp.Range(start=lsp.Position(*text.position(a)), end=lsp.Position(*text.position(b)))
            out.append(lsp.CodeAction(title=title, kind=lsp.CodeActionKind.QuickFix, diagnostics=[f.lsp],
                                      is_preferred=i == 0 and title.startswith("Replace"),
                                      edit=lsp.WorkspaceEdit(changes={uri: [lsp.TextEdit(range=rng, new_text=new)]})))
    return out
