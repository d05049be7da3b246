// Builds one JavaScript plugin into a component with componentize-js.
//
//   node guest-sdk/js/build.mjs PLUGIN_DIR OUT.wasm WIT_DIR
//
// PLUGIN_DIR holds job.js, which imports the SDK as './wasmjobs-guest.js';
// the script stages job.js, the SDK and the WIT package in a temporary
// directory (componentize-js reads paths relative to it) and writes the
// component to OUT.wasm. The `fetch-event` feature (an incoming-handler
// export) is off: a job plugin exports `perform`, and fetch() stays on.
import { componentize } from '@bytecodealliance/componentize-js';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

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
