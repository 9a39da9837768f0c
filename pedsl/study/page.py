"""One page model for every study report, and the one writer that renders it to Markdown and HTML.

A study builds a :class:`Page` (title, intro, then blocks: tables, bullet lists, notes, figures,
the "Reproduce" section) and writes ``report.md`` from :func:`markdown` and ``report.html`` from
:func:`html_page`. The HTML page is self-contained apart from the PNG files next to it; every cell
and every text is escaped, and `code` spans of the Markdown become ``<code>`` in HTML.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

STYLE = ("<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
         "line-height:1.45;color:#222}table{border-collapse:collapse;margin:.5em 0 1em}"
         "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;font-variant-numeric:tabular-nums}"
         "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
         "img{max-width:100%;border:1px solid #eee}.note{color:#555;font-size:.92em}"
         "pre{background:#f6f6f6;padding:.6em;overflow-x:auto}</style>")


def fmt(x: Any, spec: str = ".3f") -> str:
    """A number for a table cell; ``-`` for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


class Table(NamedTuple):
    """A titled table with a note under it (no note: none is written)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str | None = None


@dataclass
class Bullets:
    """A titled list; with ``always`` the heading is written even when the list is empty."""

    title: str
    items: list[str]
    always: bool = False


@dataclass
class Note:
    """A paragraph in the note style."""

    text: str


@dataclass
class Figure:
    """A plot: its PNG, optionally its SVG (linked as the vector version) and a caption (then a heading)."""

    png: str
    svg: str | None = None
    caption: str | None = None
    alt: str | None = None


@dataclass
class Figures:
    items: list[Figure]
    title: str = "Plots"


Block = Union[Table, Bullets, Note, Figures]


@dataclass
class Page:
    title: str
    intro: str
    blocks: list[Block] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # command, git, versions, date: the "Reproduce" section
    html_title: str | None = None  # the browser tab's title (default: the page title)


def figures(plots: dict[str, list[str]], captions: dict[str, str] | None = None, *, svg: bool = False) -> Figures:
    """A figure per plot (key -> its files) that has a PNG; captioned from ``captions`` (the key when absent)
    when ``captions`` is given, with the SVG linked when ``svg``."""
    items = []
    for key, files in plots.items():
        png = [f for f in files if f.endswith(".png")]
        vec = [f for f in files if f.endswith(".svg")]
        if png:
            items.append(Figure(png[0], vec[0] if (svg and vec) else None,
                                None if captions is None else captions.get(key, key), alt=key))
    return Figures(items)


def images(files: list[str]) -> Figures:
    """Every PNG of ``files``, uncaptioned."""
    return Figures([Figure(f) for f in files if f.endswith(".png")])


# ---------------------------------------------------------------------------------------------
# Markdown


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table as lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _md_block(b: Block) -> list[str]:
    if isinstance(b, Table):
        return [f"## {b.title}", "", *md_table(b.header, b.rows), ""] + ([b.note, ""] if b.note is not None else [])
    if isinstance(b, Bullets):
        if not b.items and not b.always:
            return []
        return [f"## {b.title}", ""] + [f"- {x}" for x in b.items] + [""]
    if isinstance(b, Note):
        return [b.text, ""]
    out = [f"## {b.title}", ""]
    for f in b.items:
        if f.caption is None:
            out.append(f"![{f.png}]({f.png})")
            continue
        out += [f"### {f.caption}", "", f"![{f.caption}]({f.png})", ""]
        if f.svg:
            out += [f"(vector: [{f.svg}]({f.svg}))", ""]
    if b.items and b.items[-1].caption is None:
        out.append("")
    return out


def reproduce_md(meta: dict) -> list[str]:
    """The "Reproduce" section: command, git commit, versions, date (Markdown lines)."""
    return ["## Reproduce", "", "```", meta.get("command", ""), "```", "",
            f"- git commit: {meta.get('git') or 'unknown'}",
            f"- pedsl {meta.get('pedsl')}, torch {meta.get('torch')}, python {meta.get('python')}, "
            f"{meta.get('platform')}, {meta.get('cpus')} CPUs, torch threads {meta.get('threads')}",
            f"- date: {meta.get('date')}", ""]


def markdown(page: Page) -> str:
    md = [f"# {page.title}", "", page.intro, ""]
    for b in page.blocks:
        md += _md_block(b)
    md += reproduce_md(page.meta)
    return "\n".join(md)


# ---------------------------------------------------------------------------------------------
# HTML


def inline(text: str) -> str:
    """Escaped text with the Markdown `code` spans as <code>."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table, every cell escaped."""
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def _html_block(b: Block) -> list[str]:
    e = html.escape
    if isinstance(b, Table):
        return [f"<h2>{e(b.title)}</h2>", html_table(b.header, b.rows)] + \
            ([f"<p class='note'>{inline(b.note)}</p>"] if b.note is not None else [])
    if isinstance(b, Bullets):
        if not b.items and not b.always:
            return []
        return [f"<h2>{e(b.title)}</h2><ul>"] + [f"<li>{inline(x)}</li>" for x in b.items] + ["</ul>"]
    if isinstance(b, Note):
        return [f"<p class='note'>{inline(b.text)}</p>"]
    out = [f"<h2>{e(b.title)}</h2>"]
    for f in b.items:
        caption = ""
        if f.caption is not None or f.svg:
            link = f" (<a href='{e(f.svg)}'>SVG</a>)" if f.svg else ""
            caption = f"<figcaption class='note'>{e(f.caption or '')}{link}</figcaption>"
        out.append(f"<figure><img src='{e(f.png)}' alt='{e(f.alt or f.png)}'>{caption}</figure>")
    return out


def reproduce_html(meta: dict) -> list[str]:
    """The "Reproduce" section as HTML, closing the page."""
    e = html.escape
    return ["<h2>Reproduce</h2>", f"<pre>{e(meta.get('command', ''))}</pre><ul>",
            f"<li>git commit: {e(str(meta.get('git') or 'unknown'))}</li>",
            f"<li>pedsl {e(str(meta.get('pedsl')))}, torch {e(str(meta.get('torch')))}, python "
            f"{e(str(meta.get('python')))}, {e(str(meta.get('platform')))}, {e(str(meta.get('cpus')))} CPUs, "
            f"torch threads {e(str(meta.get('threads')))}</li>",
            f"<li>date: {e(str(meta.get('date')))}</li></ul></body></html>"]


def html_page(page: Page) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
             f"<title>{e(page.html_title or page.title)}</title>", STYLE + "</head><body>",
             f"<h1>{e(page.title)}</h1>", f"<p>{inline(page.intro)}</p>"]
    for b in page.blocks:
        parts += _html_block(b)
    parts += reproduce_html(page.meta)
    return "\n".join(parts)


__all__ = ["Bullets", "Figure", "Figures", "Note", "Page", "STYLE", "Table", "figures", "fmt", "html_page",
           "html_table", "images", "markdown", "md_table"]
