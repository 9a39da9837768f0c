"""A Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``) that turns the Sphinx roles of pedsl's
docstrings - ``:func:`load_text```, ``:class:`~pedsl.compiler.plan.Plan``` - into code cross-references, so
the API page shows ``load_text`` linked to its entry instead of the raw role. Markdown is what mkdocstrings
renders a docstring with and it knows no Sphinx roles; the docstrings keep them because they are what the
source reads best with, so they are translated here, once, rather than edited in every docstring.

A name is resolved as Python would read it where the docstring is: a member of the documented object, of
its class, of its module (following imports), else taken as a full dotted path. The reference is an
optional autoref: a target the site documents becomes a link, any other stays plain code (no broken link,
no strict-mode warning for the many internal names the docstrings mention)."""

from __future__ import annotations

import html
import re

from griffe import Extension, Module, Object

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|exc|obj|const):`(?P<target>[^`]+)`")


def _resolve(name: str, where: Object) -> str:
    """The full dotted path that ``name`` means in the docstring of ``where``."""
    head = name.split(".", 1)[0]
    scope: Object | None = where
    while scope is not None:
        member = scope.members.get(head) if scope.is_class or scope.is_module or scope is where else None
        if member is not None:
            try:
                base = member.target_path if member.is_alias else member.path
            except Exception:  # noqa: BLE001 - an alias griffe cannot follow: its own path names it
                base = member.path
            return base + name[len(head):]
        scope = scope.parent
    return name


def _link(match: re.Match, where: Object) -> str:
    target = match["target"].strip()
    short = target.startswith("~")
    target = target.lstrip("~.")
    if " <" in target and target.endswith(">"):  # :func:`title <path>`
        title, target = target[:-1].split(" <", 1)
    else:
        title = target.rsplit(".", 1)[-1] if short else target
    path = _resolve(target, where)
    return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(title)}</code></autoref>'


def _rewrite(obj: Object) -> None:
    if obj.docstring is not None and ":" in obj.docstring.value:
        obj.docstring.value = ROLE.sub(lambda m: _link(m, obj), obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias and member.parent is obj:
            _rewrite(member)


class SphinxRoles(Extension):
    """Rewrite every docstring of a loaded package once its members (and so its imports) are all known."""

    def on_package(self, *, pkg: Module, **kwargs) -> None:
        _rewrite(pkg)
