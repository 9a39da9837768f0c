"""A Pygments lexer for `.pe` files, registered under the ``pygments.lexers`` entry point as ``pe``.

``pygmentize -l pe schemes/rope.pe``, Sphinx and MkDocs (```` ```pe ```` blocks) highlight schemes
with it once pedsl is installed with its ``lsp`` extra (which brings Pygments). Builtin and fixed
names come from the language's registries (:mod:`pedsl.lang.builtins`, :mod:`pedsl.lang.statements`),
so a new builtin or statement is highlighted without touching this file.
"""

from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Whitespace, string_to_tokentype

from pedsl.lang.builtins import CONSTANTS, FUNCTIONS
from pedsl.lang.statements import HIGHLIGHT, RECORDS, highlighted

CHOICES = tuple(w for r in RECORDS for w in r.choices)  # the fixed words a statement takes (a layout's)

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


class PeLexer(RegexLexer):
    """The `.pe` language of pedsl: declarative positional-encoding schemes."""

    name = "pedsl"
    aliases = ["pe", "pedsl"]
    filenames = ["*.pe"]
    mimetypes = ["text/x-pedsl"]
    url = "https://github.com/pedsl/pedsl"

    tokens = {
        "root": [
            (r"\s+", Whitespace),
            (r"#[^\n]*", Comment.Single),
            (r'"(?:[^"\\\n]|\\.)*"', String.Double),
            (rf"\b(scheme)(\s+)({_NAME})", bygroups(Keyword.Declaration, Whitespace, Name.Class)),
            (rf"\b(extends)(\s+)({_NAME})", bygroups(Keyword, Whitespace, Name.Class)),
            (rf"\b(param|let)(\s+)({_NAME})", bygroups(Keyword.Declaration, Whitespace, Name.Variable)),
            (rf"\b(position|distance)(\.)({_NAME})", bygroups(Name.Builtin.Pseudo, Punctuation, Name.Attribute)),
            # a statement keyword is never called: `normalize(` is the builtin of that name
            *((words(highlighted(cls), suffix=r"\b(?!\s*\()"), string_to_tokentype(token))
              for cls, (token, _) in HIGHLIGHT.items()),
            (words(("int", "float", "bool", "str"), suffix=r"\b"), Keyword.Type),
            (words(("true", "false", *CHOICES), suffix=r"\b"), Keyword.Constant),
            (words(tuple(FUNCTIONS), suffix=r"\b(?=\s*\()"), Name.Builtin),
            (words(tuple(CONSTANTS), suffix=r"\b"), Name.Builtin.Pseudo),
            (r"(?:\d+\.\d*|\.\d+|\d+)[eE][-+]?\d+", Number.Float),
            (r"\d+\.\d*|\.\d+", Number.Float),
            (r"\d+", Number.Integer),
            (r"\*\*|>=|<=|!=|[-+*/<>=]", Operator),
            (r"[(){}\[\],;:]", Punctuation),
            (_NAME, Name),
        ],
    }
