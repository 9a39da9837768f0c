// The VS Code client of the pedsl language server: starts `pedsl lsp` (stdio) for .pe files.
// The server is the pedsl installed with its 'lsp' extra: pip install 'pedsl[lsp]'.
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("pedsl");
  const command = config.get("server.command", "pedsl");
  const args = [...config.get("server.args", []), "lsp"];
  // TransportKind.stdio adds `--stdio`, which `pedsl lsp` accepts.
  const serverOptions = { command, args, transport: TransportKind.stdio };
  const clientOptions = {
    documentSelector: [
      { scheme: "file", language: "pedsl" },
      { scheme: "untitled", language: "pedsl" },
    ],
  };
  client = new LanguageClient("pedsl", "pedsl language server", serverOptions, clientOptions);
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
