"""Completion and signature help: what may be typed where the cursor is.

The cursor's context comes from :func:`pedsl.lsp.scan.cursor` (it works on half-typed text); the
names come from the language's registries - the builtins and fixed names of
:mod:`pedsl.lang.builtins`, the ``train``/``eval`` keys of :mod:`pedsl.config`, the scheme library -
and from the document: params and lets of the scheme at the cursor and of its ``extends`` chain,
the schemes it can see.
"""

from __future__ import annotations

from itertools import islice

from lsprotocol import types as lsp

from pedsl import config
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS, REQUIRED, WARNINGS
from pedsl.lang.library import library_dir, library_names
from pedsl.lang.statements import RECORDS
from pedsl.lsp.project import Document, resolved
from pedsl.lsp.scan import Cursor, cursor
from pedsl.lsp.text import Text

# What a statement keyword inserts (snippet syntax), and a line about it: the statements' records.
STATEMENTS = {k: (snippet, what) for r in RECORDS for k, snippet, what in r.completions}
# The builtin categories offered in a statement's value
CATEGORIES_IN = {k: r.completes for r in RECORDS for k in r.keywords if r.completes}
# The fixed words that follow a statement's keyword (a layout's)
CHOICES = {k: r.choices for r in RECORDS for k in r.keywords if r.choices}
TOP_LEVEL = {
    "scheme": ('scheme ${1:name} "${2:description}" {\n\t$0\n}', "declare a scheme"),
    "import": ('import "${1:rope.pe}"', "import the schemes of another file"),
}
CONSTANT_DOCS = {
    "position": "the token's position i (the query's; j for keys)", "distance": "the distance i - j >= 0 (biases)",
    "n": "the run-time sequence length", "heads": "the number of heads (the model's, or a param)",
    "head_dim": "the channels of a head (the model's, or a param)", "x": "the hidden state (data-dependent steps)",
    "token": "the token ids", "pi": "3.14159...", "e": "2.71828...", "none": "no value (quarters' unused slots)",
    "all": "every channel of a head", "rest": "the channels no other group takes",
    "head": "the head axis (`to = head`)", "pair": "the rotary-pair axis (`to = pair`)",
    "channel": "the channel axis (`to = channel`)",
}


def _item(label: str, kind: lsp.CompletionItemKind, detail: str, doc: str | None = None, *, sort: str = "5",
          snippet: str | None = None, snippets: bool = False, edits=None) -> lsp.CompletionItem:
    use = snippet is not None and snippets
    return lsp.CompletionItem(
        label=label, kind=kind, detail=detail, sort_text=f"{sort}{label}",
        documentation=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=doc) if doc else None,
        insert_text=snippet if use else None,
        insert_text_format=lsp.InsertTextFormat.Snippet if use else None,
        additional_text_edits=edits)


def builtin_snippet(name: str) -> str:
    b = FUNCTIONS[name]
    required = [p for p, d in b.params if d is REQUIRED]
    return f"{name}(" + ", ".join(f"${{{i}:{p}}}" for i, p in enumerate(required, 1)) + ")$0"


def _builtins(snippets: bool, categories: tuple[str, ...] = ()) -> list[lsp.CompletionItem]:
    out = []
    for b in FUNCTIONS.values():
        sort = "3" if b.category in categories else "6"
        out.append(_item(b.name, lsp.CompletionItemKind.Function, b.signature(), b.doc, sort=sort,
                         snippet=builtin_snippet(b.name), snippets=snippets))
    return out


def _in_scope(doc: Document, c: Cursor) -> list[lsp.CompletionItem]:
    """Params and lets of the scheme at the cursor and of the schemes it extends (nearest wins)."""
    out: list[lsp.CompletionItem] = []
    seen = set()
    if c.scheme is None:
        return out
    for depth, link in enumerate(doc.chain(c.scheme)):
        for d in reversed(link.scheme.members):
            if d.kind not in ("param", "let") or d.name in seen:
                continue
            seen.add(d.name)
            text = " ".join(link.outline.text[d.stmt_start:d.stmt_end].split())
            where = "" if depth == 0 else f" (from {link.scheme.name})"
            kind = lsp.CompletionItemKind.Variable if d.kind == "let" else lsp.CompletionItemKind.Property
            out.append(_item(d.name, kind, text[:120] + where, sort="1" if depth == 0 else "2"))
    return out


def _groups(doc: Document, c: Cursor) -> list[lsp.CompletionItem]:
    out, seen = [], set()
    if c.scheme is not None:
        for link in doc.chain(c.scheme):
            for d in link.scheme.members:
                if d.kind == "group" and d.name not in seen:
                    seen.add(d.name)
                    out.append(_item(d.name, lsp.CompletionItemKind.EnumMember, f"channel group of {link.scheme.name}"))
    return out


def _schemes(doc: Document, c: Cursor) -> list[lsp.CompletionItem]:
    """Schemes the document sees, then library schemes it does not import yet (adding the import)."""
    out = []
    visible = doc.visible()
    for name, loc in visible.items():
        if c.scheme is not None and name == c.scheme.name:
            continue  # a scheme cannot extend itself
        where = loc.path.name if loc.path is not None else "this file"
        out.append(_item(name, lsp.CompletionItemKind.Class, f"scheme ({where})", loc.scheme.doc, sort="1"))
    text = Text(doc.text)
    last = doc.outline.imports[-1] if doc.outline.imports else None
    at = text.position(text.line_end(last.stmt_end) + 1) if last else (0, 0)
    for name in library_names():
        if name in visible:
            continue
        edit = lsp.TextEdit(range=lsp.Range(start=lsp.Position(*at), end=lsp.Position(*at)),
                            new_text=f'import "{name}.pe"\n')
        out.append(_item(name, lsp.CompletionItemKind.Class, f"library scheme (adds import \"{name}.pe\")",
                         sort="2", edits=[edit]))
    if c.scheme is not None:
        out = [i for i in out if i.label != c.scheme.name]
    return out


def _import_files(doc: Document, c: Cursor, text: Text) -> list[lsp.CompletionItem]:
    """`.pe` files and folders (of the document's folder, or of the subfolder typed so far) that an import
    may name, and the library's files; each replaces what is typed inside the quotes."""
    assert c.inside is not None
    start = c.inside.start + 1
    typed = text.text[start:c.offset]
    sub = typed.rsplit("/", 1)[0] + "/" if "/" in typed else ""
    folder = (doc.path.parent if doc.path is not None else doc.base_dir) / sub
    names: dict[str, tuple[str, lsp.CompletionItemKind]] = {}
    try:
        entries = sorted(islice(folder.iterdir(), 5000))[:500]  # a huge folder is listed in part
    except (OSError, ValueError):  # no such folder, or a name no folder can have
        entries = []
    own = resolved(doc.path) if doc.path is not None else None
    for p in entries:
        real = resolved(p)  # None: a symlink loop
        if real is None or not any(real.is_relative_to(r) for r in doc.roots):
            continue
        try:
            if real.is_dir() and not p.name.startswith("."):
                names[f"{sub}{p.name}/"] = ("folder", lsp.CompletionItemKind.Folder)
            elif p.suffix == ".pe" and real != own:
                names[f"{sub}{p.name}"] = (f"file in {folder}", lsp.CompletionItemKind.File)
        except OSError:
            continue
    if not sub:
        for name in library_names():
            names.setdefault(f"{name}.pe", (f"scheme library ({library_dir()})", lsp.CompletionItemKind.File))
    rng = lsp.Range(start=lsp.Position(*text.position(start)), end=lsp.Position(*text.position(c.offset)))
    return [lsp.CompletionItem(label=n, kind=kind, detail=d, text_edit=lsp.TextEdit(range=rng, new_text=n))
            for n, (d, kind) in names.items()]


def _section_keys(which: str) -> list[lsp.CompletionItem]:
    keys = config.train_block_keys() if which == "train" else config.eval_block_keys()
    return [_item(k, lsp.CompletionItemKind.Field, f"{which} setting") for k in sorted(keys) if "." not in k]


def _statement_items(snippets: bool, table: dict) -> list[lsp.CompletionItem]:
    return [_item(k, lsp.CompletionItemKind.Keyword, what, sort="0", snippet=snip, snippets=snippets)
            for k, (snip, what) in table.items()]


def _values(doc: Document, c: Cursor, snippets: bool) -> list[lsp.CompletionItem]:
    """Everything an expression may name: kwargs of the enclosing call, params and lets, fixed names, builtins."""
    out: list[lsp.CompletionItem] = []
    if c.calls and c.calls[-1][0] in FUNCTIONS:
        b = FUNCTIONS[c.calls[-1][0]]
        for p, d in b.params:
            shown = "required" if d is REQUIRED else f"= {str(d).lower() if isinstance(d, bool) else d}"
            out.append(lsp.CompletionItem(label=f"{p} =", kind=lsp.CompletionItemKind.Property, filter_text=p,
                                          insert_text=f"{p} = ", detail=f"{b.name}(): {p} {shown}", sort_text=f"0{p}"))
    out += _in_scope(doc, c)
    for name, ty in CONSTANTS.items():
        out.append(_item(name, lsp.CompletionItemKind.Constant, ty.show(), CONSTANT_DOCS.get(name), sort="4"))
    out += _builtins(snippets, CATEGORIES_IN.get(c.statement or "", ()))
    return out


def completions(doc: Document, text: Text, offset: int, snippets: bool = True) -> list[lsp.CompletionItem]:
    """The completion items at ``offset`` (never raises on any text)."""
    c = cursor(doc.outline, offset)
    prev, prev2 = c.prev_text(1), c.prev_text(2)
    if c.inside is not None:
        if c.inside.kind == "str" and prev == "import":
            return _import_files(doc, c, text)
        return []
    if prev == "extends":
        return _schemes(doc, c)
    if prev in CHOICES:
        return [_item(v, lsp.CompletionItemKind.EnumMember, prev) for v in CHOICES[prev]]
    if prev == ":" and c.prev_text(3) == "param":
        return [_item(v, lsp.CompletionItemKind.TypeParameter, "type") for v in ("float", "int", "bool", "str")]
    if prev == "on" and c.statement in ("qk", "qkv"):
        return _groups(doc, c)
    if c.statement == "allow" and prev in ("allow", ","):
        return [_item(k, lsp.CompletionItemKind.EnumMember, code) for k, code in WARNINGS.items()]
    if c.scheme is None or c.scheme.body_start is None or c.word_start < c.scheme.body_start:
        return _statement_items(snippets, TOP_LEVEL) if c.at_statement_start and c.depth == 0 else []
    if c.at_statement_start and c.depth == 1:
        return _statement_items(snippets, STATEMENTS)
    if c.at_statement_start and c.depth == 2 and c.statement in ("train", "eval"):
        return _section_keys(c.statement)
    if c.at_statement_start and c.depth == 2 and c.statement == "channels":
        return []  # a new group's name is the user's to choose
    if prev2 == "param" or prev in ("let", "param") or c.statement in CHOICES:
        return []  # a name being declared, or a fixed word (a layout) already given
    return _values(doc, c, snippets)


def signature_help(doc: Document, offset: int) -> lsp.SignatureHelp | None:
    """The signature of the builtin call the cursor is in, with the argument being typed."""
    c = cursor(doc.outline, offset)
    if c.inside is not None:
        return None
    call = next(((f, k) for f, k in reversed(c.calls) if f in FUNCTIONS), None)
    if call is None:
        return None
    b = FUNCTIONS[call[0]]
    label = b.signature()
    params, pos = [], len(b.name) + 1
    for p, _ in b.params:
        at = label.index(p, pos)
        params.append(lsp.ParameterInformation(label=(at, at + len(p))))
        pos = at + len(p)
    active = min(call[1], max(0, len(params) - 1))
    keyword = c.prev_text(2)
    if c.prev_text(1) == "=" and keyword is not None and keyword in dict(b.params):  # a keyword argument being typed
        active = [p for p, _ in b.params].index(keyword)
    sig = lsp.SignatureInformation(label=label, documentation=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown,
                                                                                value=b.doc),
                                   parameters=params)
    return lsp.SignatureHelp(signatures=[sig], active_signature=0, active_parameter=active)

