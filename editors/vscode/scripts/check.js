// Checks the extension's static files without VS Code: every JSON file parses, package.json
// points at files that exist, and every regular expression of the grammar compiles.
// Run: node scripts/check.js (from editors/vscode). Exits non-zero on the first problem.

'use strict';

const fs = require('fs');
const path = require('path');

const root = path.join(__dirname, '..');
const read = (f) => JSON.parse(fs.readFileSync(path.join(root, f), 'utf8'));
let problems = 0;
const fail = (msg) => {
  console.error(`error: ${msg}`);
  problems += 1;
};

const pkg = read('package.json');
read('language-configuration.json');
const lang = pkg.contributes.languages.find((l) => l.id === 'mgn');
if (!lang || !lang.extensions.includes('.mgn')) fail('package.json: no language `mgn` for .mgn files');
if (!pkg.activationEvents.includes('onLanguage:mgn')) fail('package.json: not activated on the mgn language');
for (const f of [pkg.main, lang.configuration, ...pkg.contributes.grammars.map((g) => g.path)]) {
  if (!fs.existsSync(path.join(root, f))) fail(`package.json names ${f}, which does not exist`);
}
const grammar = read(pkg.contributes.grammars[0].path);
if (grammar.scopeName !== pkg.contributes.grammars[0].scopeName) fail('grammar scopeName differs from package.json');

let regexes = 0;
(function walk(node, where) {
  if (Array.isArray(node)) return node.forEach((n, i) => walk(n, `${where}[${i}]`));
  if (node && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (['match', 'begin', 'end'].includes(k) && typeof v === 'string') {
        regexes += 1;
        try {
          new RegExp(v);
        } catch (e) {
          fail(`${where}.${k}: ${e.message}`);
        }
      } else {
        walk(v, `${where}.${k}`);
      }
    }
  }
})(grammar, 'grammar');

// Scopes the README and themes rely on are there.
const samples = [
  ['layer Linear(in_features: dim) {', 'entity.name.type.class.mgn'],
  ['    // a comment', 'comment.line.double-slash.mgn'],
  ['    weight = param f32[out, in] init zeros', 'storage.modifier.mgn'],
];
const all = JSON.stringify(grammar);
for (const [, scope] of samples) {
  if (!all.includes(scope)) fail(`grammar has no scope ${scope}`);
}

if (problems) process.exit(1);
console.log(`ok: package.json, language-configuration.json and the grammar (${regexes} regexes) check`);
