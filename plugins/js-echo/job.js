// JsEchoJob: logs its args (any JSON array), like the Rust EchoJob.
// `["fail", message]` throws an Error instead, to show what an exception
// becomes: a retry whose error_message is `Error: message`.
import { job, log } from 'wasmjobs-guest';

export const perform = job(async (info, ...args) => {
  if (args[0] === 'fail') throw new Error(String(args[1]));
  log.info(`${info.className} ${info.jid} (retry ${info.retryCount}): ${JSON.stringify(args)}`);
});
