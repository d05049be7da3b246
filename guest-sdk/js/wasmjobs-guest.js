// wasmjobs guest SDK for JavaScript: a job is one async function.
//
//   // job.js, built with componentize-js (see guest-sdk/js/README.md)
//   import { job, log, http, Retry } from './wasmjobs-guest.js';
//
//   export const perform = job(async (info, url) => {
//     const response = await http.get(url);
//     log.info(`GET ${url}: ${response.status}`);
//     if (!response.ok) throw new Retry(`HTTP ${response.status}`);
//   });
//
// - Arguments: the job's JSON args array is decoded and spread into the
//   function after `info` (jid, className, queue, args, retryCount,
//   enqueuedAtMs). Args that are not a JSON array fail the job as dead.
// - Outcome: returning (or resolving) succeeds; throwing Retry, Discard or
//   Dead says what the host should do; any other error is a retry whose
//   message is `Name: message` (its stack is logged at error level).
// - Capabilities: `log`, `http` (fetch over wasi:http; hosts allowed by the
//   manifest's [http] allow list) and `sql` (databases the manifest grants).
import { log as hostLog } from 'wasmjobs:job/log@0.1.0';
import { query as hostQuery, execute as hostExecute } from 'wasmjobs:job/sql@0.1.0';

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

const levels = ['trace', 'debug', 'info', 'warn', 'error'];
/** Log lines in the host's tracing output, tagged with the job's jid and class. */
export const log = Object.fromEntries(levels.map((level) => [level, (message) => hostLog(level, String(message))]));

/**
 * Wraps `fn(info, ...args)` as the component's `perform` export:
 * `export const perform = job(async (info, ...args) => { ... })`.
 */
export function job(fn) {
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
