// JsHttpGetJob: the HttpGetJob workload in JavaScript. Args: [url]. GETs the
// URL and fails (retry) on a non-2xx status.
import { job, http, log, Retry } from 'wasmjobs-guest';

export const perform = job(async (info, url) => {
  const response = await http.get(url);
  log.info(`GET ${url}: ${response.status}, ${response.body.length} bytes`);
  if (!response.ok) throw new Retry(`GET ${url}: HTTP ${response.status}`);
});
