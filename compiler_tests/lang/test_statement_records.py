"""Every statement of a scheme's body is a record (pedsl/lang/statements.py) and lives in that record only.

Every record has every part - grammar rule, syntax IR node, completion snippet, inherit mode, canonical
text, the expressions it reads, the resolved scheme's fields, render and diff (a function, or the mark
that its consumer's structure code writes it), highlight class and the plan fields it lowers to; the
grammar (grammars/pe.lark, hand-written) has a record for each of its statements and a rule for each
record, starting with the record's keywords; the syntax IR's statement kinds are the records'; and no
consumer - the parser's tree builder, inherit, formatter, lint, diff, render, the LSP's scan and
completion, the Pygments lexer, the editor grammar's generator - names a statement's keyword in a string
literal: each iterates the registry.
"""

from __future__ import annotations

import ast as pyast
import dataclasses
import re
import typing

import pytest

from compiler_helpers import ROOT
from pedsl.compiler.plan import Plan
from pedsl.lang import ast
from pedsl.lang.formatter import format_module
from pedsl.lang.inherit import Merged
from pedsl.lang.parser import parse_module
from pedsl.lang.resolve import Resolver
from pedsl.lang.scheme import Scheme
from pedsl.lang.statements import (BY_CONSUMER, BY_KEYWORD, BY_RULE, HIGHLIGHT, INHERIT_MODES, KEYWORDS, ONE, RECORDS,
                                   STATEMENT_KEYWORDS, Diff, Show, Words)

GRAMMAR = (ROOT / "grammars" / "pe.lark").read_text()
CONSUMERS = ["pedsl/lang/transform.py", "pedsl/lang/inherit.py", "pedsl/lang/formatter.py", "pedsl/lang/lint.py",
             "pedsl/lang/builtins.py", "pedsl/lang/syntax_errors.py", "pedsl/diffing/edits.py", "pedsl/cli/render.py",
             "pedsl/lsp/scan.py", "pedsl/lsp/features.py", "pedsl/highlight.py", "tools/doc_tables.py",
             "pedsl/diffing/facts.py"]
# Attributes of the resolved scheme a consumer may still read: a statement part it writes as structure (the
# layer map, the bias terms, the learned values of the temperature, explain's cost of CoPE and the relative terms)
# or its own lint of the value
READS_FIELDS = {"pedsl/lang/lint.py": {"axes", "temperature"}, "pedsl/diffing/edits.py": {"biases", "layers", "temperature"},
                "pedsl/cli/render.py": {"layers"}, "pedsl/diffing/facts.py": {"axes", "biases", "layout", "normalize",
                                                                              "attend_current", "contextual", "relative",
                                                                              "temperature"}}
# The scheme's skeleton: the consumers' structure code (the LSP's cursor logic, the merge of params and lets,
# the diff's matching by name, the train / eval tables) is written for these keywords, so they may name them.
SKELETON = {"param", "let", "channels", "qk", "qkv", "train", "eval", "allow"}
# the statements pedsl explain gives a section or line of its own (the others: its attention line, from the records)
EXPLAINED = {"layout", "axes_decl", "bias", "temperature", "normalize", "contextual", "layers"}
# strings that spell a statement keyword but mean something else
NOT_STATEMENTS = {"pedsl/lang/builtins.py": {"axes", "bias", "temperature"}}  # builtin categories


def _sample(snippet: str) -> str:
    """A completion snippet as the text it inserts with its defaults taken."""
    text = re.sub(r"\$\{\d+:([^}]*)\}", r"\1", snippet)
    text = re.sub(r"\$\{\d+\|([^,|]*)[^}]*\}", r"\1", text)
    return text.replace("$0", "position").replace("\t", "  ")


def _kinds(node: type) -> set[str]:
    return set(typing.get_args(node.model_fields["kind"].annotation))


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.rule)
def test_every_record_has_every_part(record):
    assert record.completions and all(snippet.startswith(k) and what for k, snippet, what in record.completions)
    assert record.kind in _kinds(record.node)
    assert record.inherit in INHERIT_MODES and record.highlight in HIGHLIGHT
    assert (record.form is None) != (record.block is None)  # one line, or a block
    assert callable(record.reads)
    # a field of the resolved scheme, or a value carried without one (Scheme.settings, read as an attribute)
    assert set(record.fields) <= set(Scheme.model_fields) | {c.name for c in record.carried}, record.fields
    assert record.known is None or (not record.resolve and record.assign and record.fields)
    assert set(record.plan_fields) <= {f.name for f in dataclasses.fields(Plan)}, record.plan_fields
    for c in record.carried:  # on the plan by its name (a field, or one of its settings), its default where unset
        assert getattr(Plan("s", "halves", 2, 8, (), (), None, "sdpa", ""), c.name) == c.default, c.name
        assert c.feature is not None or c.why, f"{c.name}: a feature of its own, or why every kernel computes it"
    assert isinstance(record.show, Show) or record.show == BY_CONSUMER
    assert not record.resolve or (callable(getattr(Resolver, record.resolve, None)) and record.fields)
    assert isinstance(record.diff, Diff) or record.diff == BY_CONSUMER
    assert isinstance(record.words, Words) or record.words == BY_CONSUMER
    if record.inherit == ONE:  # the nearest statement in the chain, read by its name
        assert getattr(Merged(name="s"), record.merged) is None
    elif record.merged:
        assert record.merged in {f.name for f in dataclasses.fields(Merged)}
    if record.keywords[0] not in SKELETON:  # an attention statement: shown and compared by its record
        assert record.show != BY_CONSUMER or record.rule == "layers"  # the layer map: pedsl show's own
        assert record.diff != BY_CONSUMER or record.rule in ("bias", "layers")  # terms by kind; diff refuses layers
        # said in words on explain's attention line, or in a section of its own (pedsl/explain.py)
        assert record.words != BY_CONSUMER or record.rule in EXPLAINED


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.rule)
def test_every_record_parses_formats_and_reads_back(record):
    """Its snippet's text parses to its node, formats to a line starting with its keyword, and reparses the same."""
    for keyword, snippet, _ in record.completions:
        text = f"scheme s {{\n  {_sample(snippet)}\n}}\n"
        [st] = parse_module(text).schemes[0].body
        assert st.kind == record.kind and isinstance(st, record.node)
        out = format_module(parse_module(text), text)
        assert out.split("\n")[1].strip().startswith(keyword)
        again = parse_module(out).schemes[0].body[0]
        assert again.model_dump(exclude={"span"}) == st.model_dump(exclude={"span"}) or record.block is not None
        assert format_module(parse_module(out), out) == out
        assert all(isinstance(e, ast.Num | ast.Name | ast.Call | ast.Binary | ast.ListExpr | ast.Str | ast.Unary
                              | ast.Bool) for e in record.reads(st))


def _grammar_rule(name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", GRAMMAR, flags=re.M)
    assert m, f"grammars/pe.lark has no rule '{name}'"
    return m[1]


def test_the_grammar_statements_are_the_records():
    alternatives = re.search(r"^\?stmt: \((.*)\) \";\"\?$", GRAMMAR, flags=re.M)[1]
    assert {a.strip() for a in alternatives.split("|")} == set(BY_RULE), \
        "a statement of grammars/pe.lark without a record in pedsl/lang/statements.py (or the reverse)"
    for record in RECORDS:
        first = _grammar_rule(record.rule).split()[0]
        if first.startswith('"'):
            assert (first.strip('"'),) == record.keywords
        else:  # a terminal of keywords: TARGET (qk, qkv), SECTION (train, eval)
            words = re.search(rf"^{first}\.\d: (.*)$", GRAMMAR, flags=re.M)[1]
            assert {w.strip().strip('"') for w in words.split("|")} == set(record.keywords)


def test_the_syntax_ir_statements_are_the_records():
    kinds = {k for node in typing.get_args(typing.get_args(ast.Stmt)[0]) for k in _kinds(node)}
    assert kinds == {r.kind for r in RECORDS}


def test_the_name_sets_are_read_off_the_records():
    assert set(STATEMENT_KEYWORDS) == set(BY_KEYWORD) == {k for r in RECORDS for k in r.keywords}
    assert {k for r in RECORDS if r.reserved for k in r.keywords} <= KEYWORDS
    assert not {k for r in RECORDS if not r.reserved for k in r.keywords} & KEYWORDS


@pytest.mark.parametrize("rel", CONSUMERS)
def test_no_consumer_names_a_statement(rel):
    tree = pyast.parse((ROOT / rel).read_text())
    named = {n.value for n in pyast.walk(tree) if isinstance(n, pyast.Constant) and isinstance(n.value, str)}
    named -= NOT_STATEMENTS.get(rel, set()) | SKELETON
    assert not named & set(STATEMENT_KEYWORDS), f"{rel} names statements {sorted(named & set(STATEMENT_KEYWORDS))}"


@pytest.mark.parametrize("rel", CONSUMERS)
def test_no_consumer_reads_a_statement_field_it_has_from_the_registry(rel):
    """A consumer reads a statement's value through its record, not ``scheme.window``: a new statement is
    shown, compared and described without it (one it must read is listed in READS_FIELDS, with why)."""
    fields = {f for r in RECORDS if r.keywords[0] not in SKELETON for f in r.fields}
    tree = pyast.parse((ROOT / rel).read_text())
    read = {n.attr for n in pyast.walk(tree) if isinstance(n, pyast.Attribute) and n.attr in fields}
    assert not read - READS_FIELDS.get(rel, set()), f"{rel} reads {sorted(read - READS_FIELDS.get(rel, set()))}"
