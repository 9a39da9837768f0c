"""Regenerate the generated pages of the documentation site (``mkdocs.yml``, ``docs/``).

    python -m tools.docs_site            # rewrite what changed: pages, and the gallery's figures
    python -m tools.docs_site --check    # exit 1 when a generated page is stale, changing nothing

What is generated, each from one source:

- ``docs/index.md``, the site's front page, is README.md with its links made relative to ``docs/``;
  the blocks of other pages marked ``<!-- readme:begin SECTION ... -->`` are that README section
  (``readme_pages``);
- ``docs/gallery/``: one page per scheme of the library (``schemes/*.pe``) with its source, its
  description, the facts ``pedsl explain`` prints, a figure of its frequencies and biases, and the tests
  that compare it with other implementations (``gallery``, ``peers``).

``--check`` compares the text of the pages, and that every figure the gallery links exists; it never
re-draws a figure (matplotlib's PNG bytes differ between versions). ``compiler_tests/test_docs_site.py``
runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pedsl.fsio import atomic_write_text, ensure_dir

from tools.docs_site import gallery, readme_pages


def generated() -> dict[Path, str]:
    """Every generated page: its path and the text it should hold now."""
    return {**readme_pages.pages(), **gallery.pages()}


def stale(pages: dict[Path, str]) -> list[str]:
    """What differs between ``pages`` and the files: a stale or missing page, a page the gallery no
    longer makes, a figure a page links that does not exist."""
    out = [f"{p} is stale" for p, text in pages.items()
           if not p.is_file() or p.read_text(encoding="utf-8") != text]
    out += [f"{p} is no longer generated (its scheme is gone): delete it" for p in gallery.orphans(pages)]
    out += [f"{p} is missing" for p in gallery.figure_paths() if not p.is_file()]
    return out


def main(argv: list[str]) -> int:
    pages = generated()
    if "--check" in argv:
        problems = stale(pages)
        for line in problems:
            print(f"{line}: run python -m tools.docs_site", file=sys.stderr)
        return 1 if problems else 0
    for path, text in pages.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            ensure_dir(path.parent)
            atomic_write_text(path, text)
            print(f"updated {path}")
    for path in gallery.orphans(pages):
        path.unlink()
        print(f"removed {path}")
    if "--no-figures" not in argv:
        gallery.draw_figures()
    return 0
