"""The code cites the repository's own reference, docs/semantics.md, by section - and every cited
section exists there (a renumbered page must not leave citations pointing at the wrong math)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("pedsl", "compiler_tests", "benchmarks", "schemes", "docs")
CITE = re.compile(r"docs/semantics\.md\s+§(\d+)([a-z]?)(?:\.(\d+))?")


def _files():
    for tree in TREES:
        for p in (ROOT / tree).rglob("*"):
            if p.suffix in (".py", ".md", ".pe") and p.is_file():
                yield p


def _sections() -> tuple[set[str], dict[str, int]]:
    """Headings ('1', '2a', ...) and, per numbered section, how many numbered items it has."""
    text = (ROOT / "docs" / "semantics.md").read_text()
    heads: set[str] = set()
    items: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"#{2,3} (\d+)([a-z]?)\. ", line)
        if m:
            heads.add(m.group(1) + m.group(2))
            heads.add(m.group(1))
            current = m.group(1)
            continue
        m = re.match(r"(\d+)\. \*\*", line)
        if m and current is not None:
            items[current] = max(items.get(current, 0), int(m.group(1)))
    return heads, items


def test_no_citation_of_design_notes_outside_the_repository():
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in _files() if p.name != Path(__file__).name
                 for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
                 if re.search(r"\bSEMANTICS\b|\bARCHITECTURE\.md\b|\bLANGUAGE\.md\b", line)]
    assert not offenders, "cite docs/semantics.md instead: " + ", ".join(offenders)


def test_every_cited_section_exists():
    heads, items = _sections()
    assert {"1", "2a", "2b", "5", "6", "8"} <= heads
    bad, seen = [], 0
    for p in _files():
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            for m in CITE.finditer(line):
                seen += 1
                sec, sub, item = m.group(1), m.group(2), m.group(3)
                if sec + sub not in heads or (item and int(item) > items.get(sec, 0)):
                    bad.append(f"{p.relative_to(ROOT)}:{i}: {m.group(0)}")
    assert seen > 30 and not bad, bad
