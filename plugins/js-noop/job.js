// JsNoopJob: does nothing; what a JavaScript job costs the runner by itself.
import { job } from 'wasmjobs-guest';

export const perform = job(async () => {});
