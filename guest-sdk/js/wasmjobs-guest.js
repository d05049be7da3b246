// wasmjobs guest SDK for JavaScript: a job is one async function.
//
//   // job.js, built with componentize-js (see guest-sdk/js/README.md)
//   import { job, log, http, Retry } from 'wasmjobs-guest';
//
//   export const perform = job(async (info, url) => {
//     const response = await http.get(url);
//     log.info(`GET ${url}: ${response.status}`);
//     if (!response.ok) throw new Retry(`HTTP ${response.status}`);
//   });
//
// - Arguments: the job's JSON args array is decoded and spread into the
//   function after `info` (jid, className, queue, args, retryCount,
//   enqueuedAtMs). Args that are not a JSON array fail the job as dead;
//   so do args that do not fit the types declared with
//   `job(fn, { args: ['string', 'integer?'] })` (string, number, integer,
//   boolean, array, object, null, any; `?` allows null or a missing arg),
//   where an undeclared arg would let the job fail later, as a retry.
// - Outcome: returning (or resolving) succeeds; throwing Retry, Discard or
//   Dead says what the host should do; any other error is a retry whose
//   message is `Name: message` (its stack is logged at error level).
// - Capabilities: `log`, `http` (fetch over wasi:http; hosts allowed by the
//   manifest's [http] allow list), `sql` (databases the manifest grants) and
//   `activejob` (a Rails ActiveJob job's context: its arguments arrive
//   decoded as plain JSON; `activejob.context()` gives `jobId`,
//   `executions`, `priority`, `locale`, `timezone`, `enqueuedAt`,
//   `scheduledAt`, `activejob.raw()` the hash as Ruby wrote it).
import { log as hostLog } from 'wasmjobs:job/log@0.1.0';
import { query as hostQuery, execute as hostExecute } from 'wasmjobs:job/sql@0.1.0';
import { current as hostActiveJob, raw as hostActiveJobRaw } from 'wasmjobs:job/activejob@0.1.0';

/** Base of the errors that choose a job's outcome. */
export class JobFailure extends Error {}
/** A transient failure: retry the job following its retry policy. */
export class Retry extends JobFailure {}
/** The job cannot succeed and nobody needs to see it: drop it. */
export class Discard extends JobFailure {}
/** The job cannot succeed: move it to the dead set for a person to look at. */
export class Dead extends JobFailure {}

// How much of the args text an "invalid args" message quotes.
const ARGS_IN_MESSAGE = 200;

/**
 * Jobs a Rails app enqueued through ActiveJob. `context()` is the job's
 * ActiveJob fields (`jobId`, `jobClass`, `executions`, `priority`,
 * `locale`, `timezone`, `enqueuedAt`, `scheduledAt`; absent ones
 * `undefined`), or null for a job not enqueued through ActiveJob; `raw()`
 * the ActiveJob hash exactly as Ruby wrote it (JSON text), or null.
 */
export const activejob = {
  context() {
    return hostActiveJob() ?? null;
  },
  raw() {
    return hostActiveJobRaw() ?? null;
  },
};

const levels = ['trace', 'debug', 'info', 'warn', 'error'];
/** Log lines in the host's tracing output, tagged with the job's jid and class. */
export const log = Object.fromEntries(levels.map((level) => [level, (message) => hostLog(level, String(message))]));

const ARG_TYPES = {
  string: (v) => typeof v === 'string',
  number: (v) => typeof v === 'number',
  integer: (v) => Number.isInteger(v),
  boolean: (v) => typeof v === 'boolean',
  array: (v) => Array.isArray(v),
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
  null: (v) => v === null,
  any: () => true,
};

function jsonType(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (Number.isInteger(value)) return 'an integer';
  return { string: 'a string', number: 'a number', boolean: 'a boolean', object: 'an object' }[typeof value] ?? typeof value;
}

/** Checks the declared arg types up front (a typo in one is an error when the plugin is built). */
function argsChecker(declared) {
  if (declared === undefined) return () => null;
  if (!Array.isArray(declared)) throw new TypeError('job(fn, { args }): args must be an array of type names');
  const params = declared.map((spec) => {
    const optional = spec.endsWith('?');
    const name = optional ? spec.slice(0, -1) : spec;
    if (!(name in ARG_TYPES)) throw new TypeError(`job(fn, { args }): unknown type ${JSON.stringify(spec)} (${Object.keys(ARG_TYPES).join(', ')})`);
    return { spec, optional, fits: ARG_TYPES[name] };
  });
  const required = params.filter((p) => !p.optional).length;
  return (args) => {
    if (args.length > params.length || args.length < required) {
      const wanted = required === params.length ? `${required}` : `${required} to ${params.length}`;
      return `takes ${wanted} args (${declared.join(', ')}), got ${args.length}`;
    }
    for (const [i, value] of args.entries()) {
      const { spec, optional, fits } = params[i];
      if (!(fits(value) || (optional && value === null))) {
        return `arg ${i + 1} must be ${spec}, got ${jsonType(value)} ${JSON.stringify(value).slice(0, 40)}`;
      }
    }
    return null;
  };
}

/**
 * Wraps `fn(info, ...args)` as the component's `perform` export:
 * `export const perform = job(async (info, ...args) => { ... })`, or
 * `job(fn, { args: ['string'] })` to send args of other types to the dead set.
 */
export function job(fn, { args: declared } = {}) {
  const mismatch = argsChecker(declared);
  return async function perform(wit) {
    const info = {
      jid: wit.jid,
      className: wit.class,
      queue: wit.queue,
      args: wit.args,
      retryCount: wit.retryCount,
      enqueuedAtMs: wit.enqueuedAtMs,
    };
    try {
      let args;
      try {
        args = JSON.parse(info.args);
      } catch (error) {
        throw new Dead(`invalid args for ${info.className} ${info.args.slice(0, ARGS_IN_MESSAGE)}: not JSON: ${error.message}`);
      }
      if (!Array.isArray(args)) {
        throw new Dead(`invalid args for ${info.className} ${info.args.slice(0, ARGS_IN_MESSAGE)}: expected a JSON array`);
      }
      const wrong = mismatch(args);
      if (wrong !== null) throw new Dead(`invalid args for ${info.className} ${info.args.slice(0, ARGS_IN_MESSAGE)}: ${wrong}`);
      await fn(info, ...args);
    } catch (error) {
      if (error instanceof Retry) throw { tag: 'retry', val: error.message };
      if (error instanceof Discard) throw { tag: 'discard', val: error.message };
      if (error instanceof Dead) throw { tag: 'dead', val: error.message };
      const name = error?.name ?? typeof error;
      const message = error?.message ?? String(error);
      if (error?.stack) log.error(`${name}: ${message}\n${error.stack}`);
      throw { tag: 'retry', val: `${name}: ${message}` };
    }
  };
}

/** A request that got no response: a denied host, a refused connection, a timeout, a bad URL. */
export class HttpError extends Error {
  constructor(message) {
    super(message);
    this.name = 'HttpError';
  }
}

async function request(method, url, { body, headers } = {}) {
  const init = { method, headers: { ...(headers ?? {}) } };
  if (body !== undefined && body !== null) {
    if (typeof body === 'string' || body instanceof Uint8Array || body instanceof ArrayBuffer) {
      init.body = body;
    } else {
      init.body = JSON.stringify(body);
      if (!Object.keys(init.headers).some((name) => name.toLowerCase() === 'content-type')) {
        init.headers['content-type'] = 'application/json';
      }
    }
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    throw new HttpError(`${method} ${url}: ${error.message} (a host not in the plugin's [http] allow list is refused too)`);
  }
  const bytes = new Uint8Array(await response.arrayBuffer());
  return {
    status: response.status,
    ok: response.ok,
    headers: response.headers,
    body: bytes,
    get text() {
      return new TextDecoder().decode(bytes);
    },
    json() {
      return JSON.parse(new TextDecoder().decode(bytes));
    },
  };
}

/** HTTP over wasi:http: each call resolves to { status, ok, headers, body, text, json() }. */
export const http = {
  get: (url, options) => request('GET', url, options),
  post: (url, body, options) => request('POST', url, { ...options, body }),
  request,
};

/** A failed statement; `kind` is not-granted, unknown-database, query, connection, limit or timeout. */
export class SqlError extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.name = 'SqlError';
    this.kind = kind;
  }
}

function toValue(value) {
  if (value === null || value === undefined) return { tag: 'null' };
  if (typeof value === 'boolean') return { tag: 'boolean', val: value };
  if (typeof value === 'bigint') return { tag: 'int', val: value };
  if (typeof value === 'number') return Number.isInteger(value) ? { tag: 'int', val: BigInt(value) } : { tag: 'float', val: value };
  if (typeof value === 'string') return { tag: 'text', val: value };
  if (value instanceof Uint8Array) return { tag: 'blob', val: value };
  throw new TypeError(`cannot bind a ${typeof value} as an SQL parameter (use null, boolean, number, bigint, string, Uint8Array)`);
}

function fromValue(value) {
  switch (value.tag) {
    case 'null':
      return null;
    case 'int':
      // Integers that fit a double come back as numbers, others as BigInt.
      return Number.isSafeInteger(Number(value.val)) ? Number(value.val) : value.val;
    default:
      return value.val;
  }
}

function sqlCall(call) {
  try {
    return call();
  } catch (error) {
    const payload = error?.payload ?? error;
    if (payload && typeof payload.tag === 'string') throw new SqlError(payload.tag, payload.val);
    throw error;
  }
}

/** SQL on the runner's databases; parameters are bound, never spliced. */
export const sql = {
  /** Runs a statement that returns rows: { columns, rows } of JS values. */
  query(db, statement, ...params) {
    const result = sqlCall(() => hostQuery(db, statement, params.map(toValue)));
    return { columns: result.columns, rows: result.rows.map((row) => row.map(fromValue)) };
  },
  /** Runs a statement for its effect; returns the rows affected (a number). */
  execute(db, statement, ...params) {
    return Number(sqlCall(() => hostExecute(db, statement, params.map(toValue))));
  },
};
