"""The `.pe` language server (``pedsl lsp``): diagnostics, completion, hover, go to definition,
document symbols, formatting and quick fixes over the Language Server Protocol.

Layers, each importing only the ones above it:

- :mod:`pedsl.lsp.text`: positions (offsets, lines, the client's UTF-16/8/32 columns);
- :mod:`pedsl.lsp.scan`: a token scan and outline of any text, half-typed or not (imports, schemes,
  params, lets, channel groups, where the cursor is);
- :mod:`pedsl.lsp.project`: the files a document imports and the schemes it can see (the language's
  import policy), and the checked analysis of a document (diagnostics, resolved schemes);
- :mod:`pedsl.lsp.features` (completion, signature help), :mod:`pedsl.lsp.describe` (hover),
  :mod:`pedsl.lsp.navigate` (definition, symbols), :mod:`pedsl.lsp.fixes` (code actions);
- :mod:`pedsl.lsp.server`: the pygls server that wires them to requests.

Only :mod:`pedsl.lsp.server` and the feature modules import pygls/lsprotocol (the ``lsp`` extra);
the command line imports this package only when ``pedsl lsp`` runs.
"""
