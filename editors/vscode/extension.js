// The mgn extension: starts `mgnc lsp` (path from the `mgn.serverPath` setting) and connects
// VS Code to it over stdio. Everything else (diagnostics, hover, definitions, completion,
// symbols, semantic tokens, inlay hints, formatting) comes from the server.

'use strict';

const vscode = require('vscode');
const { LanguageClient } = require('vscode-languageclient/node');

/** @type {LanguageClient | undefined} */
let client;

function serverPath() {
  const configured = vscode.workspace.getConfiguration('mgn').get('serverPath');
  return typeof configured === 'string' && configured.trim() !== '' ? configured.trim() : 'mgnc';
}

async function start() {
  const command = serverPath();
  const serverOptions = {
    run: { command, args: ['lsp'] },
    debug: { command, args: ['lsp'] },
  };
  const clientOptions = {
    documentSelector: [
      { scheme: 'file', language: 'mgn' },
      { scheme: 'untitled', language: 'mgn' },
    ],
  };
  client = new LanguageClient('mgn', 'mgn language server', serverOptions, clientOptions);
  try {
    await client.start();
  } catch (err) {
    vscode.window.showErrorMessage(
      `mgn: cannot start \`${command} lsp\` (${err && err.message ? err.message : err}). ` +
        'Install mgnc or set "mgn.serverPath" to its full path.'
    );
  }
}

async function stop() {
  if (client) {
    const c = client;
    client = undefined;
    await c.stop();
  }
}

/** @param {vscode.ExtensionContext} context */
async function activate(context) {
  context.subscriptions.push(
    vscode.commands.registerCommand('mgn.restartServer', async () => {
      await stop();
      await start();
    }),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration('mgn.serverPath')) {
        await stop();
        await start();
      }
    })
  );
  await start();
}

function deactivate() {
  return stop();
}

module.exports = { activate, deactivate };
