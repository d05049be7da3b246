// Builds one JavaScript plugin into a component with componentize-js.
//
//   node guest-sdk/js/build.mjs PLUGIN_DIR OUT.wasm WIT_DIR
//
// PLUGIN_DIR holds job.js, which imports the SDK by its package name,
// 'wasmjobs-guest' (or, as plugins written before it had one did, as
// './wasmjobs-guest.js'). The script stages the plugin's files, the SDK
// and the WIT package in a temporary directory (componentize-js reads
// paths relative to it and resolves no package names), points every
// import of 'wasmjobs-guest' in the staged modules at the staged SDK, and
// writes the component to OUT.wasm. The `fetch-event` feature (an incoming-handler
// export) is off: a job plugin exports `perform`, and fetch() stays on.
import { componentize } from '@bytecodealliance/componentize-js';
import { init, parse } from 'es-module-lexer';
import { cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve, sep } from 'node:path';

const PACKAGE = 'wasmjobs-guest';

// Every .js/.mjs module under `dir` (not under node_modules or wit).
async function modules(dir) {
  const found = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== 'node_modules' && entry.name !== 'wit') found.push(...(await modules(path)));
    } else if (/\.m?js$/.test(entry.name)) {
      found.push(path);
    }
  }
  return found;
}

// Rewrites the imports of PACKAGE in `file` to the relative path of `sdk`.
async function pointAtSdk(file, sdk) {
  const source = await readFile(file, 'utf8');
  const [imports] = parse(source, file);
  let target = relative(dirname(file), sdk).split(sep).join('/');
  if (!target.startsWith('.')) target = `./${target}`;
  let out = '';
  let last = 0;
  for (const { n: name, s: start, e: end, d: dynamic } of imports) {
    if (name !== PACKAGE) continue;
    // A static import's span is the specifier's text; a dynamic one's
    // is the whole expression, quotes included.
    out += source.slice(last, start) + (dynamic > -1 ? JSON.stringify(target) : target);
    last = end;
  }
  if (last > 0) await writeFile(file, out + source.slice(last));
}

const [pluginDir, out, witDir] = process.argv.slice(2);
if (!pluginDir || !out || !witDir) {
  console.error('usage: node build.mjs PLUGIN_DIR OUT.wasm WIT_DIR');
  process.exit(2);
}
const sdk = new URL('./wasmjobs-guest.js', import.meta.url);
const stage = await mkdtemp(join(tmpdir(), 'wasmjobs-js-'));
const cwd = process.cwd();
try {
  await cp(resolve(pluginDir), stage, { recursive: true });
  await cp(sdk, join(stage, 'wasmjobs-guest.js'));
  await cp(resolve(witDir), join(stage, 'wit'), { recursive: true });
  await init;
  for (const file of await modules(stage)) {
    await pointAtSdk(file, join(stage, 'wasmjobs-guest.js'));
  }
  process.chdir(stage);
  const { component } = await componentize({
    sourcePath: 'job.js',
    witPath: 'wit',
    worldName: 'plugin',
    disableFeatures: ['fetch-event'],
  });
  process.chdir(cwd);
  await writeFile(resolve(out), component);
} finally {
  process.chdir(cwd);
  await rm(stage, { recursive: true, force: true });
}
