"""Positions in a document: code-point offsets inside pedsl, the client's columns at the protocol.

pedsl's diagnostics count columns in characters (code points); the protocol counts them in the
encoding the client and server agreed on (UTF-16 by default). :class:`Text` converts both ways and
clamps whatever it is given into the document, so a stale or out-of-range position never raises.
"""

from __future__ import annotations

import bisect

UNITS = {"utf-8": lambda c: len(c.encode("utf-8", "surrogatepass")),
         "utf-16": lambda c: 2 if ord(c) > 0xFFFF else 1,
         "utf-32": lambda c: 1}


class Text:
    """One document's text with its line starts; ``encoding`` is the protocol's position encoding."""

    def __init__(self, text: str, encoding: str = "utf-16"):
        self.text = text
        self.units = UNITS.get(str(encoding).lower(), UNITS["utf-16"])
        self.starts = [0]
        i = text.find("\n")
        while i >= 0:  # str.find, not a loop over characters: a long document is indexed in milliseconds
            self.starts.append(i + 1)
            i = text.find("\n", i + 1)

    def line_text(self, line: int) -> str:
        """Line ``line`` (0-based) without its end of line; '' past the end."""
        if not 0 <= line < len(self.starts):
            return ""
        end = self.starts[line + 1] - 1 if line + 1 < len(self.starts) else len(self.text)
        return self.text[self.starts[line]:end].rstrip("\r")

    def offset(self, line: int, units: int) -> int:
        """The offset of a protocol position (0-based line, column in the client's units), clamped."""
        if line < 0:
            return 0
        if line >= len(self.starts):
            return len(self.text)
        row = self.line_text(line)
        if row.isascii():  # one unit a character in every encoding
            return self.starts[line] + min(max(units, 0), len(row))
        count = 0
        for i, ch in enumerate(row):
            if count >= units:
                return self.starts[line] + i
            count += self.units(ch)
        return self.starts[line] + len(row)

    def position(self, offset: int) -> tuple[int, int]:
        """(0-based line, column in the client's units) of an offset, clamped into the text."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        head = self.text[self.starts[line]:offset]
        return line, len(head) if head.isascii() else sum(self.units(c) for c in head)

    def offset_of_column(self, line: int, col: int) -> int:
        """The offset of pedsl's (1-based line, 1-based character column), clamped into the line."""
        line0 = max(0, min(line - 1, len(self.starts) - 1))
        row = self.line_text(line0)
        return self.starts[line0] + max(0, min(col - 1, len(row)))

    def line_end(self, offset: int) -> int:
        """The offset of the end of the line holding ``offset``."""
        line = bisect.bisect_right(self.starts, max(0, min(offset, len(self.text)))) - 1
        return self.starts[line] + len(self.line_text(line))
