"""Highlighting of `.pe` files: the Pygments lexer (registered as `pe`) on every library scheme, and the
VS Code extension's TextMate grammar and manifest, which name the language's builtins and keywords."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from pygments.token import Error, Keyword, Name

from compiler_helpers import ROOT, library
from tools.doc_tables import GRAMMAR, grammar_with_builtins
from pedsl.highlight import PeLexer
from pedsl.lang.builtins import CONSTANTS, FUNCTIONS
from pedsl.lsp.scan import STATEMENT_KEYWORDS

VSCODE = ROOT / "editors" / "vscode"


@pytest.mark.parametrize("path", library(), ids=lambda p: p.stem)
def test_every_library_scheme_lexes_without_an_error_token(path):
    text = path.read_text()
    tokens = list(PeLexer().get_tokens(text))
    assert [v for t, v in tokens if t in Error] == []
    assert "".join(v for _, v in tokens) == text  # nothing lost or invented


def test_the_lexer_names_what_each_word_is():
    text = 'import "rope.pe"\nscheme pi extends rope "PI" {\n  param factor: float (>= 1) = 4.0\n' \
           '  let w = geometric(base) / factor\n  qk: rotate(w * position)\n}\n'
    kinds: dict = {}
    for t, v in PeLexer().get_tokens(text):
        kinds.setdefault(v, t)  # the first occurrence of each word
    assert kinds["scheme"] in Keyword and kinds["pi"] is Name.Class and kinds["rope"] is Name.Class
    assert kinds["factor"] is Name.Variable and kinds["float"] in Keyword.Type
    assert kinds["geometric"] in Name.Builtin and kinds["position"] is Name.Builtin.Pseudo
    assert kinds["qk"] in Keyword and kinds["base"] is Name
    assert any(t in Error for t, _ in PeLexer().get_tokens("let w = 1 $ 2"))  # not the language: flagged


def test_the_lexer_is_registered_under_the_pygments_entry_point():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = meta["project"]["entry-points"]["pygments.lexers"]["pe"]
    module, _, attr = target.partition(":")
    assert (module, attr) == ("pedsl.highlight", "PeLexer") and "pe" in PeLexer.aliases
    assert PeLexer.filenames == ["*.pe"]
    extras = meta["project"]["optional-dependencies"]
    assert {"pygls", "lsprotocol", "Pygments"} <= {re.split(r"[<>=]", d)[0] for d in extras["lsp"]}
    assert {"pygls", "lsprotocol", "Pygments", "pytest-lsp"} <= {re.split(r"[<>=]", d)[0] for d in extras["test"]}


def test_the_textmate_grammar_knows_every_builtin_and_keyword():
    grammar = json.loads((VSCODE / "syntaxes" / "pedsl.tmLanguage.json").read_text())
    assert grammar["scopeName"] == "source.pedsl"
    builtin = grammar["repository"]["builtin"]["patterns"]
    funcs = set(re.search(r"\(([^)]*)\)", builtin[0]["match"])[1].split("|"))
    consts = set(re.search(r"\(([^)]*)\)", builtin[1]["match"])[1].split("|"))
    assert funcs == set(FUNCTIONS) and consts == set(CONSTANTS)
    text = GRAMMAR.read_text()
    assert grammar_with_builtins(text) == text, "regenerate with: python -m tools.doc_tables"
    statements = grammar["repository"]["keyword"]["patterns"][1]["match"]
    assert set(STATEMENT_KEYWORDS) <= set(re.search(r"\(([^)]*)\)", statements)[1].split("|"))
    for pattern in (p["match"] for group in grammar["repository"].values() for p in group.get("patterns", [group])
                    if "match" in p):
        re.compile(pattern)  # also valid Python regexes (the grammar uses no Oniguruma-only syntax)


def test_the_vscode_extension_starts_pedsl_lsp_for_pe_files():
    manifest = json.loads((VSCODE / "package.json").read_text())
    [language] = manifest["contributes"]["languages"]
    assert language["extensions"] == [".pe"] and (VSCODE / language["configuration"]).is_file()
    [grammar] = manifest["contributes"]["grammars"]
    assert (VSCODE / grammar["path"]).is_file() and grammar["language"] == language["id"]
    assert "vscode-languageclient" in manifest["dependencies"]
    client = (VSCODE / manifest["main"]).read_text()
    assert '"lsp"' in client and 'language: "pedsl"' in client
    config = json.loads((VSCODE / "language-configuration.json").read_text())
    assert config["comments"]["lineComment"] == "#"


@pytest.mark.parametrize("doc", ["README.md", "docs/language.md", "docs/tutorial.md"])
def test_the_docs_pe_blocks_lex_cleanly(doc):
    blocks = re.findall(r"```pe\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        assert [v for t, v in PeLexer().get_tokens(block) if t in Error] == []
