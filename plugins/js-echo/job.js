// JsEchoJob: logs its args (any JSON array), like the Rust EchoJob.
import { job, log } from './wasmjobs-guest.js';

export const perform = job(async (info, ...args) => {
  log.info(`${info.className} ${info.jid} (retry ${info.retryCount}): ${JSON.stringify(args)}`);
});
