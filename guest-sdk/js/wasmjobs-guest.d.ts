// Types of the wasmjobs guest SDK for JavaScript (wasmjobs-guest.js).

/** What a job knows about itself. */
export interface JobInfo {
  /** Sidekiq's job id. */
  jid: string;
  /** The job's class (for an ActiveJob job, its own class, not the wrapper). */
  className: string;
  queue: string;
  /** The job's args, as the JSON text enqueued (decoded, for ActiveJob). */
  args: string;
  /** Retries before this run (0 on the first run). */
  retryCount: number;
  /** When the job was enqueued, in milliseconds since the epoch (0 if unknown). */
  enqueuedAtMs: bigint;
}

/** Base of the errors that choose a job's outcome. */
export class JobFailure extends Error {}
/** A transient failure: retry the job following its retry policy. */
export class Retry extends JobFailure {}
/** The job cannot succeed and nobody needs to see it: drop it. */
export class Discard extends JobFailure {}
/** The job cannot succeed: move it to the dead set for a person to look at. */
export class Dead extends JobFailure {}

/** The type names `job(fn, { args })` checks, `?` allowing null or a missing arg. */
export type ArgType =
  | 'string' | 'number' | 'integer' | 'boolean' | 'array' | 'object' | 'null' | 'any'
  | 'string?' | 'number?' | 'integer?' | 'boolean?' | 'array?' | 'object?' | 'null?' | 'any?';

/** The component's `perform` export. */
export type Perform = (job: unknown) => Promise<void>;

/**
 * Wraps `fn(info, ...args)` as the component's `perform` export:
 * `export const perform = job(async (info, name) => { ... }, { args: ['string'] })`.
 */
export function job<A extends unknown[]>(
  fn: (info: JobInfo, ...args: A) => void | Promise<void>,
  options?: { args?: ArgType[] },
): Perform;

type LogFn = (message: unknown) => void;
/** Log lines in the host's tracing output, tagged with the job's jid and class. */
export const log: { trace: LogFn; debug: LogFn; info: LogFn; warn: LogFn; error: LogFn };

/** A Rails ActiveJob job's fields besides its class and arguments. */
export interface ActiveJobContext {
  jobId: string;
  jobClass: string;
  executions: number;
  priority?: bigint;
  locale?: string;
  timezone?: string;
  enqueuedAt?: string;
  scheduledAt?: string;
}
/** Jobs a Rails app enqueued through ActiveJob (null for other jobs). */
export const activejob: {
  context(): ActiveJobContext | null;
  /** The ActiveJob hash exactly as Ruby wrote it (JSON text). */
  raw(): string | null;
};

/** A request that got no response: a denied host, a refused connection, a timeout, a bad URL. */
export class HttpError extends Error {}
export interface HttpOptions {
  headers?: Record<string, string>;
  /** A string or bytes as they are; anything else as JSON. */
  body?: unknown;
}
export interface HttpResponse {
  status: number;
  ok: boolean;
  headers: Headers;
  body: Uint8Array;
  readonly text: string;
  json(): unknown;
}
/** HTTP over wasi:http, to the hosts the manifest's [http] allow list names. */
export const http: {
  get(url: string, options?: HttpOptions): Promise<HttpResponse>;
  post(url: string, body?: unknown, options?: HttpOptions): Promise<HttpResponse>;
  request(method: string, url: string, options?: HttpOptions): Promise<HttpResponse>;
};

/** A failed statement. */
export class SqlError extends Error {
  kind: 'not-granted' | 'unknown-database' | 'query' | 'connection' | 'limit' | 'timeout';
}
export type SqlParam = null | undefined | boolean | number | bigint | string | Uint8Array;
export type SqlValue = null | boolean | number | bigint | string | Uint8Array;
/** SQL on the databases the manifest grants; parameters are bound, never spliced. */
export const sql: {
  query(db: string, statement: string, ...params: SqlParam[]): { columns: string[]; rows: SqlValue[][] };
  execute(db: string, statement: string, ...params: SqlParam[]): number;
};
