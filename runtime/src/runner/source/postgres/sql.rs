//! Every statement the PostgreSQL job source runs, in one place (as
//! `scripts.rs` holds every Lua script of the Redis sources). Each is one
//! round trip; the arrays (`unnest`) carry a whole batch.

/// Claims up to `$2` due jobs from the queues `$1`, in that order, for the
/// owner `$3` with a lease of `$4` seconds. `SKIP LOCKED` lets any number
/// of processes claim at once without waiting on each other. Returns each
/// job's row, claim, queue, payload and its size in bytes; the payload is
/// `NULL` when it is larger than `$5` bytes (`--max-payload`; 0: no
/// limit), so an oversized one never leaves PostgreSQL
/// ([`BURY_OVERSIZED`]).
pub(super) const CLAIM: &str = "
WITH picked AS (
    SELECT j.id FROM unnest($1::text[]) WITH ORDINALITY AS q(name, ord)
    CROSS JOIN LATERAL (
        SELECT id, run_at FROM wasmjobs.jobs
        WHERE queue = q.name AND owner IS NULL AND run_at <= now()
        ORDER BY run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) j
    ORDER BY q.ord, j.run_at, j.id
    LIMIT $2
),
claimed AS (
    UPDATE wasmjobs.jobs AS j
    SET owner = $3, lease_until = now() + make_interval(secs => $4), claims = j.claims + 1
    FROM picked WHERE j.id = picked.id
    RETURNING j.id, j.claims, j.queue, j.payload::text AS body
)
SELECT id, claims, queue,
    CASE WHEN $5::bigint > 0 AND octet_length(body) > $5::bigint THEN NULL ELSE body END,
    octet_length(body)
FROM claimed";

/// Ended jobs `($1 id, $2 claim)` of owner `$3` that succeeded (or can
/// never run): gone. The rows are found by `id = ANY` (an index scan
/// whatever the batch's size: a join with `unnest` is planned as a scan of
/// the whole table once the batch is large), the claims checked on them.
pub(super) const ACK: &str = "
DELETE FROM wasmjobs.jobs AS j
WHERE j.id = ANY($1::bigint[]) AND j.owner = $3
  AND (j.id, j.claims) IN (SELECT * FROM unnest($1::bigint[], $2::int[]))";

/// Jobs handed back unstarted or stopped at shutdown: claimable again, in
/// their old place (their `run_at` is unchanged).
pub(super) const RELEASE: &str = "
UPDATE wasmjobs.jobs AS j SET owner = NULL, lease_until = NULL
FROM unnest($1::bigint[], $2::int[]) AS u(id, claims)
WHERE j.id = u.id AND j.claims = u.claims AND j.owner = $3";

/// Retries and reschedules: the new payload, due at `$4` (Unix seconds).
pub(super) const LATER: &str = "
UPDATE wasmjobs.jobs AS j
SET owner = NULL, lease_until = NULL, run_at = to_timestamp(u.at), payload = u.payload::jsonb
FROM unnest($1::bigint[], $2::int[], $4::float8[], $5::text[]) AS u(id, claims, at, payload)
WHERE j.id = u.id AND j.claims = u.claims AND j.owner = $3";

/// Dead and cancelled jobs: out of `jobs`, into `dead` with the payload
/// the runner wrote (`$4` kind, `$5` payload).
pub(super) const BURY: &str = "
WITH gone AS (
    DELETE FROM wasmjobs.jobs AS j
    USING unnest($1::bigint[], $2::int[], $4::text[], $5::text[]) AS u(id, claims, kind, payload)
    WHERE j.id = u.id AND j.claims = u.claims AND j.owner = $3
    RETURNING j.queue, u.kind, u.payload
)
INSERT INTO wasmjobs.dead (kind, queue, payload)
SELECT kind, queue, payload::jsonb FROM gone";

/// The dead table's caps for kind `$1`: nothing older than `$2` seconds,
/// at most `$3` entries (the newest).
pub(super) const TRIM: &str = "
WITH old AS (
    DELETE FROM wasmjobs.dead WHERE kind = $1 AND died_at < now() - make_interval(secs => $2)
)
DELETE FROM wasmjobs.dead WHERE id IN (
    SELECT id FROM wasmjobs.dead WHERE kind = $1 ORDER BY died_at DESC, id DESC OFFSET $3
)";

/// Claimed jobs `($1 id, $2 claim)` of owner `$3` whose payloads are
/// larger than `--max-payload` (`$5` bytes each): dead at once, kept whole
/// and never read by the runner, with the reason `$4` (as on Redis:
/// `PayloadTooLarge`, the size in `payload_bytes`). A payload that is not
/// a JSON object is kept under `payload`.
pub(super) const BURY_OVERSIZED: &str = "
WITH gone AS (
    DELETE FROM wasmjobs.jobs AS j
    USING unnest($1::bigint[], $2::int[], $4::text[], $5::bigint[]) AS u(id, claims, why, size)
    WHERE j.id = u.id AND j.claims = u.claims AND j.owner = $3
    RETURNING j.queue, j.payload, u.why, u.size
)
INSERT INTO wasmjobs.dead (kind, queue, payload)
SELECT 'dead', queue, CASE jsonb_typeof(payload)
        WHEN 'object' THEN payload
        ELSE jsonb_build_object('class', 'wasmjobs::PayloadTooLarge', 'args', '[]'::jsonb, 'payload', payload)
    END || jsonb_build_object(
    'error_class', 'wasmjobs::PayloadTooLarge',
    'error_message', why,
    'failed_at', extract(epoch FROM now()),
    'payload_bytes', size)
FROM gone";

/// Renews every lease owner `$1` holds, to `$2` seconds from now.
pub(super) const RENEW: &str = "
UPDATE wasmjobs.jobs SET lease_until = now() + make_interval(secs => $2)
WHERE owner = $1";

/// Takes back the jobs whose lease ran out (their process died or lost
/// PostgreSQL for longer than a lease): claimable again, or — once taken
/// back more than `$1` times — dead as a poison pill. Returns (requeued,
/// buried).
pub(super) const SWEEP: &str = "
WITH expired AS (
    SELECT id, recoveries FROM wasmjobs.jobs
    WHERE owner IS NOT NULL AND lease_until < now()
    FOR UPDATE SKIP LOCKED
),
poison AS (
    DELETE FROM wasmjobs.jobs AS j USING expired AS e
    WHERE j.id = e.id AND e.recoveries + 1 > $1
    RETURNING j.queue, j.payload, e.recoveries + 1 AS times
),
buried AS (
    INSERT INTO wasmjobs.dead (kind, queue, payload)
    SELECT 'dead', queue, payload || jsonb_build_object(
        'error_class', 'wasmjobs::PoisonPill',
        'error_message', format('the job was in progress in %s processes that died; treated as a poison pill', times),
        'failed_at', extract(epoch FROM now()))
    FROM poison
    RETURNING 1
),
back AS (
    UPDATE wasmjobs.jobs AS j SET owner = NULL, lease_until = NULL, recoveries = e.recoveries + 1
    FROM expired AS e
    WHERE j.id = e.id AND e.recoveries + 1 <= $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM buried)";

/// At shutdown: everything owner `$1` still holds, claimable again.
pub(super) const RELEASE_ALL: &str = "
UPDATE wasmjobs.jobs SET owner = NULL, lease_until = NULL WHERE owner = $1";

/// After a lost reply: what owner `$1` holds that the runner does not know
/// (`$2`, the rows it runs), claimable again.
pub(super) const RELEASE_UNKNOWN: &str = "
UPDATE wasmjobs.jobs SET owner = NULL, lease_until = NULL
WHERE owner = $1 AND NOT (id = ANY($2::bigint[]))";

/// Whether a due job waits in the queues `$1` (1 or 0: counting them all
/// would read the whole queue).
pub(super) const WAITING: &str = "
SELECT count(*) FROM (
    SELECT 1 FROM wasmjobs.jobs WHERE queue = ANY($1::text[]) AND owner IS NULL AND run_at <= now() LIMIT 1
) AS any_due";

/// Seconds until the next job of the queues `$1` falls due (retries,
/// scheduled jobs), if any is waiting.
pub(super) const NEXT_DUE: &str = "
SELECT extract(epoch FROM min(run_at) - now())::float8 FROM wasmjobs.jobs
WHERE queue = ANY($1::text[]) AND owner IS NULL";

/// Jobs waiting for a retry only because no plugin served their class
/// (`error_class` `wasmjobs::NoPlugin`): their rows and payloads, up to
/// `$1`, for the runner to pick those of the classes a reload brought.
pub(super) const UNSERVED: &str = "
SELECT id, payload::text FROM wasmjobs.jobs
WHERE owner IS NULL AND run_at > now() AND payload ->> 'error_class' = 'wasmjobs::NoPlugin'
ORDER BY run_at, id
LIMIT $1";

/// Makes the jobs `$1` due now, if they still wait for a plugin's retry.
/// Naming `owner` in `SET` fires the `jobs_due` trigger: idle runners are
/// woken at commit.
pub(super) const RELEASE_UNSERVED: &str = "
UPDATE wasmjobs.jobs SET owner = NULL, run_at = now()
WHERE id = ANY($1::bigint[]) AND owner IS NULL AND run_at > now()
  AND payload ->> 'error_class' = 'wasmjobs::NoPlugin'";
