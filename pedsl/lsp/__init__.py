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
- :mod:`pedsl.lsp.session`: the open documents, cached analyses and one method per request, each
  answering something on any text (what the tests drive in-process);
- :mod:`pedsl.lsp.transport`: the wire (frames read with bounded memory, messages checked before pygls
  dispatches them);
- :mod:`pedsl.lsp.server`: the pygls server that wires the session to the protocol over stdio.

The feature modules use lsprotocol's types, the server pygls (the ``lsp`` extra);
the command line imports this package only when ``pedsl lsp`` runs.
"""
