"""The documentation site (mkdocs.yml, docs/): the generated pages are current (``python -m tools.docs_site``
regenerates them; ``--check`` notices a stale one and changes nothing), the gallery has a page and a figure
for every library scheme and names only tests that exist, and the README stays a front page that links to
every page of the site. (``mkdocs build --strict``, which refuses a broken link or a missing page, runs in
.ci/run.)"""

from __future__ import annotations

import re

import yaml

from compiler_helpers import ROOT
from tools import docs_site
from tools.docs_site import gallery, peers, readme_pages

from pedsl.lang.library import library_names


def _nav_pages() -> list[str]:
    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for x in node:
                yield from walk(x)
        elif isinstance(node, dict):
            for x in node.values():
                yield from walk(x)

    return list(walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))


def test_the_generated_pages_are_current():
    assert docs_site.stale(docs_site.generated()) == [], "regenerate with: python -m tools.docs_site"


def test_the_gallery_has_a_page_and_a_figure_for_every_library_scheme():
    names = library_names()
    assert len(names) >= 40
    nav = _nav_pages()
    for name in names:
        text = (ROOT / "docs" / "gallery" / f"{name}.md").read_text(encoding="utf-8")
        assert f"# {name}\n" in text and f"(img/{name}.png)" in text and "```pe\n" in text
        assert (ROOT / "docs" / "gallery" / "img" / f"{name}.png").is_file()
        assert f"gallery/{name}.md" in nav
        assert peers.DIFFERENTIAL[0] in text
    index = (ROOT / "docs" / "gallery" / "index.md").read_text(encoding="utf-8")
    assert [m for m in re.findall(r"^\| \[(\w+)\]", index, re.M)] == names


def test_every_peer_test_the_gallery_names_exists():
    assert peers.missing_tests() == []
    assert set(peers.PEERS) <= set(library_names())


def test_check_fails_on_a_stale_page_and_regenerating_repairs_it(tmp_path, monkeypatch, capsys):
    assert docs_site.stale(docs_site.generated()) == []  # so that main() below writes nothing else
    index = tmp_path / "index.md"
    index.write_text(readme_pages.INDEX.read_text(encoding="utf-8").replace("pedsl", "pedls", 1), encoding="utf-8")
    monkeypatch.setattr(readme_pages, "INDEX", index)  # never write the repository's files
    assert docs_site.main(["--check"]) == 1 and "index.md is stale" in capsys.readouterr().err
    assert "pedls" in index.read_text(encoding="utf-8")  # --check never writes
    assert docs_site.main(["--no-figures"]) == 0
    assert index.read_text(encoding="utf-8") == readme_pages.pages()[index]
    assert docs_site.main(["--check"]) == 0


def test_a_readme_link_outside_docs_is_refused():
    assert readme_pages.relink("[a](docs/img/x.png) [b](https://x.org/y)", 1) == "[a](../img/x.png) [b](https://x.org/y)"
    try:
        readme_pages.relink("[c](pedsl/limits.py)", 0)
    except ValueError as err:
        assert "outside docs/" in str(err)
    else:
        raise AssertionError("a link the site cannot resolve was accepted")


def test_a_comment_formula_stays_literal_in_the_gallery():
    assert gallery.escape_markdown("w = a * b_t < c, `x * y_z`") == r"w = a \* b\_t &lt; c, `x * y_z`"


def test_the_readme_is_a_front_page_that_links_to_every_page_of_the_site():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    linked = set(re.findall(r"\]\(docs/([^)#]+)\)", text))
    missing = [p for p in _nav_pages() if p not in linked and p != "index.md" and not p.startswith("gallery/")
               and p != "studies/index.md"]
    assert missing == [], f"pages of the site the README does not link to: {missing}"
    for page in linked:
        assert (ROOT / "docs" / page).is_file(), page


def test_sphinx_roles_in_docstrings_become_code_cross_references():
    """mkdocstrings renders docstrings as Markdown, which knows no Sphinx roles: the Griffe extension that
    mkdocs.yml loads turns ``:func:`load_text``` into a code cross-reference resolved where the docstring is
    (here the module of ``check``), and ``:class:`~a.b.C``` into ``C`` linking to ``a.b.C``."""
    import griffe  # the test extras install the docs extras, Griffe with them
    from tools.docs_site.sphinx_roles import SphinxRoles

    assert "tools/docs_site/sphinx_roles.py" in (ROOT / "mkdocs.yml").read_text()
    pkg = griffe.load("pedsl", search_paths=[ROOT], extensions=griffe.load_extensions(SphinxRoles),
                      resolve_aliases=False)
    doc = pkg["lang.api"].members["check"].docstring.value
    assert ":func:" not in doc
    assert '<autoref identifier="pedsl.lang.api.load_text" optional><code>load_text</code></autoref>' in doc
    plan_doc = pkg["compiler"].members["compile_plan"].docstring.value
    assert 'identifier="pedsl.compiler.plan.Plan"' in plan_doc and ":class:" not in plan_doc
