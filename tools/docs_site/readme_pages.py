"""The pages made from README.md: the site's front page (``docs/index.md``), and the README sections that
other pages show between ``<!-- readme:begin SECTION ... -->`` and ``<!-- readme:end -->``.

README.md links into ``docs/`` (``docs/language.md``, ``docs/img/x.png``) so that it reads on its own;
on the site the same links are relative to the page. A README link that leaves ``docs/`` would be a
broken link on the site, so it is an error here rather than a page that ``mkdocs build --strict`` refuses
later.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
INDEX_NOTE = "<!-- generated from README.md by `python -m tools.docs_site`: edit README.md, not this page -->"
# the pages that show README sections (the section's own text, under the page's headings)
SECTION_PAGES = ("getting-started.md",)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BLOCK = re.compile(r"(<!-- readme:begin (.+?) \(generated from README\.md: python -m tools\.docs_site\) -->\n)"
                    r".*?(<!-- readme:end -->)", re.S)


def relink(text: str, depth: int) -> str:
    """README's links made relative to a page ``depth`` folders below ``docs/``."""
    up = "../" * depth

    def one(m: re.Match) -> str:
        target = m.group(1)
        if re.match(r"[a-z]+://|#|mailto:", target):
            return m.group(0)
        if not target.startswith("docs/"):
            raise ValueError(f"README.md links to {target!r}, outside docs/: the site would have a broken link")
        return f"]({up}{target[len('docs/'):]})"

    return _LINK.sub(one, text)


def section(text: str, title: str) -> str:
    """The body of README's ``## title`` section (without its heading), up to the next ``## ``."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m is None:
        raise ValueError(f"README.md has no section '## {title}'")
    return m.group(1).strip("\n")


def with_sections(page: str, readme: str, depth: int) -> str:
    """``page`` with each of its README blocks replaced by the current README section."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}\n{relink(section(readme, m.group(2)), depth)}\n\n{m.group(3)}", page)


def pages() -> dict[Path, str]:
    readme = README.read_text(encoding="utf-8")
    out = {INDEX: f"{INDEX_NOTE}\n\n{relink(readme, 0).rstrip()}\n"}
    for name in SECTION_PAGES:
        path = DOCS / name
        out[path] = with_sections(path.read_text(encoding="utf-8"), readme, name.count("/"))
    return out
