"""Hover: what the name under the cursor is.

A builtin: its signature, family (which says its axes), what it reads and its one-line doc. A
parameter: its type, bounds and default as declared (in this scheme or the base it comes from) and
the value it resolves to. A frequency - a grid builtin, a ``let`` built on one, a ``qk``/``qkv``
transport - adds the frequency table ``pedsl explain`` prints (periods, cycles within the training
length) and the Frayed-RoPE verdict. A scheme: its description, its ``extends`` chain and parameters. A
statement's keyword: what its record (:mod:`pedsl.lang.statements`) says it does.
"""

from __future__ import annotations

import dataclasses
import re

from lsprotocol import types as lsp

from pedsl import config
from pedsl.diagnostic_codes import CODES
from pedsl.explain import frequency_lines
from pedsl.diffing.facts import fmt_num, scheme_facts
from pedsl.lang.builtins import CATEGORIES, CONSTANTS, FUNCTIONS, WARNINGS
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import BY_KEYWORD
from pedsl.lsp.features import CONSTANT_DOCS
from pedsl.lsp.project import Analysis, Located, import_file
from pedsl.lsp.scan import Decl, SchemeOutline, Token, cursor
from pedsl.lsp.text import Text

MAX_ROWS = 16  # frequency-table rows shown per group (the first and last halves beyond)
_PARAM = re.compile(r"param\s+(?P<name>\w+)\s*:\s*(?P<type>\w+)\s*(?:\((?P<bounds>.*?)\))?\s*=\s*(?P<default>.*)$", re.S)


def _code(text: str, lang: str = "pe") -> str:
    return f"```{lang}\n{text}\n```"


def _stmt(link: Located, d: Decl) -> str:
    return " ".join(link.outline.text[d.stmt_start:d.stmt_end].split())


# ------------------------------------------------------------------ frequencies


def _trimmed(lines: list[str]) -> list[str]:
    """Each group's table with at most MAX_ROWS pair rows (the first and last halves)."""
    out: list[str] = []
    rows: list[str] = []

    def flush():
        if len(rows) > MAX_ROWS:
            half = MAX_ROWS // 2
            out.extend(rows[:half] + [f"    ... {len(rows) - MAX_ROWS} more pairs ..."] + rows[-half:])
        else:
            out.extend(rows)
        rows.clear()

    for line in lines:
        if re.match(r"^\s{4}\s*\d+\s", line):
            rows.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return out


def frayed_verdict(s: Scheme, name: str, periods, train_length: int | None) -> str:
    """Whether a group's rotations fray (a period longer than the training length: W101)."""
    if not train_length:
        return f"group '{name}': no training length (`train {{ context = ... }}`), so no Frayed-RoPE verdict"
    slow = [p for p in periods if p > train_length]
    if not slow:
        return f"group '{name}': **not frayed**, every pair completes a cycle within the training length {train_length}"
    allowed = ", allowed here by `allow frayed_frequencies`" if "frayed_frequencies" in s.allow else ""
    return (f"group '{name}': **Frayed RoPE** (W101{allowed}): {len(slow)} of {len(periods)} pairs have periods "
            f"longer than the training length ({fmt_num(max(slow))} > {train_length} tokens); they never complete "
            "a cycle in training and rotate out of distribution past it")


def frequency_summary(s: Scheme) -> str:
    """The frequency table of ``pedsl explain`` for the scheme's rotations, and the Frayed-RoPE verdicts."""
    f = scheme_facts(s, graph=False)
    rows = f.rotating
    if not rows:
        return f"`{s.name}` rotates no channels: no frequencies"
    table = _trimmed(frequency_lines(dataclasses.replace(f, groups=rows)))
    verdicts = [frayed_verdict(s, g.name, g.periods, f.train_length) for g in rows if g.periods is not None]
    return "\n\n".join([f"**Frequencies of `{s.name}`** (as `pedsl explain` shows them)", _code("\n".join(table), "text"),
                        *verdicts])


def _uses_grid(analysis: Analysis, scheme: SchemeOutline, text: str) -> bool:
    """The expression text calls a frequency grid, directly or through the lets it names (each let once)."""
    pending, seen = [text], set[str]()
    while pending:
        names = set(re.findall(r"[A-Za-z_]\w*", pending.pop()))
        if any(FUNCTIONS[n].category == "grid" for n in names if n in FUNCTIONS):
            return True
        for n in names - seen:
            seen.add(n)
            for link, d in analysis.doc.lookup(scheme, n, ("let",))[:1]:
                pending.append(_stmt(link, d).split("=", 1)[-1])
    return False


# ------------------------------------------------------------------ one kind of name each


def builtin_hover(name: str) -> str:
    b = FUNCTIONS[name]
    family = dict(CATEGORIES).get(b.category, b.category)
    reads = [*b.inputs] + (["the run-time length n"] if b.reads_length else []) + (["learned parameters"]
                                                                                 if b.learned else [])
    extra = f" · reads {', '.join(reads)}" if reads else ""
    return f"{_code(b.signature())}\n\n{b.doc}\n\n*{family}*{extra}"


def _type_name(annotation) -> str:
    """A config field's type in a few words: ``list[int] | None`` for an annotated list, ``int`` for int."""
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    while "Annotated[" in text:  # Annotated[X, FieldInfo(...)] -> X
        start = text.index("Annotated[")
        depth, i = 0, start + len("Annotated[")
        inner_end = None
        for i in range(start + len("Annotated["), len(text)):
            ch = text[i]
            if ch in "[(":
                depth += 1
            elif ch in "])":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0 and inner_end is None:
                inner_end = i
        text = text[:start] + text[start + len("Annotated["):inner_end or i] + text[i + 1:]
    return text


def setting_hover(which: str, key: str) -> str | None:
    """A ``train``/``eval`` setting: its type, default, bounds and description from the config models."""
    models = (config.TrainConfig, config.ModelConfig, config.DataConfig) if which == "train" else (config.EvalConfig,)
    field = next((m.model_fields[key] for m in models if key in m.model_fields), None)
    if field is None:
        return None
    kind = _type_name(field.annotation)
    bounds = ", ".join(f"{sym} {getattr(b, attr)}" for b in field.metadata
                       for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                       if getattr(b, attr, None) is not None)
    default = "" if field.default_factory is not None or field.is_required() else f" = {field.default!r}"
    return _joined(_code(f"{which} {{ {key}: {kind}{default} }}"), bounds and f"bounds: {bounds}", field.description)


def _joined(*parts: str | None) -> str:
    return "\n\n".join(p for p in parts if p)


def param_hover(analysis: Analysis, scheme: SchemeOutline | None, found: list[tuple[Located, Decl]]) -> str:
    link, d = found[0]
    text = _stmt(link, d)
    parts = [_code(text)]
    m = _PARAM.match(text)
    if m:
        parts.append(f"- type: `{m['type']}`\n- bounds: {'`' + m['bounds'] + '`' if m['bounds'] else 'none'}\n"
                     f"- default: `{m['default'].rstrip(';').strip()}`")
    where = link.scheme.name + (f" ({link.path.name})" if link.path is not None else "")
    if scheme is not None and link.scheme is not scheme:
        parts.append(f"declared in `{where}`, inherited by `{scheme.name}`")
    if len(found) > 1:
        parts.append("overrides " + ", ".join(f"`{lk.scheme.name}`" for lk, _ in found[1:]))
    resolved = analysis.resolved(scheme.name) if scheme is not None else None
    if scheme is not None and resolved is not None and d.name in resolved.params:
        parts.append(f"resolves to **`{resolved.params[d.name]!r}`** in `{scheme.name}`")
    elif scheme is not None:
        parts.append(f"(no resolved value: `{scheme.name}` does not check yet)")
    return "\n\n".join(parts)


def let_hover(analysis: Analysis, scheme: SchemeOutline | None, found: list[tuple[Located, Decl]]) -> str:
    link, d = found[0]
    parts = [_code(_stmt(link, d))]
    if scheme is not None and link.scheme is not scheme:
        parts.append(f"from `{link.scheme.name}`" + (f" ({link.path.name})" if link.path is not None else ""))
    if scheme is not None and _uses_grid(analysis, scheme, _stmt(link, d).split("=", 1)[-1]):
        parts.append(_frequencies(analysis, scheme))
    return "\n\n".join(p for p in parts if p)


def _frequencies(analysis: Analysis, scheme: SchemeOutline) -> str:
    resolved = analysis.resolved(scheme.name)
    if resolved is None:
        return f"(no frequency table: `{scheme.name}` does not check yet)"
    return frequency_summary(resolved)


def scheme_hover(analysis: Analysis, loc: Located) -> str:
    s = loc.scheme
    head = f"scheme {s.name}" + (f" extends {s.base}" if s.base else "")
    parts = [_code(head)]
    if s.doc:
        parts.append(s.doc)
    chain = analysis.doc.chain(s) if loc.outline is analysis.doc.outline else []
    if len(chain) > 1:
        parts.append("extends " + " → ".join(f"`{lk.scheme.name}`" for lk in chain[1:]))
    if loc.path is not None and loc.outline is not analysis.doc.outline:
        parts.append(f"declared in `{loc.path}`")
    resolved = analysis.resolved(s.name) if loc.outline is analysis.doc.outline else None
    if resolved is not None and resolved.params:
        parts.append("parameters: " + ", ".join(f"`{k} = {v!r}`" for k, v in resolved.params.items()))
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the hover request


def _markdown(value: str, text: Text, tok: Token) -> lsp.Hover:
    rng = lsp.Range(start=lsp.Position(*text.position(tok.start)), end=lsp.Position(*text.position(tok.end)))
    return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=value), range=rng)


def hover_text(analysis: Analysis, offset: int) -> tuple[str, Token] | None:
    """The hover's markdown for the token at ``offset`` and that token (None: nothing to say)."""
    doc = analysis.doc
    o = doc.outline
    i = o.token_at(offset)
    if i is None:
        return None
    tok = o.tokens[i]
    c = cursor(o, tok.start)
    prev = c.prev_text(1)
    nxt = next((t for t in o.tokens[i + 1:] if t.kind != "comment"), None)
    scheme = c.scheme
    if tok.kind == "str" and prev == "import":
        imp = next((d for d in o.imports if d.start == tok.start), None)
        return (_import_hover(analysis, imp.name), tok) if imp else None
    if tok.kind != "name":
        return None
    name = tok.text
    if prev == "extends" or (prev == "scheme" and scheme is not None):
        loc = doc.visible().get(name) if prev == "extends" else next(
            (Located(s, doc.path, o) for s in o.schemes if s.decl.start == tok.start), None)
        return (scheme_hover(analysis, loc), tok) if loc else None
    if c.statement == "allow" and name in WARNINGS:
        code = WARNINGS[name]
        return f"`allow {name}` silences **{code}**: {CODES.get(code, ('', ''))[1]}", tok
    if nxt is not None and nxt.text == "(" and name in FUNCTIONS:
        frequencies = FUNCTIONS[name].category in ("grid", "transport") and scheme is not None \
            and c.statement in ("let", "qk", "qkv")
        return _joined(builtin_hover(name), _frequencies(analysis, scheme) if frequencies and scheme is not None else None), tok
    if nxt is not None and nxt.text == "=" and c.calls and c.calls[-1][0] in FUNCTIONS:
        b = FUNCTIONS[c.calls[-1][0]]
        if name in dict(b.params):
            return f"argument `{name}` of\n\n{builtin_hover(b.name)}", tok
    if c.statement in ("train", "eval") and nxt is not None and nxt.text == "=" and c.depth == 2:
        found_setting = setting_hover(c.statement, name)
        return (found_setting, tok) if found_setting else None
    if name in BY_KEYWORD and scheme is not None and tok.depth - scheme.depth0 == 1 and prev not in ("param", "let"):
        record = BY_KEYWORD[name]  # a statement's keyword: its record says what it does
        return _joined(record.hover(name), _frequencies(analysis, scheme) if record.frequencies else None), tok
    if scheme is not None:
        found = doc.lookup(scheme, name)
        if found:
            hover = param_hover if found[0][1].kind == "param" else let_hover
            return hover(analysis, scheme, found), tok
    if name in CONSTANTS and prev not in ("param", "let"):
        return f"{_code(name)}\n\n{CONSTANT_DOCS.get(name, '')} · `{CONSTANTS[name].show()}`", tok
    return None


def _import_hover(analysis: Analysis, name: str) -> str:
    doc = analysis.doc
    target = import_file(doc.path.parent if doc.path else doc.base_dir, name, doc.roots)
    if target is None:
        return f"`{name}`: not importable from here (see the diagnostic)"
    o = doc.files.outline(target)
    names = ", ".join(f"`{s.name}`" for s in o.schemes) if o else "?"
    return f"`{target}`\n\ndeclares {names}"


def hover(analysis: Analysis, text: Text, offset: int) -> lsp.Hover | None:
    found = hover_text(analysis, offset)
    return _markdown(found[0], text, found[1]) if found else None
