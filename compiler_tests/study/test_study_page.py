"""The one page model of the study reports and its writer: the same blocks in Markdown and HTML,
every text escaped, `code` spans as <code>, the "Reproduce" section closing both."""

from __future__ import annotations

from pedsl.study.page import Bullets, Figure, Figures, Note, Page, Table, figures, html_page, images, markdown

META = {"command": "pedsl compare <x> & y", "git": "abc1234", "pedsl": "0.1", "torch": "2.x", "python": "3.11",
        "platform": "linux", "cpus": 2, "threads": 1, "date": "2026-01-01 00:00:00 UTC"}


def _page(**kw) -> Page:
    blocks = [Table("T <1>", ["scheme", "ppl"], [["rope", "1.000"], ["<b>", "-"]], "note with `code`"),
              Table("Summary", ["a"], [["1"]]),
              Bullets("Findings", ["first & only"]), Bullets("Empty", []), Bullets("Always", [], always=True),
              Note("Note: careful"),
              figures({"ppl_ratio": ["ppl_ratio.png", "ppl_ratio.svg"], "none": ["x.svg"]}, {"ppl_ratio": "Ratio"}, svg=True)]
    return Page("Title", "Preset `tiny`, seed 0.", blocks, META, **kw)


def test_markdown_has_every_block_in_order():
    md = markdown(_page())
    assert md.startswith("# Title\n\nPreset `tiny`, seed 0.\n\n## T <1>\n\n| scheme | ppl |\n|---|---|\n| rope | 1.000 |\n")
    assert "| <b> | - |" in md and "note with `code`" in md
    assert md.index("## T <1>") < md.index("## Summary") < md.index("## Findings") < md.index("- first & only")
    assert "## Empty" not in md and "## Always\n\n\n" in md and "Note: careful\n" in md
    assert "### Ratio\n\n![Ratio](ppl_ratio.png)\n\n(vector: [ppl_ratio.svg](ppl_ratio.svg))" in md
    assert "x.svg" not in md  # a plot without a PNG has no figure
    assert md.rstrip().endswith("- date: 2026-01-01 00:00:00 UTC")
    assert "## Reproduce\n\n```\npedsl compare <x> & y\n```" in md


def test_html_escapes_and_renders_the_same_blocks():
    page = html_page(_page(html_title="tab <title>"))
    assert page.startswith("<!DOCTYPE html>") and "<title>tab &lt;title&gt;</title>" in page
    assert "<h1>Title</h1>" in page and "<p>Preset <code>tiny</code>, seed 0.</p>" in page
    assert "<h2>T &lt;1&gt;</h2>" in page and "<td>&lt;b&gt;</td>" in page
    assert "<p class='note'>note with <code>code</code></p>" in page
    assert "<li>first &amp; only</li>" in page and "Empty" not in page and "<h2>Always</h2><ul>\n</ul>" in page
    assert "<figcaption class='note'>Ratio (<a href='ppl_ratio.svg'>SVG</a>)</figcaption>" in page
    assert "<pre>pedsl compare &lt;x&gt; &amp; y</pre>" in page and "torch threads 1" in page
    assert page.endswith("</ul></body></html>")


def test_uncaptioned_images_list_every_png():
    f = images(["a.png", "a.svg", "b.png"])
    assert f == Figures([Figure("a.png"), Figure("b.png")])
    md = markdown(Page("T", "i", [f], META))
    assert "## Plots\n\n![a.png](a.png)\n![b.png](b.png)\n\n## Reproduce" in md
    assert "<figure><img src='a.png' alt='a.png'></figure>" in html_page(Page("T", "i", [f], META))
